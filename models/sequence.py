"""Image sequences (bpy-free): which frames a batch covers, where each one goes, and the batch run.

Inputs: one file; a folder of images (sorted by name; frame numbers from the names' trailing
digits, else 1, 2, ...); a numbered pattern (``shot_####.png`` or ``shot_%04d.png``); or one frame
file of a numbered sequence with a frame range. A range is ``A-B`` or ``A-B:STEP``.

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
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..runtime.errors import LeanImageError, OperationCancelled
from .base import JobOptions

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".exr", ".bmp", ".tga", ".webp", ".hdr")
_HASHES = re.compile(r"#+")
_PRINTF = re.compile(r"%0?(\d*)d")
_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")
_ADAPTER_FRAME = re.compile(r"^frame \d+/\d+(, )?")


@dataclass(frozen=True)
class FrameRef:
    number: int
    path: Path


def parse_frames(text: str) -> range:
    """``A``, ``A-B`` or ``A-B:STEP`` (inclusive) as a range."""
    match = re.fullmatch(r"\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?(?::\s*(\d+)\s*)?", text or "")
    if match is None:
        raise LeanImageError(f"Frames {text!r}: write A-B or A-B:STEP, e.g. 1-48 or 1-48:2.")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    step = int(match.group(3) or 1)
    if last < first or step < 1:
        raise LeanImageError(f"Frames {text!r}: the end comes before the start, or the step is 0.")
    return range(first, last + 1, step)


def is_pattern(text: str) -> bool:
    name = Path(str(text)).name
    return bool(_HASHES.search(name) or _PRINTF.search(name))


def frame_path(pattern: str | Path, number: int) -> Path:
    """The file of frame ``number``: ``####`` becomes a zero-padded number of that width."""
    pattern = Path(pattern)
    name = pattern.name
    if _HASHES.search(name):
        name = _HASHES.sub(lambda m: f"{number:0{len(m.group(0))}d}", name, count=1)
    elif _PRINTF.search(name):
        name = _PRINTF.sub(lambda m: f"{number:0{int(m.group(1) or 0)}d}", name, count=1)
    else:
        raise LeanImageError(f"'{pattern}' has no frame number placeholder (#### or %04d).")
    return pattern.with_name(name)


def pattern_of(frame_file: str | Path) -> tuple[str, int] | None:
    """(``name_####.ext`` pattern, frame number) of a numbered frame file, as Blender reads
    image sequences (the digits just before the suffix); None when the name has none."""
    path = Path(frame_file)
    match = _TRAILING_DIGITS.match(path.stem)
    if match is None:
        return None
    prefix, digits = match.groups()
    return str(path.with_name(f"{prefix}{'#' * len(digits)}{path.suffix}")), int(digits)


def _pattern_regex(pattern: Path) -> re.Pattern:
    name = pattern.name
    hashes = _HASHES.search(name)
    if hashes:
        head, tail = name[: hashes.start()], name[hashes.end() :]
    else:
        printf = _PRINTF.search(name)
        head, tail = name[: printf.start()], name[printf.end() :]
    return re.compile(re.escape(head) + r"(\d+)" + re.escape(tail) + "$")


