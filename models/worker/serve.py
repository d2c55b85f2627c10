"""The worker process's side (bpy-free): the shared runtime of this process runs the jobs the
client sends, one at a time, each as one models/batch/sequence.py BatchRun.

The main thread reads the connection (frames, cancel, asks, free) and, while a job runs, sends a
Heartbeat about every :data:`HEARTBEAT_EVERY_S` whatever the job does: the client ends a worker it
has not heard from for its deadline (a hung driver, a deadlock, SIGSTOP). A job runs on a thread
of its own here, with BatchRun's reader and inference threads: threads are fine in this process,
it is not Blender's. Every send goes through one lock. When the connection ends this process
removes its exchange folders (the host may have been killed and cannot).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from ...runtime import get_runtime, providers
from ...runtime.errors import LeanImageError
from ...runtime.measure import memory
from ...runtime.measure.timeline import thinned
from .. import families
from ..base import RunOptions
from ..batch.frame_lists import FrameRef
from ..batch.sequence import BatchRun
from . import protocol as p
from . import wire

SKIPPED = object()  # the client did not send this frame (claimed elsewhere, or unreadable there)
PROGRESS_EVERY_S = 0.1
HEARTBEAT_EVERY_S = 1.0
FAULTS_ENV = "LEAN_IMAGE_AI_WORKER_FAULTS"  # tests only: lets the "fault" message crash or stop this process


def measure() -> dict:
    """This process's memory now: what ending it gives back."""
    rss = memory.process_rss_bytes()
    vram = None
    if any((row := providers.row_of(h.providers)) is not None and row.vram_measurable
           for h in get_runtime().cached_sessions()):
        vram = memory.gpu_snapshot(0).get("process_used_bytes")
    return {"rss_bytes": rss, "vram_bytes": vram}


def failed(exc: BaseException, failures: list) -> p.Failed:
    """An error as its one line, its type's name and its traceback (the host's event log keeps it)."""
    text = str(exc) if isinstance(exc, LeanImageError) else f"{type(exc).__name__}: {exc}"
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return p.Failed(text, type(exc).__name__, trace, failures)


def hello(key: str) -> p.Hello:
    import numpy

    return p.Hello(p.VERSION, os.getpid(), sys.version.split()[0], numpy.__version__, key)


