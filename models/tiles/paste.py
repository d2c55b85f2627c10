"""Pasting a tile's result into the image: cropped at its owned region (exact tiling), or added
with its feathered weights (models/tiles/feather.py). Numpy only; split from models/tiles/tiling.py."""

from __future__ import annotations

import os
import threading

import numpy as np

from .feather import blend_planes, blend_span, limit_block, ramp


def paste(output, result, tile, scale: int, nchw: bool, clip) -> bool:
    """The tile's owned part into `output`, cropped (transposed from NCHW in the same pass)."""
    oy, ox = (tile.y0 - tile.wy0) * scale, (tile.x0 - tile.wx0) * scale
    oh, ow = (tile.y1 - tile.y0) * scale, (tile.x1 - tile.x0) * scale
    target = output[tile.y0 * scale : tile.y1 * scale, tile.x0 * scale : tile.x1 * scale]
    if nchw:
        return _paste_in_bands(target, result[0, :, oy : oy + oh, ox : ox + ow], clip)
    target[...] = result[oy : oy + oh, ox : ox + ow]
    return limit_block(target, clip)


def blend(output, result, tile, scale: int, feather: int, nchw: bool, clip) -> bool:
    """The tile's owned part grown by `feather` towards its neighbours, added with its weights."""
    height, width = output.shape[0] // scale, output.shape[1] // scale
    by0, by1 = blend_span(tile.y0, tile.y1, height, feather)
    bx0, bx1 = blend_span(tile.x0, tile.x1, width, feather)
    oy, ox = (by0 - tile.wy0) * scale, (bx0 - tile.wx0) * scale
    oh, ow = (by1 - by0) * scale, (bx1 - bx0) * scale
    source = result[0, :, oy : oy + oh, ox : ox + ow] if nchw else result[oy : oy + oh, ox : ox + ow]
    rows = ramp(tile.y0, tile.y1, height, feather, scale)
    cols = ramp(tile.x0, tile.x1, width, feather, scale)
    target = output[by0 * scale : by1 * scale, bx0 * scale : bx1 * scale]
    return blend_planes(target, source, rows, cols, clip, channels_first=nchw)


PASTE_BAND_ROWS = 256  # rows per worker below which one thread pastes alone: too small to share
_paste_pool = None
_paste_pool_lock = threading.Lock()


def _paste_in_bands(target: np.ndarray, planes: np.ndarray, clip) -> bool:
    """`_paste_planes` over bands of rows on a few long-lived threads (numpy releases the GIL
    while it copies). The transposing paste is the largest cost of a job outside onnxruntime (a
    1024 px image at x4 is a 200 MB result, its pages first touched here); measured here, two
    threads paste it in ~0.55x the time of one."""
    workers = min(_paste_workers(), planes.shape[1] // PASTE_BAND_ROWS)
    if workers < 2:
        return _paste_planes(target, planes, clip)
    rows = planes.shape[1]
    cuts = [k * rows // workers // 32 * 32 for k in range(workers)] + [rows]
    bands = [
        _pool().submit(_paste_planes, target[a:b], planes[:, a:b], clip) for a, b in zip(cuts[:-1], cuts[1:], strict=True)
    ]
    return all([band.result() for band in bands])  # a list: wait for every band, even after a False


def _paste_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))  # copies are memory-bound: more threads gain nothing


def _pool():
    """One pool for the process, started on first use: a thread per job would make the C
    allocator open new per-thread arenas job after job (see runtime/measure/timeline.py)."""
    global _paste_pool
    with _paste_pool_lock:
        if _paste_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _paste_pool = ThreadPoolExecutor(_paste_workers(), thread_name_prefix="lean-image-ai-paste")
        return _paste_pool


def _paste_planes(target: np.ndarray, planes: np.ndarray, clip, rows: int = 32) -> bool:
    """target (HxWxC) = planes (CxHxW) transposed, clipped: one plane at a time (each read is
    contiguous) in blocks of rows that stay in cache for the check and the clip. About 7x faster
    here than np.clip on the transposed view, which walks the planes with a large stride.
    False (and the rest left unpasted) at the first block holding a NaN or an infinity."""
    for y in range(0, planes.shape[1], rows):
        block = target[y : y + rows]
        for channel in range(planes.shape[0]):
            block[:, :, channel] = planes[channel, y : y + rows]
        if not limit_block(block, clip):
            return False
    return True
