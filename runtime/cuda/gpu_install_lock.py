"""One install or removal of the GPU libraries into a folder at a time, across processes (bpy-free).

Two Blender windows pressing Install, or the command twice, would otherwise share one staging
folder: the second deletes the first's mid-pip, both pips write into it, and one ends marked
complete with files from two runs. The whole install (staging, pip, marking it complete, the move
into place) holds the OS lock of runtime/file_lock.py on ``<folder>.lock``; the OS releases it
when the holder dies (and pip, which inherits it, has ended too), and a second install is refused
at once, naming the process that holds it (an install takes minutes: there is no sensible wait
to offer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from .. import file_lock
from ..errors import GpuRuntimeError


@contextlib.contextmanager
def one_install_at_a_time(target: Path) -> Iterator[int]:
    """Hold ``<target>.lock`` for the block (``target`` resolved, not the root), yielding its
    locked descriptor (a child given it holds the lock as long as it lives); GpuRuntimeError
    naming the holder when another process holds it, before anything is changed."""
    lock = file_lock.lock_path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuRuntimeError(f"Cannot make the folder {target.parent} for the GPU libraries: {exc}. Nothing was installed.") from exc
    fd = file_lock.acquire(
        lock,
        0.0,
        cannot_create=lambda exc: GpuRuntimeError(
            f"Cannot create the lock file {lock}: {exc}. Check write permission of {target.parent}; nothing was changed."
        ),
        busy=lambda holder: GpuRuntimeError(
            f"Another install of the GPU libraries into {target} is running ({holder}); let it finish "
            "or stop it, then try again. Nothing was changed here."
        ),
    )
    with file_lock.held(lock, fd):
        yield fd
