"""A batch whose inference runs in the model worker process (bpy-free), with the caller interface
of models/batch/sequence.py's BatchRun: ``pump(budget, read=...)``, ``report``, ``needs_model``,
``cancel()``, ``run()``. Any front-end (a single-image operator, Process Sequence, a shot's pass
in models/batch/shot_batch.py's TwoPassBatch, a headless script) swaps it in for a BatchRun.

Frames are read, claimed, written and released here, in the caller's process (Blender reads and
writes with its own image IO on its main thread, a frame's read and its file each over several
pumps where the frame IO gives them as steps); only ``job.infer`` runs in the worker, the whole
batch as one runtime operation there (models/worker/serve.py). Nothing here starts a thread or
waits on the worker: each pump reads what the worker has said so far.

Cancel: the client (models/worker/client.py, the one owner of the worker's life) tells the worker
and kills it if it has not confirmed within its grace time (one long tile, a native call that never
looks at the cancel); the next job starts a fresh one. A worker that ends on its own while it has
work (a crash, kill -9, the OOM killer), stops answering, or sends what cannot be received ends the
batch with one line in sentences; a frame is only ever written whole, here, so nothing is
half-written, and every frame claim held for a frame in the worker is released. The longest pump
is kept (:attr:`longest_pump_s`): Blender's main thread must never spend more than 0.1 s in one.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable

from ...runtime.errors import LeanImageError
from .. import families
from ..base import RunOptions
from ..batch.frame_lists import FrameRef
from ..batch.report import BatchReport
from ..model_run import ModelRun
from . import client as worker_client
from . import host_record
from . import protocol as p

# "1": the model runs in this process on BatchRun's threads, as before the worker (debugging, and
# tests that look inside the runtime of the process that runs the model). Only then does the host
# process make a Runtime (runtime/core.py) and load onnxruntime.
IN_PROCESS_ENV = "LEAN_IMAGE_AI_IN_PROCESS"


def in_process_runtime():
    """The runtime of jobs run in this process (:data:`IN_PROCESS_ENV`), None where models run
    in the worker (then this process never makes one)."""
    if os.environ.get(IN_PROCESS_ENV) != "1":
        return None
    from ...runtime import get_runtime

    return get_runtime()


class RemoteBatchRun:
    """A batch whose model runs in the worker process, pumped by the host (a PumpedBatch,
    models/batch/report.py): frames are read and written on the host's thread, inferred there."""

    def __init__(
        self,
        job: ModelRun,
        refs: list[FrameRef],
        read: Callable[[FrameRef], object],
        write: Callable[[FrameRef, object], list[str] | None],
        *,
        options: RunOptions,
        skip: Callable[[FrameRef], bool] = lambda ref: False,
        stop_on_error: bool = False,
        depth: int = 2,
        claim: Callable[[FrameRef], bool] = lambda ref: True,
        release: Callable[[FrameRef], None] = lambda ref: None,
        client: worker_client.WorkerClient | None = None,
        name: str = "",
        staged: Callable[[], object] | None = None,
        read_steps: Callable[[FrameRef], object] | None = None,
    ):
        self.report = BatchReport(total=len(refs))
        self._job, self._read, self._write = job, read, write
        # what a write left to be pumped (an object with pump(budget) -> bool), or None: written in the call
        self._staged = staged or (lambda: None)
        self._writing: tuple | None = None  # (ref, notes, result, steps) of the frame being written
        self._inbox: collections.deque = collections.deque()  # messages after a Result whose file is being written
        # a frame's read as steps (pump(budget) -> bool, .pixels, close()) pumped one a call, or None: ``read`` it
        self._read_steps = read_steps or (lambda ref: None)
        self._reading: tuple | None = None  # (ref, steps) of the frame being read
        self._claim, self._release = claim, release
        self._options, self._stop_on_error, self._depth = options, stop_on_error, max(1, depth)
        self._cancel = options.cancel if isinstance(options.cancel, threading.Event) else threading.Event()
        self._client = client
        self.name = name or job.family.action or job.family.title
        self._todo: collections.deque = collections.deque()
        for ref in refs:
            (self.report.skipped.append(ref.number) if skip(ref) else self._todo.append(ref))
        self._needs_model = bool(self._todo)
        self._sent: dict[int, FrameRef] = {}  # in the worker, not answered yet (insertion order)
        self._phase = "new"  # new -> running -> (cancelling) -> over
        self._cancel_sent_at = 0.0
        self._stopped = False  # a failed frame ended the batch (stop_on_error), not a cancel
        self._error: BaseException | None = None
        self._started = time.monotonic()
        self.spawned = False  # this batch started the worker (its first job pays the start)
        self.longest_pump_s = 0.0  # the longest time one pump kept its caller (Blender's main thread)
        self.longest_pump_cpu_s = 0.0
        self._local: BatchRun | None = None
        local_runtime = in_process_runtime()
        if local_runtime is not None:
            from ..batch.sequence import BatchRun  # its threads: only where the model runs here

            local_runtime.configure(**self.client.settings)
            self._local = BatchRun(refs, job.infer, read, self._written_whole(write), options=options, skip=skip,
                                   stop_on_error=stop_on_error, depth=depth, claim=claim, release=release)
            self.report = self._local.report

    def _written_whole(self, write):
        """``write`` with what it left to be pumped done in the call (the in-process batch has no pump of its own)."""
        def whole(ref, result):
            notes = write(ref, result)
            steps = self._staged()
            while steps is not None and not steps.pump(1e9):
                pass
            return notes

        return whole

    @property
    def needs_model(self) -> bool:
        return self._needs_model

    @property
    def client(self) -> worker_client.WorkerClient:
        if self._client is None:
            self._client = worker_client.shared()
        return self._client

    def cancel(self) -> None:
        self._cancel.set()
        if self._local is not None:
            self._local.cancel()

    def run(self) -> BatchReport:
        """A headless caller's loop (``blender --background`` scripts, the bench): pump until over."""
        while not self.pump(0.5):
            pass
        return self.report

    def pump(self, budget: float = 0.05, *, read: bool = True) -> bool:
        """Send frames, write the results the worker has sent, for about ``budget`` seconds;
        True once the batch is over (then :attr:`report` is final)."""
        began, cpu = time.monotonic(), time.thread_time()
        try:
            return self._pump(budget, read)
        finally:
            self.longest_pump_s = max(self.longest_pump_s, time.monotonic() - began)
            # the part this thread computed: the rest was sleeping or waiting for a CPU (a loaded machine)
            self.longest_pump_cpu_s = max(self.longest_pump_cpu_s, time.thread_time() - cpu)

    def _pump(self, budget: float, read: bool) -> bool:
        if self._local is not None:
            return self._pump_local(budget, read)
        if self._phase == "over":
            return True
        deadline = time.monotonic() + budget
        try:
            if self._phase == "new":
                if not self._todo or self._cancel.is_set():
                    self.report.cancelled = self._cancel.is_set()
                    return self._finish()
                self._start()
            while True:
                progressed = self._step(read, max(0.0, deadline - time.monotonic()))
                if self._phase == "over":
                    return self._finish()
                if progressed is _WROTE_BAND or time.monotonic() >= deadline:  # one band of a file a call
                    return False
                if not progressed:
                    time.sleep(min(0.002, max(0.0, deadline - time.monotonic())))
        except worker_client.WorkerEnded as exc:
            return self._ended(exc)
        except LeanImageError as exc:  # the client reset the worker (a receive failure, a folder gone...)
            self._error = exc
            return self._finish()

    def _pump_local(self, budget: float, read: bool) -> bool:
        if self._phase == "new":
            self._phase = "running"
            self._local.start()
        over = True  # a pump that raises ends the batch too
        try:
            over = self._local.pump(budget, read=read)
            return over
        finally:
            if over:  # what the Memory panel and the memory picture show, as a worker's job hands it
                runtime = self._options.get_runtime()
                host_record.job_figures(runtime.last_timeline, runtime.last_job_memory)

    # -- steps -------------------------------------------------------------------------------
    def _start(self) -> None:
        self.spawned = self.client.begin(self.name)
        family = self._job.family
        self._send(p.Job(
            run=p.run_values(self._job),
            refs=[(ref.number, str(ref.path)) for ref in self._todo],
            name=self.name,
            depth=self._depth,
            stop_on_error=self._stop_on_error,
            settings=self.client.job_settings(self._options),
            # a plug-in's family (families.register in the host) is registered there too; its
            # module must be importable there (the host's sys.path, under the host's Python)
            family_module="" if family.id in families.BUILT_IN else p.family_module(family),
        ))
        self._phase = "running"

    def _send(self, message: p.Message) -> None:
        self.client.send(message)

    def _step(self, read: bool, budget: float) -> bool | str:
        if self._cancel.is_set() and self._phase == "running":
            self._phase = "cancelling"
            self.client.cancel()
        if self._writing is not None:
            self._pump_write(budget)
            return _WROTE_BAND
        if self._reading is not None:
            self._pump_read(budget)
            return _WROTE_BAND
        # what a file's write held back is handled before the worker is looked at again: the worker
        # may have said its last word (the job's end) before a write that outlasted the heartbeat
        # deadline, and was taken for hung after it
        held = bool(self._inbox)
        messages = [] if held else self.client.messages()
        self._inbox.extend(messages)
        while self._inbox and self._writing is None:  # a file being written holds back what came after it
            self._handle(self._inbox.popleft())
        if read and self._phase == "running" and self._todo and len(self._sent) < self._depth and self._writing is None:
            # a read in steps ends the call: its decode, next, has a call to itself
            return _WROTE_BAND if self._feed_one() else True
        return held or bool(messages)

    def _feed_one(self) -> bool:
        """Send the next frame, or start its read in steps (True)."""
        ref = self._todo.popleft()
        try:
            claimed = self._claim(ref)
            steps = self._read_steps(ref) if claimed else None
            if steps is not None:  # read over the next pumps (:meth:`_pump_read`)
                self._reading = (ref, steps)
                return True
            pixels = self._read(ref) if claimed else None
        except Exception as exc:  # noqa: BLE001 - any unreadable frame is reported, never raised
            self._read_failed(ref, exc)
            return False
        if not claimed:
            self.report.skipped.append(ref.number)
            self._send(p.Skip(ref.number))
            return False
        self._sent[ref.number] = ref
        self._send(p.Frame(ref.number, pixels))
        return False

    def _pump_read(self, budget: float) -> None:
        """One step of the frame being read (its decode, its pixels taken, a band of its conversion),
        then sent; a cancel lets go of what it loaded."""
        ref, steps = self._reading
        if self._cancel.is_set():
            self._drop_read()
            return
        try:
            if not steps.pump(budget):
                return
        except Exception as exc:  # noqa: BLE001 - as in _feed_one
            self._drop_read()
            self._read_failed(ref, exc)
            return
        self._reading = None
        self._sent[ref.number] = ref
        self._send(p.Frame(ref.number, steps.pixels))

    def _drop_read(self) -> None:
        ref, steps = self._reading
        self._reading = None
        steps.close()
        self._release(ref)

    def _read_failed(self, ref: FrameRef, exc: BaseException) -> None:
        self._frame_failed(ref, exc)
        self._send(p.Skip(ref.number))
        if self._stop_on_error:
            for rest in self._todo:
                self._send(p.Skip(rest.number))
            self._todo.clear()

    def _handle(self, message: p.Message) -> None:
        if isinstance(message, p.Progress):
            self._options.report(message.fraction, message.stage)
            return
        self._failures(getattr(message, "failures", ()))
        if isinstance(message, p.Result):
            self._result(self._sent.pop(message.number), message.result)
        elif isinstance(message, p.Done):
            self.report.cancelled = (message.cancelled or self._cancel.is_set()) and not self._stopped
            self._phase = "over"
        elif isinstance(message, p.Failed):
            self._error, self._phase = p.error_of(message), "over"

    def _failures(self, failures) -> None:
        for number, text in failures:
            ref = self._sent.pop(number, None)
            if ref is not None:
                self._release(ref)
            self.report.failed.append((number, text))
            if self._stop_on_error:
                self._stopped = True
                self._todo.clear()

    def _result(self, ref: FrameRef, result) -> None:
        if self._cancel.is_set() and not self._stopped:
            self._release(ref)  # cancelled: nothing after the cancel is written, finished or not
            return
        try:
            notes = self._write(ref, result)
            steps = self._staged()
        except Exception as exc:  # noqa: BLE001 - reported per frame
            self._write_failed(ref, exc)
            return
        if steps is not None:  # its file is written over the next pumps (:meth:`_pump_write`)
            self._writing = (ref, notes, result, steps)
            return
        self.report.wrote(ref.number, notes, result)
        self._release(ref)

    def _pump_write(self, budget: float) -> None:
        ref, notes, result, steps = self._writing
        if self._cancel.is_set() and not self._stopped:  # as in _result: nothing is written after a cancel
            self._writing = None
            self._release(ref)
            return
        try:
            if not steps.pump(budget):
                return
        except Exception as exc:  # noqa: BLE001 - reported per frame
            self._writing = None
            self._write_failed(ref, exc)
            return
        self._writing = None
        self.report.wrote(ref.number, notes, result)
        self._release(ref)

    def _write_failed(self, ref: FrameRef, exc: BaseException) -> None:
        self._frame_failed(ref, exc)
        if self._stop_on_error:
            self.client.cancel()
            self._todo.clear()

    def _frame_failed(self, ref: FrameRef, exc: BaseException) -> None:
        self._release(ref)
        text = str(exc) if isinstance(exc, LeanImageError | OSError) else f"{type(exc).__name__}: {exc}"
        self.report.failed.append((ref.number, text))
        if self._stop_on_error:
            self._stopped = True

    # -- the end -------------------------------------------------------------------------------
    def _release_sent(self) -> None:
        sent, self._sent = list(self._sent.values()), {}
        for ref in sent:
            self._release(ref)

    def _finish(self) -> bool:
        self._phase = "over"
        while self._writing is not None:  # the worker ended meanwhile: the result it sent is still written
            self._pump_write(1e9)
        if self._reading is not None:  # never sent: what its read loaded goes
            self._drop_read()
        self._release_sent()
        self.report.seconds = time.monotonic() - self._started
        if self._client is not None:
            self.report.warnings.extend(self._client.end())  # a worker replaced at the job's start
        error, self._error = self._error, None
        if error is not None and not self.report.cancelled:
            raise error
        return True

    def _ended(self, exc: worker_client.WorkerEnded) -> bool:
        if self._phase == "cancelling" or exc.cancelled:  # ended while cancelling: the cancel is what happened
            self.report.cancelled = not self._stopped
            return self._finish()
        self._error = worker_client.WorkerEnded(self._ended_text(exc))
        return self._finish()

    def _ended_text(self, exc: worker_client.WorkerEnded) -> str:
        """The report after the worker ended, in sentences: which frame, how, what is kept, what never ran."""
        where = next(iter(self._sent.values()), None) if exc.connected else None
        text = str(exc)
        head = f"Frame {where.number}: t{text[1:]}" if where is not None else f"T{text[1:]}"
        head += f" while running {self.name}"
        on = f" on {where.path.name}" if where is not None and getattr(where, "path", None) else ""
        kept = len(self.report.written)
        never = len(self._todo) + len(self._sent) + (self._reading is not None) - (where is not None)
        parts = [f"{head}{on}.",
                 f"{_frames(kept)} written before it {'is' if kept == 1 else 'are'} kept." if kept else "Nothing was written.",
                 f"{_frames(never)} never ran." if never else "",
                 f"Its last words: {exc.last_words} (the whole of them is in events.jsonl)." if exc.last_words else "",
                 "Run it again."]
        return " ".join(part for part in parts if part)


_WROTE_BAND = "wrote a band"  # a step of a frame's file or of a frame's read: the call's share


def _frames(count: int) -> str:
    return f"{count} frame{'s' if count != 1 else ''}"
