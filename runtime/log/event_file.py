"""The runtime's events, appended to a JSON-lines log on disk (one event a line, rotated).

The listener on the event log only queues the event, so inference never waits for a disk; the
host's own timer writes the lines (:meth:`EventFile.drain`: Blender, which must start no Python
thread), or, where threads are fine (the command line, the worker), one long-lived writer thread
does (runtime/log/event_writer.py, loaded only there). A write that fails (a folder that cannot be made, a
full or read-only disk) is counted and said once, never raised: a log must not break a job.
Rotation keeps at most ``files`` files of about ``max_bytes`` each: ``events.jsonl`` (newest),
``events.jsonl.1``, ... (older). Several processes may log to one folder (a farm's workers, the
command line beside Blender): each append and rotation holds an OS lock on ``events.jsonl.lock``,
so one process never renames a file another has just renamed, and no event is lost.

Folder, first that is set: ``$LEAN_IMAGE_AI_LOG_DIR``; the front-end's own (Blender: the
extension's user folder, ``logs``); ``<per-user folder>/logs`` (runtime/paths.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import time
from pathlib import Path

from ..errors import SettingError, first_line
from ..paths import user_cache_root

LOG_DIR_ENV = "LEAN_IMAGE_AI_LOG_DIR"
LOG_NAME = "events.jsonl"
MAX_BYTES = 1 << 20
FILES = 3
LOCK_WAIT_S = 10.0  # as long as Windows' msvcrt.locking retries
QUEUE_LIMIT = 10_000  # events waiting for the disk; beyond that they are dropped (and counted)

logger = logging.getLogger("lean_image_ai.runtime")


def log_folder(host_default: Path | None = None) -> Path:
    """The log folder (see module doc); nothing is created."""
    if os.environ.get(LOG_DIR_ENV):
        try:
            return Path(os.environ[LOG_DIR_ENV]).expanduser()
        except RuntimeError:  # "~nosuchuser/x": pathlib knows no such home folder
            raise SettingError(
                f"{LOG_DIR_ENV}={os.environ[LOG_DIR_ENV]!r}: there is no user of that name to take a home "
                "folder from; give the event log's folder as a path."
            ) from None
    if host_default is not None:
        return Path(host_default)
    return user_cache_root() / "logs"


class EventFile:
    """Writes the events of an :class:`~.events.EventLog` to ``folder/events.jsonl``."""

    def __init__(self, folder, *, max_bytes: int = MAX_BYTES, files: int = FILES, on_error=None):
        self.folder = Path(folder)
        self.path = self.folder / LOG_NAME
        self.max_bytes = max(1, int(max_bytes))
        self.files = max(1, int(files))
        self.written = 0
        self.failures = 0
        self.dropped = 0
        self.error: str | None = None  # the first failure, for the panel and tests
        # told the first failure (path, text) from the writer thread: the command line says it on
        # stderr, where the logger's NullHandler would keep it from the user
        self.on_error = on_error
        self._queue: queue.Queue = queue.Queue(QUEUE_LIMIT)
        self._unsubscribe = None

    def attach(self, events) -> EventFile:
        self._unsubscribe = events.subscribe(self._enqueue)
        return self

    def _enqueue(self, event: dict) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def drain(self) -> None:
        """Write what is queued, here and now (the host's timer)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, dict):
                self._append(item)

    def flush(self, timeout: float = 5.0) -> bool:
        """What was queued so far on disk (or failed); False on timeout (a writer thread's)."""
        self.drain()
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Stop listening, write what is queued."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.flush(timeout)

    def _append(self, item: dict) -> None:
        try:
            self._write(json.dumps(item, default=str, sort_keys=True) + "\n")
            self.written += 1
        except Exception as exc:  # never raised: a log must not break a job
            self.failures += 1
            if self.error is None:
                self.error = first_line(exc)
                logger.warning("event log %s cannot be written: %s", self.path, self.error)
                if self.on_error is not None:
                    self.on_error(self.path, self.error)

    def _write(self, line: str) -> None:
        data = line.encode("utf-8")
        self.folder.mkdir(parents=True, exist_ok=True)
        with _locked(self.folder / f"{LOG_NAME}.lock"):
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size and size + len(data) > self.max_bytes:
                self._rotate()
            with open(self.path, "ab") as f:
                f.write(data)

    def _rotate(self) -> None:
        """events.jsonl -> .1 -> .2 ...; the oldest beyond ``files`` is dropped."""
        if self.files == 1:
            self.path.unlink(missing_ok=True)
            return
        (self.folder / f"{LOG_NAME}.{self.files - 1}").unlink(missing_ok=True)
        for index in range(self.files - 2, -1, -1):
            older = self.folder / (f"{LOG_NAME}.{index}" if index else LOG_NAME)
            # a file gone meanwhile (a process of an older version, without the lock) is nothing to move
            with contextlib.suppress(FileNotFoundError):
                os.replace(older, self.folder / f"{LOG_NAME}.{index + 1}")


if os.name == "nt":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _os_lock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_LOCK, 1)  # retries for 10 s, then raises: the write is counted as failed

    def _os_unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _os_lock(fd: int) -> None:
        """Waits at most LOCK_WAIT_S: a holder stopped for good (SIGSTOP, a hung share) must not
        stall the log; raises then, and the write is counted as failed and said once."""
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{LOG_NAME}.lock held by another process for over {LOCK_WAIT_S:.0f} s") from None
                time.sleep(0.005)

    def _os_unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def _locked(path: Path):
    """An OS lock on ``path``, which stays (deleting it would let two processes lock two files);
    the OS releases it when the process ends, a crash included."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        _os_lock(fd)
        try:
            yield
        finally:
            _os_unlock(fd)
    finally:
        os.close(fd)


_current: EventFile | None = None  # started, replaced and stopped on the front-end's main thread


def start(events, folder, *, on_error=None, kind: type[EventFile] = EventFile) -> EventFile:
    """Log the events of ``events`` (an EventLog: the runtime's, or in Blender's process the host's,
    models/worker/host_record.py) to ``folder`` from now on (replacing the log already started);
    ``on_error(path, text)`` is told once when the log cannot be written. ``kind``: this module's
    EventFile, whose lines the host writes from its own timer (:func:`drain`), or
    runtime/log/event_writer.py's, which has a writer thread."""
    global _current
    if _current is not None:
        _current.close()
    _current = kind(folder, on_error=on_error).attach(events)
    return _current


def current() -> EventFile | None:
    return _current


def drain() -> None:
    """The current log's queued events written now (a host's timer, when it has no writer thread)."""
    log = _current
    if log is not None:
        log.drain()


def stop() -> None:
    global _current
    if _current is not None:
        _current.close()
    _current = None
