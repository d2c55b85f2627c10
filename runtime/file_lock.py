"""An OS file lock on ``<file>.lock``, across processes (bpy-free): ``flock`` on POSIX, ``msvcrt``
on Windows, so the OS releases it when the holding process ends, crash included. The holder writes
its pid and host name into the file, so a process that has to wait can say who it waits for. On
POSIX the holder deletes the file on release; a waiter that then locks the deleted inode notices
(the path no longer names the file it opened) and tries again.

Model installs and shared records (models/store/install_lock.py) and the GPU-runtime install
(runtime/cuda/gpu_libraries.py) take their turns on it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_SUFFIX = ".lock"
POLL_SECONDS = 0.1

if os.name == "nt":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


def lock_path(dest: Path) -> Path:
    return dest.with_name(dest.name + LOCK_SUFFIX)


def holder_of(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        text = ""
    return text or "another process"


def _still_names(path: Path, fd: int) -> bool:
    """The lock path still names the file we hold (the previous holder may have deleted it)."""
    if os.name == "nt":
        return True
    try:
        here, held = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)


def acquire(path: Path, wait: float, *, cannot_create, busy, cancel=None, cancelled=None, waiting=None) -> int:
    """The locked file descriptor of ``path``, waiting up to ``wait`` seconds for its holder.
    ``cannot_create(exc)``, ``busy(holder)`` and ``cancelled(holder)`` make the errors raised."""
    deadline = time.monotonic() + max(0.0, wait)
    told = False
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
        except OSError as exc:
            raise cannot_create(exc) from exc
        if _try_lock(fd):
            if _still_names(path, fd):
                return fd
            _unlock(fd)  # we locked a file the previous holder had already deleted
            os.close(fd)
            continue
        os.close(fd)
        holder = holder_of(path)
        if not told and waiting is not None:
            waiting(holder)
        told = True
        if cancel is not None and cancel():
            raise cancelled(holder)
        if time.monotonic() >= deadline:
            raise busy(holder)
        time.sleep(POLL_SECONDS)


@contextlib.contextmanager
def held(path: Path, fd: int) -> Iterator[None]:
    try:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, f"process {os.getpid()} on {socket.gethostname()}".encode())
        yield
    finally:
        if os.name != "nt":
            with contextlib.suppress(OSError):
                os.unlink(path)  # while still holding it: waiters re-check the path
        with contextlib.suppress(OSError):
            _unlock(fd)
        os.close(fd)
