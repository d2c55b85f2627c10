"""Work on a picture a band of rows at a time, each call of :meth:`BandedSteps.pump` within its time
budget and at most :data:`MAX_PIXELS_PER_CALL` pixels: a file's rows encoded (its bytes put
together as the bands come, the last call only filling in what had to wait, so neither it nor the
call that makes the image copies the whole file), or an array filled (a picture converted for a model).

Blender's main thread runs the add-on between two redraws: a 2048x2048 result converted and
compressed in one call took 0.13-0.47 s there (docs/benchmarks.md), whatever the pump's budget.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable

import numpy as np

from .. import files

# Rows of the first band of a file, before the time a row takes is known.
FIRST_BAND_ROWS = 16
# The most pixels one call converts and compresses, whatever its budget says: the time of a row is
# measured on the band before, and an image whose later rows deflate slower must not overrun by much.
MAX_PIXELS_PER_CALL = 1 << 20

Rows = Callable[[int, int], np.ndarray]  # (start, stop) -> the band of those rows, top row first


class BandedSteps:
    """Work on ``height`` rows of ``width`` pixels, a band at a time: ``rows(start, stop)`` gives a
    band, :meth:`_write` takes it, :meth:`_close` ends the work once every row is written.
    A band starts on a multiple of ``row_multiple`` (EXR's 16-line blocks)."""

    row_multiple = 1

    def __init__(self, height: int, width: int, rows: Rows):
        self.height, self.width, self._rows = height, width, rows
        self._next = 0
        self._seconds_per_row = 0.0  # measured on the band before
        self.calls: list[int] = []  # pixels written by each call of pump that wrote any
        self.done = False

    def pump(self, budget: float) -> bool:
        """Write the rows that fit ``budget`` seconds; True once done (:meth:`_close` called)."""
        if self.done:
            return True
        if self._next >= self.height:
            self._close()
            self.done = True
            return True
        started, written = time.perf_counter(), 0
        allowance = self._rounded(max(self.row_multiple, MAX_PIXELS_PER_CALL // self.width))
        while self._next < self.height and written < allowance:
            rows = min(self._band_rows(budget), allowance - written, self.height - self._next)
            elapsed = time.perf_counter() - started
            if written and elapsed + rows * self._seconds_per_row > budget:
                break
            band_started = time.perf_counter()
            self._write(self._rows(self._next, self._next + rows), self._next)
            self._seconds_per_row = (time.perf_counter() - band_started) / rows
            self._next += rows
            written += rows
        self.calls.append(written * self.width)
        return False

    def _band_rows(self, budget: float) -> int:
        """Rows of the next band: a quarter of the budget at the last band's pace."""
        if not self._seconds_per_row:
            return self._rounded(FIRST_BAND_ROWS)
        return self._rounded(int(budget / 4 / self._seconds_per_row))

    def _rounded(self, rows: int) -> int:
        return max(self.row_multiple, rows // self.row_multiple * self.row_multiple)

    def finish_now(self):
        """All of it in one go (a front-end with no main thread to keep free)."""
        while not self.pump(1e9):
            pass

    def _write(self, band: np.ndarray, start: int) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError


class BandedFile(BandedSteps):
    """One image file (:attr:`data` once done). Subclasses write what they know of the file at
    once (a header, or room kept for what only the end knows) and each band's bytes after it, to
    :attr:`_out`; :meth:`_end` writes the tail and fills in that room (:meth:`_fill`).

    A whole-file join at the end took 0.05-0.16 s for a 2048x2048 float EXR (65 MB) in one call:
    here each band's bytes are copied once as they come, and :attr:`data` is the very buffer they
    went to (``BytesIO.getvalue`` hands it over uncopied when no view of it is held). Or, after
    :meth:`write_to`, the bands go to a file on disk as they come."""

    suffix = ""

    def __init__(self, height: int, width: int, rows: Rows):
        super().__init__(height, width, rows)
        self.data: bytes | None = None
        self._out = io.BytesIO()
        self._staged: files.StagedFile | None = None
        self.written_to = None  # the path the last call installed the file at (write_to)

    @property
    def is_float(self) -> bool:
        return False

    def finish_now(self) -> bytes:
        super().finish_now()
        return self.data

    def write_to(self, target) -> None:
        """Write the file to ``target`` as its bands come (:attr:`data` stays None): a temporary
        file beside it (models/files.py StagedFile), flushed to disk and renamed over ``target`` by
        the last call, so no call writes the whole file (0.2-0.5 s for a 4096x4096 float EXR);
        :meth:`discard`, or dropping this object, removes it. Before any row is written."""
        if self._next or self._staged is not None:
            raise RuntimeError("write_to() comes before the first row")
        self._staged = files.StagedFile(target)
        self._staged.handle.write(self._out.getvalue())
        self._out = self._staged.handle

    def discard(self) -> None:
        """Remove what :meth:`write_to` has written so far (a cancel); ``target`` is untouched."""
        if self._staged is not None:
            self._staged.discard()

    def _close(self) -> None:
        self._end()
        if self._staged is not None:
            self._staged.commit()
            self._out, self.written_to = None, self._staged.target
        else:
            self.data, self._out = self._out.getvalue(), None

    def _fill(self, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` of the bytes written so far (room kept for it)."""
        end = self._out.tell()
        self._out.seek(offset)
        self._out.write(data)
        self._out.seek(end)

    def _end(self) -> None:
        raise NotImplementedError


class BandedArray(BandedSteps):
    """An array (:attr:`out`, of ``dtype``) filled a band at a time from ``rows``: a picture
    converted for a model before the job sends it, say."""

    def __init__(self, shape: tuple[int, ...], dtype, rows: Rows):
        super().__init__(shape[0], shape[1], rows)
        self.out = np.empty(shape, dtype)

    def _write(self, band: np.ndarray, start: int) -> None:
        self.out[start : start + len(band)] = band

    def _close(self) -> None:
        pass