def resolve_input(spec: str | Path, frames: range | None = None) -> list[FrameRef]:
    """The frames a batch reads (see module doc); LeanImageError saying what is wrong."""
    text = str(spec)
    path = Path(text).expanduser()
    if is_pattern(text):
        if not path.parent.is_dir():
            raise LeanImageError(f"Input folder '{path.parent}' does not exist.")
        if frames is not None:
            refs = [FrameRef(n, frame_path(path, n)) for n in frames]
            missing = [r for r in refs if not r.path.is_file()]
            if len(missing) == len(refs):
                raise LeanImageError(f"No frame of '{path}' in {_describe(frames)} exists.")
            return refs  # a missing frame in between is reported as failed, not silently dropped
        regex = _pattern_regex(path)
        found = sorted(
            (int(m.group(1)), p) for p in path.parent.iterdir() if (m := regex.match(p.name)) and p.is_file()
        )
        if not found:
            raise LeanImageError(f"No file matches '{path}'.")
        return [FrameRef(n, p) for n, p in found]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise LeanImageError(f"Folder '{path}' holds no image files ({', '.join(IMAGE_SUFFIXES)}).")
        numbers = [pattern_of(p)[1] if pattern_of(p) else None for p in files]
        if None in numbers or len(set(numbers)) != len(numbers):
            numbers = list(range(1, len(files) + 1))
        refs = [FrameRef(n, p) for n, p in zip(numbers, files, strict=True)]
        if frames is not None:
            refs = [r for r in refs if r.number in frames]
            if not refs:
                raise LeanImageError(f"No image in '{path}' has a frame number in {_describe(frames)}.")
        return refs
    if path.is_file():
        numbered = pattern_of(path)
        if frames is not None and numbered is not None:
            return resolve_input(numbered[0], frames)
        return [FrameRef(numbered[1] if numbered else 1, path)]
    raise LeanImageError(f"Input '{path}' not found: give an image file, a folder or a pattern like shot_####.png.")


def _describe(frames: range) -> str:
    return f"{frames.start}-{frames.stop - 1}" + (f":{frames.step}" if frames.step != 1 else "")


def output_paths(refs: list[FrameRef], output: str | Path | None, default_name: Callable[[FrameRef], str]) -> list[Path]:
    """Where each frame's result goes: a pattern (``out_####.exr``), a folder (default names in
    it), or, for one frame, a file. ``None``: default names beside each input."""
    if output is None:
        return [r.path.with_name(default_name(r)) for r in refs]
    text = str(output)
    path = Path(text).expanduser()
    if is_pattern(text):
        return [frame_path(path, r.number) for r in refs]
    if path.is_dir() or text.endswith(("/", "\\")):
        return [path / default_name(r) for r in refs]
    if len(refs) == 1:
        return [path]
    raise LeanImageError(
        f"'{path}' is one file but the input has {len(refs)} frames: give a folder or a pattern like out_####.exr."
    )


# ---- the batch run ----------------------------------------------------------------------------

_END = object()


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

    def __len__(self) -> int:
        return self._count

    def __iter__(self):
        while True:
            if self.replay:
                item = self.replay.popleft()
            else:
                item = self._get()
                if item is _END:
                    return
            self.in_flight.append(item)
            yield item[1]

    def _get(self):
        while True:
            try:
                return self._queue.get(timeout=0.05)
            except queue.Empty:
                if self._cancel.is_set():
                    raise OperationCancelled("The batch was cancelled; the frames already written are kept.") from None

    def has_room(self) -> bool:
        return not self._queue.full()

    def put(self, ref: FrameRef, array) -> None:
        self._queue.put((ref, array))

    def close(self) -> None:
        self._queue.put(_END)

    def answered(self) -> FrameRef:
        return self.in_flight.popleft()[0]

    def fail_current(self) -> FrameRef:
        """The frame the adapter was working on failed: it is dropped, the ones it had taken
        after it are given again."""
        ref = self.in_flight.popleft()[0]
        self.replay.extend(self.in_flight)
        self.in_flight.clear()
        return ref


