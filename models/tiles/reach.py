"""How far a model really reaches: a one-pixel probe on an image crop, cached beside the model file.

The graph's receptive radius says how far an output pixel *can* see; for a deep net it is far
more than it *does* see in practice (RRDBNet x4plus: 349 px from the graph, while a trained file's
output moves by less than a tenth of a level past ~64 px). A seeded export's probe on a flat
grey window reads far less than the trained file on an image, so the probe runs on the job's own
image: one pixel of a crop is changed by half the range and the farthest output pixel (in input
pixels, Chebyshev distance) that moved by more than REACH_LEVELS 8-bit levels is the reach.
Tiles whose overlap covers it and which are feathered differ from one whole-image run by about
a level at most (bench/seams.py measures it).

The figure is kept in `<model file>.reach.json` (beside the installer's `.verified.json`), valid
while the file's size and mtime match, so a model file is probed once. A folder that cannot be
written keeps it for this process only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..files import write_text

REACH_LEVELS = 0.25
"""An output change (8-bit levels) below which a pixel counts as unmoved. The overlap that covers
this reach keeps tiles within ~1 level of one whole-image run on trained x4plus (bench/seams.py)."""
PROBE_REACH = 128  # the crop's half side: a reach at or past it is reported as None
REACH_SUFFIX = ".reach.json"
_remembered: dict[tuple[str, int, int], int | None] = {}


def _key(model_path) -> tuple[str, int, int]:
    path = Path(model_path).resolve()
    st = path.stat()
    return str(path), st.st_size, st.st_mtime_ns


def sidecar(model_path) -> Path:
    path = Path(model_path)
    return path.with_name(path.name + REACH_SUFFIX)


def cached_reach(model_path) -> tuple[bool, int | None]:
    """(known, reach): what a probe of this very file (size, mtime) measured; reach None: past
    PROBE_REACH."""
    key = _key(model_path)
    if key in _remembered:
        return True, _remembered[key]
    try:
        record = json.loads(sidecar(model_path).read_text())
    except (OSError, ValueError):
        return False, None
    if not isinstance(record, dict) or [record.get("size"), record.get("mtime_ns")] != list(key[1:]):
        return False, None
    if record.get("threshold_levels") != REACH_LEVELS or record.get("probe_reach") != PROBE_REACH:
        return False, None  # measured by other rules
    reach = record.get("reach")
    return True, (int(reach) if isinstance(reach, int) else None)


def remember_reach(model_path, reach: int | None) -> None:
    key = _key(model_path)
    _remembered[key] = reach
    record = {
        "size": key[1], "mtime_ns": key[2], "reach": reach, "threshold_levels": REACH_LEVELS,
        "probe_reach": PROBE_REACH, "how": "one-pixel probe on a crop of the first image tiled",
    }  # fmt: skip
    try:
        write_text(sidecar(model_path), json.dumps(record, indent=1) + "\n")
    except OSError:
        pass  # a read-only folder: this process keeps the figure (_remembered)


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


def reach_for(model_path, infer, image: np.ndarray) -> int | None:
    """The cached reach of this model file, else measured now on `image`'s centre and kept."""
    known, reach = cached_reach(model_path)
    if not known:
        reach = measure_reach(infer, probe_crop(image))
        remember_reach(model_path, reach)
    return reach


def forget_in_process(model_path) -> None:
    """Drop what this process remembers of a file: the sidecar alone answers next (tests)."""
    _remembered.pop(_key(model_path), None)
