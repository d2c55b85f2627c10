"""What a job that stops by a cancel or an error still holds while its exception unwinds: the
arrays its frames reference (the unfinished frame's output canvas, its copies of the input). Its
memory report is made then (operation.py), so it says them apart from what the runtime kept."""

from __future__ import annotations

import numpy as np


def unfinished_bytes(tb) -> int:
    """Bytes of the arrays that the frames a cancel or an error is leaving still reference (the
    unfinished frame's output canvas, its float copy of the input): alive while the report is made,
    freed once the exception has unwound. The frame of the ``with`` itself is left out, and with it
    whatever the caller handed in (the input images, made before the job)."""
    if tb is None:
        return 0
    outer = {id(_owner(a)) for a in _arrays(tb.tb_frame.f_locals)}
    seen: dict[int, int] = {}
    tb = tb.tb_next
    while tb is not None:
        for array in _arrays(tb.tb_frame.f_locals):
            root = _owner(array)
            if id(root) not in outer:
                seen[id(root)] = int(root.nbytes)
        tb = tb.tb_next
    return sum(seen.values())


def _arrays(local_values: dict):
    """A frame's arrays: its locals, and the array attributes of the objects it works on (a
    tiling loop's ``self`` holds the canvas)."""
    for value in local_values.values():
        if isinstance(value, np.ndarray):
            yield value
        elif not isinstance(value, type) and isinstance(getattr(value, "__dict__", None), dict):
            yield from (v for v in vars(value).values() if isinstance(v, np.ndarray))


def _owner(array: np.ndarray) -> np.ndarray:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array
