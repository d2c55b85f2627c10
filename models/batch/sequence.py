"""The batch run over an image sequence (bpy-free); which frames it covers is models/batch/frame_lists.py.

A batch is ONE runtime operation (intermediate frames never shrink; the last run of the last frame
does). Inference runs on a worker thread over a :class:`FrameQueue` that the caller feeds, and the
caller writes each result as it comes out (:meth:`BatchRun.pump`): reading the next frame and
writing the previous one overlap with inference, at most ``depth`` frames are held on each side,
so memory stays flat whatever the length. Blender pumps from its main thread (bpy is not thread
safe); the command line from its own.
"""

from __future__ import annotations

import collections
import queue
import re
import threading
import time
from collections.abc import Callable

from ...runtime.errors import LeanImageError, OperationCancelled
from ...runtime.oom import out_of_memory_error
from ..base import RunOptions
from .frame_lists import FrameRef
from .report import BatchReport  # noqa: F401 - where the command line and farm find it too

_ADAPTER_FRAME = re.compile(r"^frame \d+/\d+(, )?")


def _as_lean_error(exc: BaseException) -> BaseException:
    """numpy's bare MemoryError (reading, computing or writing a frame) as the runtime's
    out-of-memory error, saying what was asked for."""
    return out_of_memory_error(exc) if isinstance(exc, MemoryError) else exc


