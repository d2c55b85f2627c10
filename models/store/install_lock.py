"""Cross-process locks in a models folder: one model's install, and each read-modify-write of a
shared record (two Blender processes or farm nodes sharing a models folder).

The lock is an OS file lock on ``<file>.lock`` beside the model (``flock`` on POSIX, ``msvcrt``
on Windows), so the OS releases it when the holding process ends, crash included. The holder
writes its pid and host name into the file, so a process that has to wait can say who it waits
for. On POSIX the holder deletes the file on release; a waiter that then locks the deleted inode
notices (the path no longer names the file it opened) and tries again.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ...runtime.errors import LeanImageError, ModelInstallError, OperationCancelled

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


def _holder(path: Path) -> str:
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


def _acquire(path: Path, wait: float, *, cannot_create, busy, cancel=None, cancelled=None, waiting=None) -> int:
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
        holder = _holder(path)
        if not told and waiting is not None:
            waiting(holder)
        told = True
        if cancel is not None and cancel():
            raise cancelled(holder)
        if time.monotonic() >= deadline:
            raise busy(holder)
        time.sleep(POLL_SECONDS)


@contextlib.contextmanager
def _held(path: Path, fd: int) -> Iterator[None]:
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


@contextlib.contextmanager
def install_lock(
    dest: Path,
    title: str,
    *,
    wait: float,
    cancel: Callable[[], bool] | None = None,
    waiting: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold the install lock of ``dest`` for the block; wait up to ``wait`` seconds for it.

    ``waiting(holder)`` is called once when another process holds it. ``cancel()`` is polled
    while waiting. Raises :class:`ModelInstallError` naming the holder when the wait runs out.
    """
    path = lock_path(dest)
    fd = _acquire(
        path,
        wait,
        cannot_create=lambda exc: ModelInstallError(
            f"Cannot create the lock file {str(path)!r} for installing {title}: {exc}. "
            "Check write permission of the models folder, or choose another one in the add-on "
            "preferences."
        ),
        busy=lambda holder: ModelInstallError(
            f"{title} is being installed into {str(dest.parent)!r} by {holder} (lock file "
            f"{str(path)!r}). Wait for that install to finish and try again; nothing was "
            "changed here."
        ),
        cancel=cancel,
        cancelled=lambda holder: OperationCancelled(
            f"Installing {title} was cancelled while waiting for {holder}, which is installing it "
            f"into {str(dest.parent)!r}."
        ),
        waiting=waiting,
    )
    with _held(path, fd):
        yield


# A read-modify-write of a shared file (the user-model list) takes well under a second; a holder
# past this long is stuck, and the user is told who it is rather than waiting forever.
EDIT_WAIT_S = 30.0


@contextlib.contextmanager
def edit_lock(target: Path, what: str, *, wait: float = EDIT_WAIT_S) -> Iterator[None]:
    """Hold ``<target>.lock`` for one read-modify-write of ``target``, a file several processes
    change (Blender and the command line, farm nodes sharing a models folder): without it two
    writers each load, add and write, and the last one drops the other's change."""
    path = lock_path(target)
    fd = _acquire(
        path,
        wait,
        cannot_create=lambda exc: LeanImageError(
            f"Cannot change {what}: the lock file {str(path)!r} cannot be made ({exc.strerror or exc}). "
            "Check write permission of that folder; nothing was changed."
        ),
        busy=lambda holder: LeanImageError(
            f"Cannot change {what}: {holder} has been changing it for {wait:.0f} s (lock file "
            f"{str(path)!r}). Try again when it is done; nothing was changed."
        ),
    )
    with _held(path, fd):
        yield
