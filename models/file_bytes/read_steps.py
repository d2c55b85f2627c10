"""A picture read for a model over several calls of a pump (bpy-free), so that no call of Blender's
main thread reads a sequence frame whole (issue #37 item 3): a 3840x2160 PNG's decode took ~0.1 s
there, its pixels' copy 0.03 s, the conversion for the model as much again, all in one call.

The front-end gives the steps (operators/model_job.py's ``frame_read``); this only runs them in
turn, one a call: the load (a library's decode, which cannot be split: alone in its call), the take
of its pixels (the loaded thing let go in the same call), the conversion a band a call
(:class:`BandedArray`), and the last touch (a turn by EXIF) in the call after the last band.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .bands import BandedArray

# take(loaded) -> (rows, convert, dtype): the source's rows (H, W, C), ``convert(band)`` a band of
# them as the model takes it, of ``dtype``; it lets ``loaded`` go itself (whatever happens).
Take = Callable[[object], tuple[np.ndarray, Callable[[np.ndarray], np.ndarray], object]]


class ReadSteps:
    """``load()`` -> a loaded thing; ``take`` (see :data:`Take`); ``finish(pixels)`` -> the frame;
    ``let_go(loaded)`` removes a loaded thing never taken (a cancel, a failure between the calls).
    :attr:`pixels` once :meth:`pump` has said True."""

    def __init__(self, load: Callable[[], object], take: Take, finish: Callable[[np.ndarray], np.ndarray],
                 let_go: Callable[[object], None]):
        self._load, self._take, self._finish, self._let_go = load, take, finish, let_go
        self._loaded = None
        self._fill: BandedArray | None = None
        self.pixels: np.ndarray | None = None
        self.steps = 0  # calls of pump that did any work
        self.converted: list[int] = []  # pixels converted by each call of the conversion

    def pump(self, budget: float) -> bool:
        """One step; True once :attr:`pixels` holds the frame."""
        if self.pixels is not None:
            return True
        self.steps += 1
        if self._fill is not None:
            if self._fill.pump(budget):
                self.pixels, self._fill = self._finish(self._fill.out), None
                return True
            return False
        if self._loaded is None:
            self._loaded = self._load()
            return False
        loaded, self._loaded = self._loaded, None
        rows, convert, dtype = self._take(loaded)
        self._fill = BandedArray(rows.shape, dtype, lambda start, stop: convert(rows[start:stop]))
        self.converted = self._fill.calls
        return False

    def close(self) -> None:
        """Let go of what was loaded and not taken yet (a cancel mid-read); nothing once taken."""
        loaded, self._loaded, self._fill = self._loaded, None, None
        if loaded is not None:
            self._let_go(loaded)

    def finish_now(self) -> np.ndarray:
        """The whole read in one go (a caller with no main thread to keep free)."""
        try:
            while not self.pump(1e9):
                pass
        finally:
            self.close()
        return self.pixels
