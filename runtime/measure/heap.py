"""The C heap's free pages back to the OS (glibc's ``malloc_trim``): ctypes only, no thread and no
onnxruntime, so Blender's process may import it (after every job, operators/jobs.py) as well as
the worker and the command line (after a release, runtime/core.py)."""

from __future__ import annotations

import ctypes
import sys

_heap_trim = []  # [glibc's malloc_trim or None], looked up once


def trim_process_heap() -> bool:
    """Give the C heap's free pages back to the OS (glibc's ``malloc_trim(0)``); False elsewhere.

    numpy's job-sized temporaries (float copies of frames, tile buffers) come from malloc; once
    freed, glibc keeps them in its heap (it raises its mmap threshold after the first big free),
    so RSS would not come down after a job although nothing is in use. musl, macOS and Windows
    have no such call: there this does nothing."""
    if not _heap_trim:
        trim = None
        if sys.platform.startswith("linux"):
            try:
                trim = ctypes.CDLL(None).malloc_trim
                trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
            except (OSError, AttributeError):  # not glibc
                trim = None
        _heap_trim.append(trim)
    if _heap_trim[0] is None:
        return False
    _heap_trim[0](0)
    return True