@dataclass
class BatchReport:
    total: int
    written: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cancelled: bool = False
    seconds: float = 0.0

    def summary(self) -> str:
        text = f"{len(self.written)} written, {len(self.skipped)} skipped, {len(self.failed)} failed of {self.total}"
        if self.cancelled:
            text += " (cancelled)"
        return text

    def as_dict(self) -> dict:
        return {
            "frames": self.total,
            "written": len(self.written),
            "skipped": len(self.skipped),
            "failed": [{"frame": n, "error": e} for n, e in self.failed],
            "cancelled": self.cancelled,
            "seconds": round(self.seconds, 3),
        }


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
        infer: Callable[[FrameQueue, JobOptions], object],
        read: Callable[[FrameRef], object],
        write: Callable[[FrameRef, object], list[str] | None],  # returns notes for the report
        *,
        options: JobOptions,
        skip: Callable[[FrameRef], bool] = lambda ref: False,
        stop_on_error: bool = False,
        depth: int = 2,
    ):
        self.report = BatchReport(total=len(refs))
        self._infer, self._read, self._write = infer, read, write
        self._options = options
        self._stop_on_error = stop_on_error
        self._cancel = options.cancel if isinstance(options.cancel, threading.Event) else threading.Event()
        self._todo = collections.deque()
        for ref in refs:
            if skip(ref):
                self.report.skipped.append(ref.number)
            else:
                self._todo.append(ref)
        self._frames = FrameQueue(len(self._todo), self._cancel, depth)
        self._results: queue.Queue = queue.Queue(maxsize=depth)
        self._worker: threading.Thread | None = None
        self._worker_error: BaseException | None = None
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
        ref = self._frames.answered()
        while True:  # never blocked inside put(): a slot freed after a cancel must not take a frame
            if self._cancel.is_set():
                raise OperationCancelled("The batch was cancelled; the frames already written are kept.")
            try:
                self._results.put_nowait((ref, result))
                return
            except queue.Full:
                self._cancel.wait(0.005)

    def infer_all(self) -> BatchReport:
        """The inference side (a worker thread): every frame fed to the adapter, results handed
        to :meth:`pump`. Ends by telling pump() the batch is over."""
        if not self.needs_model:  # every frame was skipped: no model to load
            self._results.put(_END)
            return self.report
        options = JobOptions(
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
                except LeanImageError as exc:
                    if not self._frames.in_flight:
                        raise  # not about one frame (the model, the device): the batch cannot go on
                    ref = self._frames.fail_current()
                    self._results.put((ref, exc))
                    if self._stop_on_error:
                        return self.report
        except BaseException as exc:  # ends the batch; pump() reports it on the caller's thread
            if not isinstance(exc, LeanImageError):
                traceback.print_exc()
            self._worker_error = exc
        finally:
            self._results.put(_END)
        return self.report

    # -- caller ----------------------------------------------------------------------------------
    @property
    def needs_model(self) -> bool:
        return bool(self._todo)

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
            self._frames.put(ref, self._read(ref))
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
            if item is _END:
                return self._finish()
            if item is not None:
                ref, result = item
                if isinstance(result, BaseException):
                    self._frame_failed(ref, result)
                else:
                    try:
                        notes = self._write(ref, result)
                        self.report.written.append(ref.number)
                        self.report.warnings.extend(notes or [])
                        self.report.warnings.extend(getattr(result, "warnings", None) or [])
                    except Exception as exc:  # noqa: BLE001 - reported per frame
                        self._frame_failed(ref, exc)
                progressed = True
            if time.monotonic() >= deadline:
                return False
            if not progressed:
                time.sleep(0.002)

    def _frame_failed(self, ref: FrameRef, exc: BaseException, *, before_model: bool = False) -> None:
        text = str(exc) if isinstance(exc, LeanImageError | OSError) else f"{type(exc).__name__}: {exc}"
        self.report.failed.append((ref.number, text))
        if not self._stop_on_error:
            return
        if before_model:
            self._todo.clear()  # the frames before it still finish, the last of them releasing
        else:
            self.cancel()

    def _finish(self) -> bool:
        if self._worker is not None:
            self._worker.join()
        self.report.seconds = time.monotonic() - self._started
        error = self._worker_error
        stopped_on_error = self._stop_on_error and bool(self.report.failed)
        if isinstance(error, OperationCancelled) or self._cancel.is_set():
            self.report.cancelled = not stopped_on_error
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
