"""Output buffers kept warm between jobs, like the arena's regions, and given back with them.

A job that binds its model's output to its own memory (Upscale: 200 MB for a 1024 px image at
x4) would otherwise take a fresh buffer each time, and the kernel pages it in anew (zeroing it,
compacting for huge pages): measured here, 0.02-0.25 s for 200 MB, against the 0.06 s of
writing into a warm one. A bare `InferenceSession.run` writes into its arena, which stays warm.

Kept only while RAM is not due back at each job's end (`release_memory` off, or the release
deferred: deferred_release.py); every CPU release drops them (`Runtime.release_cpu_arena`), so
they go back exactly when the arena does. A buffer is lent to one job at a time.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

MAX_KEPT = 2  # buffers (a job binds one per slot: colour, and alpha when the model runs it)


class ScratchBuffers:
    def __init__(self, runtime):
        self._runtime = weakref.ref(runtime)
        self._lock = threading.Lock()
        self._kept: list[np.ndarray] = []

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for b in self._kept)

    def take(self, count: int, dtype) -> np.ndarray:
        """A flat buffer of at least `count` elements of `dtype`: a kept one if one is big enough."""
        dtype = np.dtype(dtype)
        with self._lock:
            fitting = [b for b in self._kept if b.dtype == dtype and b.size >= count]
            if fitting:
                buffer = min(fitting, key=lambda b: b.size)
                self._kept = [b for b in self._kept if b is not buffer]
                return buffer
        return np.empty(count, dtype)

    def give(self, buffer: np.ndarray) -> None:
        """Back from a job: kept for the next one, or let go when RAM is due back now."""
        runtime = self._runtime()
        settings = runtime.settings if runtime is not None else None
        if settings is None or not settings.ram_kept_between_jobs:
            return
        with self._lock:
            self._kept = sorted([*self._kept, buffer], key=lambda b: b.size, reverse=True)[:MAX_KEPT]

    def drop(self) -> None:
        with self._lock:
            self._kept = []
