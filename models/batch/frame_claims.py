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
empty) is never removed: the frame fails with a message naming it. In a shared folder another
user may plant something at a claim's name: a symbolic link (followed, it would make this user
create or truncate a file elsewhere), a pipe, a folder, a hard link; the claim is opened without
following links and refused for that frame unless it is a plain file of its own.

A killed writer's claim file stays behind (nothing ran to remove it); every run over those
outputs, whatever its mode, removes the ones no live process holds (:func:`remove_stale`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

from ...runtime.errors import LeanImageError
from .. import files

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


_OPEN_FLAGS = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def claim_path(target: str | os.PathLike) -> Path:
    """``.<name>.claim`` beside the output (a hashed name for one too long to take the tail)."""
    return files.hidden_beside(Path(target), ".claim")


def _refused(path: Path, what: str) -> LeanImageError:
    return LeanImageError(
        f"'{path}' is {what}, where this frame's claim file goes (another user of the folder?); "
        "the frame was not computed. Remove it, or write to a folder only you can change."
    )


def _open_claim(path: Path, create: bool = True) -> int:
    """The claim file, never through a symbolic link, and only a plain file of its own."""
    try:
        fd = os.open(path, _OPEN_FLAGS | (os.O_CREAT if create else 0), 0o644)
    except OSError:
        if os.path.islink(path):
            raise _refused(path, "a symbolic link") from None
        if os.path.isdir(path):
            raise _refused(path, "a folder") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        raise _refused(path, "not a plain file" if not stat.S_ISREG(info.st_mode) else "a hard link to another file")
    return fd


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
            fd = _open_claim(path)
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
        if os.path.lexists(target):  # a link at the output's name is an output there (never followed)
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


def remove_stale(targets) -> list[Path]:
    """Remove the claim files of ``targets`` that no live process holds: what a killed run left
    (its lock went with it). A claim held now, or a file that is not a claim, is left alone."""
    removed = []
    for target in targets:
        path = claim_path(target)
        if not os.path.lexists(path):
            continue
        try:
            fd = _open_claim(path, create=False)
        except (OSError, LeanImageError):  # not ours to judge: take() refuses it with a message
            continue
        try:
            if _try_lock(fd) and _same_file(fd, path) and not _foreign(fd):
                FrameClaims._drop(path, fd)
                fd = -1
                removed.append(path)
        finally:
            if fd >= 0:
                os.close(fd)
    return removed
