"""Cross-process locks in a models folder: one model's install, and each read-modify-write of a
shared record (two Blender processes or farm nodes sharing a models folder).

The lock is the OS file lock of runtime/file_lock.py on ``<file>.lock`` beside the model: the OS
releases it when the holding process ends, crash included, and a waiter can say who it waits for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from ...runtime.errors import LeanImageError, ModelInstallError, OperationCancelled
from ...runtime.file_lock import acquire, held, lock_path


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
    fd = acquire(
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
    with held(path, fd):
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
    fd = acquire(
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
    with held(path, fd):
        yield
