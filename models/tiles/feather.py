"""Feathered seams for tiles whose overlap is below the model's receptive radius (numpy only).

A deep net (RRDBNet: 349 px) cannot be tiled exactly at a sane cost, so its tiles get a bounded
overlap and are blended instead of cropped: across every boundary between two owned regions a
band of `2 * feather` input pixels is a linear ramp, the tile before the boundary weighing
`1 - r` and the tile after it `r`, the same `r` on both sides. Weights are separable (row ramp
times column ramp), so they add up to 1 at every output pixel, corners and the T-junctions a split
re-plan makes included, and no weight image is needed: each tile adds its weighted pixels into a
zeroed result. Needs `feather <= overlap` (the band lies inside both windows) and owned spans of
at least `2 * feather` (the ramps of one tile never meet): `feather_floor` gives the tile size
that guarantees it (balanced cuts are at least half the core).
"""

from __future__ import annotations

import math

import numpy as np


def feather_floor(overlap: int, feather: int) -> int:
    """The smallest window whose core (window - 2 * overlap) keeps every owned span >= 2 * feather."""
    return 2 * int(overlap) + 4 * int(feather) + 8


def blend_span(start: int, stop: int, size: int, feather: int) -> tuple[int, int]:
    """The pasted span along one axis: the owned span grown by `feather` where a neighbour is."""
    return (start - feather if start > 0 else start), (stop + feather if stop < size else stop)


def ramp(start: int, stop: int, size: int, feather: int, scale: int) -> np.ndarray:
    """Weights (output pixels) over `blend_span`: rising across the band at `start`, falling
    across the band at `stop`, 1 between; no band at the image border."""
    begin, end = blend_span(start, stop, size, feather)
    position = np.arange(begin * scale, end * scale, dtype=np.float64) + 0.5
    weight = np.ones(position.shape, np.float64)
    width = 2 * feather * scale
    if start > 0:
        rising = (position - (start - feather) * scale) / width
        weight = np.minimum(weight, np.clip(rising, 0.0, 1.0))
    if stop < size:
        falling = 1.0 - np.clip((position - (stop - feather) * scale) / width, 0.0, 1.0)
        weight = np.minimum(weight, falling)
    return weight.astype(np.float32)


def blend_planes(target, source, row_w, col_w, clip, *, channels_first: bool, rows: int = 32) -> bool:
    """target (HxWxC) += source (CxHxW when `channels_first`, else HxWxC) weighted by row_w x
    col_w, each block clipped to `clip` first (a weighted mean of clipped values stays in range).
    False at the first block holding a NaN or an infinity (the rest left unpasted)."""
    for y in range(0, target.shape[0], rows):
        weights = row_w[y : y + rows, None] * col_w[None, :]
        for channel in range(target.shape[2]):
            part = source[channel, y : y + rows] if channels_first else source[y : y + rows, :, channel]
            block = np.array(part, np.float32)
            if not limit_block(block, clip):
                return False
            block *= weights
            target[y : y + rows, :, channel] += block
    return True


def limit_block(block: np.ndarray, clip) -> bool:
    """Clip `block` in place when a value lies outside `clip`; False when one is NaN or infinite.
    Its min and max answer both (NaN propagates through them, an infinity is one of them), so an
    in-range block, the usual case, is read twice and never rewritten, and no mask is allocated."""
    if block.size == 0:
        return True
    low, high = float(block.min()), float(block.max())
    if not (math.isfinite(low) and math.isfinite(high)):
        return False
    if clip is not None and (low < clip[0] or high > clip[1]):
        np.clip(block, clip[0], clip[1], out=block)
    return True
