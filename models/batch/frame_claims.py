"""Sharing one output folder between processes: each missing frame is computed by one of them.

Two ``--skip-existing`` runs over one folder (two artists, two farm jobs, a re-queued task) plan
the same missing frames. Before a frame is read, its writer claims it: an exclusive, non-blocking
lock on a hidden file beside the output (``.<name>.claim``). The operating system drops a lock
when its process ends, however it ends (SIGKILL and power loss included), so a dead writer's
claim is free at once: no age or PID guess, no PID reuse to be fooled by. A claim held by a live
process means that process is computing the frame now, and this one moves on; a frame whose
output appeared meanwhile (written by another process) is skipped too.

The claim file is removed by its holder after the atomic write, while still locked; a claimant
that finds the file removed between its open and its lock starts again on the new one, so two
processes never both hold one frame. A file of that name that is not a claim (no marker, not
empty) is never removed: the frame fails with a message naming it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from ...runtime.errors import LeanImageError

MARK = b"lean_image_ai frame claim\n"

if os.name == "nt":
    import msvcrt

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)  # msvcrt locks bytes from the current position
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        with contextlib.suppress(OSError):
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


def claim_path(target: str | os.PathLike) -> Path:
    target = Path(target)
    return target.with_name(f".{target.name}.claim")


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:  # removed by its last holder between our open and our lock
        return False


def _foreign(fd: int) -> bool:
    """Not a claim file: content that does not start with the marker (empty is a claim whose
    writer died before writing it)."""
    os.lseek(fd, 0, os.SEEK_SET)
    head = os.read(fd, len(MARK))
    return bool(head) and head != MARK


class FrameClaims:
    """The claims this process holds, by output path. :meth:`take` before computing a frame,
    :meth:`release` after writing it (or failing), :meth:`release_all` when the job ends."""

    def __init__(self):
        self._held: dict[Path, int] = {}

    def take(self, target: str | os.PathLike) -> bool:
        """True: this process now computes ``target``. False: another live process is computing
        it, or it exists already (another process wrote it since this job was planned)."""
        target = Path(target)
        path = claim_path(target)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if not _try_lock(fd):
                    os.close(fd)
                    return False
                if not _same_file(fd, path):
                    _unlock(fd)
                    os.close(fd)
                    continue
                if _foreign(fd):
                    raise LeanImageError(
                        f"'{path}' is in the way of this frame's claim file and is not one; move it away and run again."
                    )
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise
            break
        if target.exists():
            self._drop(path, fd)
            return False
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, MARK + f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._held[target] = fd
        return True

    def release(self, target: str | os.PathLike) -> None:
        target = Path(target)
        fd = self._held.pop(target, None)
        if fd is not None:
            self._drop(claim_path(target), fd)

    def release_all(self) -> None:
        for target in list(self._held):
            self.release(target)

    def batch_hooks(self, target: dict) -> dict:
        """BatchRun's ``claim`` and ``release`` keywords for frames written to ``target[ref]``."""
        return {"claim": lambda ref: self.take(target[ref]), "release": lambda ref: self.release(target[ref])}

    @staticmethod
    def _drop(path: Path, fd: int) -> None:
        if os.name == "nt":  # Windows cannot remove an open file: unlock, close, then try
            _unlock(fd)
            os.close(fd)
            with contextlib.suppress(OSError):  # another process opened it meanwhile: it removes it
                path.unlink()
            return
        with contextlib.suppress(OSError):
            path.unlink()  # still locked: whoever opened the old file sees it is gone and starts again
        os.close(fd)