class FrameQueue:
    """The lazy frame source an adapter iterates: fed by the caller, at most ``depth`` ahead.

    Frames handed to the adapter but not yet answered stay in ``in_flight`` so that, after a frame
    fails, the frames the adapter had already taken can be given again to the next attempt.
    """

    def __init__(self, count: int, cancel: threading.Event, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._cancel = cancel
        self._count = count
        self.in_flight: collections.deque = collections.deque()  # (ref, array)
        self.replay: collections.deque = collections.deque()
        self._closed = threading.Event()  # no frame will follow the queued ones

    def __len__(self) -> int:
        return self._count

    def __iter__(self):
        while True:
            if self.replay:
                item = self.replay.popleft()
            else:
                item = self._get()
                if item is None:
                    return
            self.in_flight.append(item)
            yield item[1]

    def _get(self):
        """The next frame, or None after the last one."""
        while True:
            try:
                return self._queue.get(timeout=0.05)
            except queue.Empty:
                if self._closed.is_set() and self._queue.empty():
                    return None
                if self._cancel.is_set():
                    raise OperationCancelled("The batch was cancelled; the frames already written are kept.") from None

    def has_room(self) -> bool:
        return not self._queue.full()

    def put(self, ref: FrameRef, array) -> None:
        self._queue.put((ref, array))

    def close(self) -> None:
        self._closed.set()  # never blocks: the caller's thread may be Blender's

    def has_more(self) -> bool:
        """Whether a frame is still to come (waits until one is queued or the queue is closed)."""
        while not (self.replay or not self._queue.empty()):
            if self._closed.is_set() and self._queue.empty():
                return False
            if self._cancel.wait(0.005):
                raise OperationCancelled("The batch was cancelled; the frames already written are kept.")
        return True

    def name_of(self, array) -> str | None:
        """The file name of a frame the adapter took (by identity): what messages call it."""
        ref = next((ref for ref, taken in self.in_flight if taken is array), None)
        path = getattr(ref, "path", None)  # a Blender image's frame has no file
        return path.name if path is not None else None

    def answered(self) -> FrameRef:
        return self.in_flight.popleft()[0]

    def fail_current(self) -> FrameRef:
        """The frame the adapter was working on failed: it is dropped, the ones it had taken
        after it are given again."""
        ref = self.in_flight.popleft()[0]
        self.replay.extend(self.in_flight)
        self.in_flight.clear()
        return ref


class BatchRun:
    """One batch: ``infer(frames, options)`` (the adapter call) on a worker thread, frames read
    and results written by whoever calls :meth:`pump`.

    ``read(ref) -> array`` and ``write(ref, result)`` raise to mark a frame failed. With
    ``stop_on_error`` the first failed frame ends the batch; otherwise it is reported and the
    batch goes on (a frame that fails inside the model ends that runtime operation; the rest
    continue in a new one).
    """

    def __init__(
        self,
        refs: list[FrameRef],
        infer: Callable[[FrameQueue, RunOptions], object],
        read: Callable[[FrameRef], object],
        write: Callable[[FrameRef, object], list[str] | None],  # returns notes for the report
        *,
        options: RunOptions,
        skip: Callable[[FrameRef], bool] = lambda ref: False,
        stop_on_error: bool = False,
        depth: int = 2,
        claim: Callable[[FrameRef], bool] = lambda ref: True,
        release: Callable[[FrameRef], None] = lambda ref: None,
    ):
        self.report = BatchReport(total=len(refs))
        self._infer, self._read, self._write = infer, read, write
        # taken just before a frame is read (another process may be computing it: then skipped),
        # released once it is written or failed (models/batch/frame_claims.py)
        self._claim, self._release = claim, release
        self._options = options
        self._stop_on_error = stop_on_error
        self._cancel = options.cancel if isinstance(options.cancel, threading.Event) else threading.Event()
        self._todo = collections.deque()
        for ref in refs:
            if skip(ref):
                self.report.skipped.append(ref.number)
            else:
                self._todo.append(ref)
        # decided here, not from _todo: the caller's pump drains _todo, and a batch no longer than
        # the queue can be read whole before the worker asks (2-frame shots then wrote nothing)
        self._needs_model = bool(self._todo)
        self._frames = FrameQueue(len(self._todo), self._cancel, depth)
        self._results: queue.Queue = queue.Queue(maxsize=depth)
        self._worker: threading.Thread | None = None
        self._worker_error: BaseException | None = None
        self._over = threading.Event()  # the worker handed out everything it will
        self._stopped = False  # a failed frame ended the batch (stop_on_error), not a cancel
        self._started = time.monotonic()

    # -- worker ----------------------------------------------------------------------------------
    def _progress(self, fraction: float, stage: str) -> None:
        done = len(self.report.written) + len(self.report.failed)
        total = max(1, len(self._frames))
        elapsed = time.monotonic() - self._started
        eta = f", ETA {elapsed / done * (total - done):.0f} s" if done else ""
        stage = _ADAPTER_FRAME.sub("", stage) or "running"  # the batch numbers frames itself
        where = f"frame {min(done + 1, total)}/{total}: " if total > 1 else ""
        self._options.report(
            (done + min(max(fraction * total - done, 0.0), 1.0)) / total, f"{where}{stage} ({elapsed:.0f} s{eta})"
        )

    def _hand_out(self, result) -> None:
        self._put_result((self._frames.answered(), result))

    def _put_result(self, item) -> None:
        while True:  # never blocked inside put(): a slot freed after a cancel must not take a frame
            if self._cancel.is_set():
                raise OperationCancelled("The batch was cancelled; the frames already written are kept.")
            try:
                self._results.put_nowait(item)
                return
            except queue.Full:
                self._cancel.wait(0.005)

    def infer_all(self) -> BatchReport:
        """The inference side (a worker thread): every frame fed to the adapter, results handed
        to :meth:`pump`. Ends by telling pump() the batch is over."""
        if not self.needs_model:  # every frame was skipped: no model to load
            self._over.set()
            return self.report
        options = RunOptions(
            device=self._options.device,
            progress=self._progress,
            cancel=self._cancel,
            runtime=self._options.runtime,
            on_result=self._hand_out,
        )
        try:
            while True:
                try:
                    self._infer(self._frames, options)
                    return self.report
                except OperationCancelled:
                    raise
                except (LeanImageError, MemoryError) as exc:
                    exc = _as_lean_error(exc)
                    if not self._frames.in_flight:
                        raise exc from None  # not about one frame (the model, the device): the batch cannot go on
                    ref = self._frames.fail_current()
                    self._put_result((ref, exc))
                    if self._stop_on_error or not self._frames.has_more():
                        return self.report  # no empty operation (and memory report) after the last frame
        except BaseException as exc:  # ends the batch; pump() raises it, traceback and all, on the caller's thread
            self._worker_error = exc
        finally:
            self._over.set()  # never a blocking put: the caller may have stopped pumping
        return self.report

    # -- caller ----------------------------------------------------------------------------------
    @property
    def needs_model(self) -> bool:
        return self._needs_model

    def start(self) -> BatchRun:
        """Run :meth:`infer_all` on a thread of its own (a caller without a worker thread)."""
        self._worker = threading.Thread(target=self.infer_all, name="lean_image_ai:batch", daemon=True)
        self._worker.start()
        return self

    def cancel(self) -> None:
        self._cancel.set()

    def _feed_one(self) -> None:
        ref = self._todo.popleft()
        try:
            if self._claim(ref):
                self._frames.put(ref, self._read(ref))
            else:
                self.report.skipped.append(ref.number)
        except Exception as exc:  # noqa: BLE001 - any unreadable frame is reported, never raised
            self._frame_failed(ref, exc, before_model=True)
        if not self._todo:
            self._frames.close()

    def _feed_all(self) -> None:
        """The reader thread of :meth:`run`: frames read as fast as the queue takes them."""
        while self._todo and not self._cancel.is_set():
            while not self._frames.has_room():
                if self._cancel.wait(0.005):
                    return
            self._feed_one()

    def pump(self, budget: float = 0.05, *, read: bool = True) -> bool:
        """Read frames into the queue (unless a reader thread does) and write finished results
        for about ``budget`` seconds; True once the batch is over (then :attr:`report` is final)."""
        deadline = time.monotonic() + budget
        while True:
            progressed = False
            if read and self._todo and self._frames.has_room() and not self._cancel.is_set():
                self._feed_one()
                progressed = True
            try:
                item = self._results.get_nowait()
            except queue.Empty:
                item = None
                if self._over.is_set() and self._results.empty():
                    return self._finish()
            if item is not None:
                # cancelled: nothing after the cancel is written, finished or not (a failed frame's
                # stop is not a cancel: the frames before it still finish)
                if self._stopped or not self._cancel.is_set():
                    self._take(*item)
                progressed = True
            if time.monotonic() >= deadline:
                return False
            if not progressed:
                time.sleep(0.002)

    def _take(self, ref: FrameRef, result) -> None:
        """One item the worker handed out: a frame's result written, or its failure reported."""
        if isinstance(result, BaseException):
            self._frame_failed(ref, result)
            return
        try:
            self.report.wrote(ref.number, self._write(ref, result), result)
        except Exception as exc:  # noqa: BLE001 - reported per frame
            self._frame_failed(ref, exc)
        self._release(ref)

    def _frame_failed(self, ref: FrameRef, exc: BaseException, *, before_model: bool = False) -> None:
        self._release(ref)
        exc = _as_lean_error(exc)
        text = str(exc) if isinstance(exc, LeanImageError | OSError) else f"{type(exc).__name__}: {exc}"
        self.report.failed.append((ref.number, text))
        if not self._stop_on_error:
            return
        self._stopped = True
        if before_model:
            self._todo.clear()  # the frames before it still finish, the last of them releasing
        else:
            self.cancel()

    def _finish(self) -> bool:
        if self._worker is not None:
            self._worker.join()
        self.report.seconds = time.monotonic() - self._started
        error = self._worker_error
        if isinstance(error, OperationCancelled) or self._cancel.is_set():
            self.report.cancelled = not self._stopped
        elif error is not None:
            raise error
        return True

    def run(self) -> BatchReport:
        """Without bpy's one-thread rule: frames read on a reader thread, the model on the worker,
        results written on this thread, all three at once."""
        self.start()
        reader = threading.Thread(target=self._feed_all, name="lean_image_ai:read", daemon=True)
        reader.start()
        try:
            while not self.pump(0.5, read=False):
                pass
        finally:
            if reader.is_alive():  # the batch ended early (an error): stop reading ahead
                self.cancel()
            reader.join()
        return self.report
