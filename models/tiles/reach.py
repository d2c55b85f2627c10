"""How far a model really reaches: a one-pixel probe on a fixed natural image, kept per model content.

The graph's receptive radius says how far an output pixel *can* see; for a deep net it is far
more than it *does* see in practice (RRDBNet x4plus: 349 px from the graph, while a trained file's
output moves by less than a tenth of a level past ~64 px). A flat grey probe reads far less than a
trained file reaches on an image, and the job's own image made the figure depend on whichever image
came first (56 px on a photo, 84 px on a generated one), so the probe is one fixed natural-looking
image (models/tiles/probe_image.py): one pixel at its centre is changed by half the range and the
farthest output pixel (in input pixels, Chebyshev distance) that moved by more than REACH_LEVELS
8-bit levels is the reach. 2 levels read the same on a photo and a generated image, but its
overlap (72 px) left seams of 8.8 levels on trained x4plus (96x448, 400 px tiles); at 0.25 levels
the probe reads farther, and the overlap that covers it holds the bound on one seam and on a 2x2
grid (tests/test_trained_seams.py).

The figure is kept per file content in the models folder's cache folder (models/tiles/reach_cache.py),
so a model is probed once, wherever its file lies.
"""

from __future__ import annotations

import numpy as np

from . import reach_cache
from .probe_image import natural_image

REACH_LEVELS = 0.25
"""An output change (8-bit levels) below which a pixel counts as unmoved: the threshold whose overlap
holds the seam bound (2 levels did not: see the module's docstring)."""
PROBE_REACH = 96  # the probe's half side: a reach at or past it is reported as None
PROBE_SEED = 7
PROBE_ID = f"natural_image({2 * PROBE_REACH + 1}, seed {PROBE_SEED})"
RULES = {"threshold_levels": REACH_LEVELS, "probe": PROBE_ID}


def probe_image() -> np.ndarray:
    side = 2 * PROBE_REACH + 1
    return natural_image(side, side, seed=PROBE_SEED)


def valid_reach(value) -> bool:
    """A stored reach a probe can have read: pixels in [1, PROBE_REACH), or None (past the probe).
    0 is no deep net's reach (a seam plan on it would promise what it cannot hold)."""
    if value is None:
        return True
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value < PROBE_REACH


def probe_crop(image: np.ndarray, half: int = PROBE_REACH) -> np.ndarray:
    """The centre (2 * half + 1)^2 crop of an HxWxC image, mirrored where the image is smaller."""
    side = 2 * half + 1
    height, width = image.shape[:2]
    rows = _mirrored(height // 2 - half, side, height)
    cols = _mirrored(width // 2 - half, side, width)
    return np.ascontiguousarray(image[np.ix_(rows, cols)], np.float32)


def _mirrored(start: int, count: int, size: int) -> np.ndarray:
    index = np.arange(start, start + count)
    if size == 1:
        return np.zeros_like(index)
    period = 2 * (size - 1)
    index = np.mod(index, period)
    return np.where(index >= size, period - index, index)


def measure_reach(infer, crop: np.ndarray, *, threshold_levels: float = REACH_LEVELS) -> int | None:
    """The reach in input pixels: `infer(HxWxC float32) -> (H*s)x(W*s)xC`, run on `crop` and on
    `crop` with its centre pixel moved by half the range; None when the change still shows at the
    crop's edge (the model reaches farther than the crop can tell)."""
    side_h, side_w = crop.shape[:2]
    cy, cx = side_h // 2, side_w // 2
    bumped = crop.copy()
    centre = bumped[cy, cx]
    bumped[cy, cx] = np.where(centre > 0.5, centre - 0.5, centre + 0.5)
    before, after = infer(crop), infer(bumped)
    scale = before.shape[0] // side_h
    moved = np.abs(after - before).max(axis=2) * 255.0 > threshold_levels
    found = np.argwhere(moved)
    if found.size == 0:
        return 0
    reach = int(max(np.abs(found[:, 0] // scale - cy).max(), np.abs(found[:, 1] // scale - cx).max()))
    return None if reach >= min(cy, cx, side_h - 1 - cy, side_w - 1 - cx) else reach


def reach_for(model_path, infer) -> tuple[int | None, list[str]]:
    """(the reach of this model file's content, notes to pass on): the cached figure when one that
    holds up is there, else measured now on the fixed probe and kept."""
    digest = reach_cache.content_hash(model_path)
    known, reach, note = reach_cache.cached(digest, RULES, valid_reach)
    if not known:
        reach = measure_reach(infer, probe_image())
        reach_cache.remember(digest, reach, RULES)
    return reach, [note] if note else []


def cached_reach(model_path) -> tuple[bool, int | None]:
    """(known, reach) without measuring: what a probe of this content measured (reach None: past
    PROBE_REACH). A bad record reads as unknown (reach_for says so when it measures again)."""
    known, reach, _note = reach_cache.cached(
        reach_cache.content_hash(model_path), RULES, valid_reach, say=False
    )
    return known, reach