class Worker:
    def __init__(self, conn, exchange: wire.Exchange, *, key: str = ""):
        self.conn, self.exchange, self.key = conn, exchange, key
        self._send_lock = threading.Lock()
        self._failures_lock = threading.Lock()
        self._arrived: dict[int, object] = {}
        self._frames = threading.Condition()
        self._cancel = threading.Event()
        self._run: BatchRun | None = None
        self._work: threading.Thread | None = None  # the job or call running now
        self._job_name = ""
        self._failed_sent = 0
        self._last_progress = 0.0

    def send(self, message: p.Message) -> None:
        with self._send_lock:
            wire.send(self.conn, message, self.exchange)

    # -- the connection ----------------------------------------------------------------------
    def serve(self) -> None:
        try:
            self.send(hello(self.key))
            # the runtime's events (loads, runs, releases, warnings) go to the client as they happen:
            # the host's event log and panel tell what its worker did
            get_runtime().events.subscribe(lambda event: self.send(p.Event(json.loads(json.dumps(event, default=str)))))
            self._loop()
        except BaseException as exc:  # a bug of this side: the host's event log gets its traceback
            try:
                self.send(failed(exc, []))
            except (OSError, ValueError):
                pass
            raise
        finally:
            self._cancel.set()
            self.exchange.remove()  # the host may be gone (killed): nobody else would

    def _loop(self) -> None:
        beat = time.monotonic()
        while True:
            try:
                ready = self.conn.poll(HEARTBEAT_EVERY_S)
                if self._busy() and time.monotonic() - beat >= HEARTBEAT_EVERY_S:
                    beat = time.monotonic()
                    self.send(p.Heartbeat())
                if not ready:
                    continue
                message = wire.receive(self.conn, self.exchange, wait=True)  # not Blender's process: it may wait
            except (EOFError, OSError, p.ProtocolError):  # the client went away or is not ours: nothing to answer
                return
            if not self.handle(message):
                return

    def _busy(self) -> bool:
        return self._work is not None and self._work.is_alive()

    def handle(self, message: p.Message) -> bool:
        if isinstance(message, p.Job):
            self.start_job(message)
        elif isinstance(message, p.LeakCheck):
            self._cancel = threading.Event()
            self._start(self._leak_check, message, "lean_image_ai:leak")
        elif isinstance(message, p.Frame):
            self._arrive(message.number, message.pixels)
        elif isinstance(message, p.Skip):
            self._arrive(message.number, SKIPPED)
        elif isinstance(message, p.Cancel):
            self._cancel.set()
            if self._run is not None:
                self._run.cancel()
        elif isinstance(message, p.Ask):
            self._answer(message.what)
        elif isinstance(message, p.Free):
            self.send(p.Freed(measure()))
            self.exchange.remove()
            os._exit(0)  # the end of the process is what gives everything back; no teardown to wait for
        elif isinstance(message, p.Fault):
            self.fault(message.how)
        elif isinstance(message, p.Quit):
            return False
        return True

    def _answer(self, what: str) -> None:
        """Release now / Unload all on this process's runtime, or only its state."""
        runtime = get_runtime()
        freed = {"release": runtime.release_now, "unload": runtime.unload}.get(what, lambda: None)()
        self.send(p.Status(self.status()))
        if what != "state":
            self.send(p.Answer(freed))

    def _start(self, target, message, name: str) -> None:
        self._work = threading.Thread(target=target, args=(message,), name=name, daemon=True)
        self._work.start()

    def _arrive(self, number: int, value) -> None:
        with self._frames:
            self._arrived[number] = value
            self._frames.notify_all()

    def status(self, *, with_job: bool = False) -> dict:
        runtime = get_runtime()
        models = [h.model_name for h in runtime.cached_sessions()]
        ort = sys.modules.get("onnxruntime")  # which build this process runs: the doctor's and the tests' question
        status = {"pid": os.getpid(), "models": models, "job": self._job_name, **measure(),
                  "onnxruntime_file": getattr(ort, "__file__", None), "onnxruntime_version": getattr(ort, "__version__", None),
                  "python": sys.version.split()[0], "numpy": sys.modules["numpy"].__version__}
        if with_job:  # the job's memory timeline (thinned: the host only draws it) and figures
            status.update(timeline=thinned(runtime.last_timeline), job_memory=runtime.last_job_memory)
        return status

    @staticmethod
    def fault(how: str) -> None:
        """Test-only faults, honoured only where the test's environment allows them."""
        if os.environ.get(FAULTS_ENV) != "1":
            return
        if how == "segfault":
            import ctypes

            ctypes.string_at(0)
        elif how == "abort":
            os.abort()
        elif how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "stop":  # a hung process: no heartbeat, no answer (the client's deadline ends it)
            os.kill(os.getpid(), signal.SIGSTOP)
        elif how == "raise":  # a bug in the worker's own code: its traceback must reach the host
            raise RuntimeError("a fault injected by a test")

    # -- one job -------------------------------------------------------------------------------
    def start_job(self, message: p.Job) -> None:
        if message.family_module:
            self._register(message.family_module)
        job = p.run_from(message.run)
        with self._frames:
            self._arrived.clear()
        self._cancel = threading.Event()
        self._failed_sent = 0
        if message.settings:
            get_runtime().configure(**message.settings)
        options = RunOptions(device=job.device, progress=self._progress, cancel=self._cancel)
        refs = [FrameRef(number, Path(path)) for number, path in message.refs]
        self._run = BatchRun(
            refs, job.infer, self._read, self._write, options=options,
            stop_on_error=message.stop_on_error, depth=message.depth, claim=self._claim,
        )
        self._job_name = message.name
        self._start(self._run_job, self._run, "lean_image_ai:job")

    @staticmethod
    def _register(module_name: str) -> None:
        """A plug-in family the host registered: its module's FAMILY, registered here too."""
        import importlib

        top = p.PACKAGE if module_name.startswith("lean_image_ai.") else None
        module = importlib.import_module(module_name.replace("lean_image_ai", top, 1) if top else module_name)
        if module.FAMILY.id not in families.IDS:
            families.register(module.FAMILY)

    def _run_job(self, run: BatchRun) -> None:
        try:
            report = run.run()
        except BaseException as exc:  # the job could not run at all (the model, the device)
            self._job_name = ""
            # the status first: the host's after-job listeners read the job's memory from it
            self.send(p.Status(self.status(with_job=True)))
            self.send(failed(exc, self._new_failures()))
        else:
            self._job_name = ""
            self.send(p.Status(self.status(with_job=True)))
            self.send(p.Done(report.cancelled, self._new_failures()))

    def _leak_check(self, message: p.LeakCheck) -> None:
        """The leak check, here: it measures the process whose runtime runs the model."""
        import dataclasses

        from ...runtime.errors import OperationCancelled
        from ...runtime.measure.leak_check import leak_check
        from ...runtime.settings import MemoryBudgets
        from ..leak_request import repeatable_run

        cancel, runs = self._cancel, message.runs

        def after_run(index, _values):
            self.send(p.Progress(index / runs, f"run {index}/{runs}"))
            if cancel.is_set():
                raise OperationCancelled("The leak check was cancelled; nothing was changed.")

        try:
            get_runtime().configure(**message.settings)
            if cancel.is_set():
                raise OperationCancelled("The leak check was cancelled; nothing was changed.")
            request = repeatable_run(message.family, device=message.device, folder=Path(message.folder),
                                 budgets=MemoryBudgets(**message.budgets), cancel=cancel)
            result = leak_check(request, runs=runs, after_run=after_run)
        except BaseException as exc:  # noqa: BLE001 - the client raises it
            self.send(p.Status(self.status(with_job=True)))
            self.send(failed(exc, []))
        else:
            self.send(p.Status(self.status(with_job=True)))
            self.send(p.Answer(dataclasses.asdict(result)))

    def _new_failures(self) -> list:
        with self._failures_lock:  # the writer and the claiming thread both ask
            failed_frames = self._run.report.failed if self._run is not None else []
            new = failed_frames[self._failed_sent:]  # another thread may append meanwhile: count what was taken
            self._failed_sent += len(new)
            return [list(f) for f in new]

    def _claim(self, ref) -> bool:
        with self._frames:
            while ref.number not in self._arrived:
                if self._cancel.is_set():
                    return False
                # frames that failed here are told now: the client sends the next frame only when
                # one it sent is answered (every frame failing would otherwise wait on both sides)
                self._tell_failures()
                self._frames.wait(0.05)
            if self._arrived[ref.number] is SKIPPED:
                del self._arrived[ref.number]
                return False
            return True

    def _read(self, ref):
        with self._frames:
            return self._arrived.pop(ref.number)

    def _write(self, ref, result) -> None:
        self._tell_failures()  # first, and on their own: a result that cannot be sent loses none of them
        self.send(p.Result(ref.number, result))

    def _tell_failures(self) -> None:
        failures = self._new_failures()
        if failures:
            self.send(p.Failures(failures))

    def _progress(self, fraction: float, stage: str) -> None:
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_EVERY_S or fraction >= 1.0:
            self._last_progress = now
            self.send(p.Progress(fraction, stage))
