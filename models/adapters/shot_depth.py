"""Depth that does not flicker over a shot (bpy-free): one value range for every frame, and an
optional frame-to-frame alignment of relative depth.

Why: an 8/16-bit depth file maps each frame's own min..max to 0..1, so one wall changes grey
level from frame to frame; and a relative-depth model's raw scale and shift drift per frame, so
even float EXRs flicker. Three range modes:

- ``per-frame``: each frame's own min..max (the default, as before);
- ``auto-shot``: two passes over the shot. The first keeps only each frame's robust range (1st to
  99th percentile, two floats a frame, never the frame), the second writes every frame with the
  widest of them, so memory stays flat whatever the shot length;
- ``A:B``: a range the artist gives (also what farm shards share).

Alignment (``align``): each frame's depth is mapped by a scale and shift onto the previous
*aligned* frame, fitted by least squares on the pixels that agree: fit, drop the worst
``TRIM`` of the residuals (what moved), refit. Only the previous aligned frame is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...runtime.errors import LeanImageError
from ..result_images import ImageProduct

PER_FRAME, AUTO_SHOT, GIVEN = "per-frame", "auto-shot", "given"
MODES = (PER_FRAME, AUTO_SHOT)  # plus "A:B"
PERCENTILES = (1.0, 99.0)
TRIM = 0.2  # share of the worst residuals dropped before each refit (moving things, edges)
REFITS = 3
FIT_SAMPLES = 65536  # pixels the fit looks at; a regular subsample, deterministic


@dataclass(frozen=True)
class DepthRangeChoice:
    mode: str = PER_FRAME
    given: tuple[float, float] | None = None

    @property
    def label(self) -> str:
        return f"{self.given[0]:g}:{self.given[1]:g}" if self.mode == GIVEN else self.mode


def parse_depth_range(text: str) -> DepthRangeChoice:
    """``per-frame``, ``auto-shot`` or ``A:B`` (A < B, finite numbers whose span fits float32: the
    depth is scaled in float32, where a wider span is infinite and every pixel would come out black)."""
    value = (PER_FRAME if text is None else text).strip().lower()
    if not value:  # an empty value is a slip (an unset variable in a farm script), not a choice
        raise LeanImageError("Depth range is empty: give per-frame, auto-shot, or two numbers A:B, e.g. 0.5:40.")
    if value in MODES:
        return DepthRangeChoice(value)
    parts = value.split(":")
    try:
        low, high = (float(p) for p in parts) if len(parts) == 2 else (math.nan, math.nan)
    except ValueError:
        low = high = math.nan
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise LeanImageError(
            f"Depth range {text!r} is not understood: give per-frame, auto-shot, or two numbers "
            "A:B with A < B (the depths that become black and white), e.g. 0.5:40."
        )
    if not _fits_float32(low, high):
        raise LeanImageError(
            f"Depth range {text!r} spans more than 32-bit float depth can hold (or its ends are equal in it): "
            f"give two numbers A:B whose difference is at most {float(np.finfo(np.float32).max):.3g}, e.g. 0.5:40."
        )
    return DepthRangeChoice(GIVEN, (low, high))


def _fits_float32(low: float, high: float) -> bool:
    with np.errstate(over="ignore"):
        span = np.float32(high) - np.float32(low)
    return bool(np.isfinite(span) and span > 0)


def robust_range(depth: np.ndarray, percentiles: tuple[float, float] = PERCENTILES) -> tuple[float, float]:
    """The 1st..99th percentile of the finite values: a few stray pixels do not set the range."""
    values = np.asarray(depth, np.float32)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return (0.0, 0.0)
    low, high = np.percentile(values, percentiles)
    return (float(low), float(high))


def _samples(shape: tuple[int, ...]) -> tuple[slice, slice]:
    step = max(1, int(math.sqrt(shape[0] * shape[1] / FIT_SAMPLES)))
    return (slice(step // 2, None, step), slice(step // 2, None, step))


def fit_scale_shift(reference: np.ndarray, depth: np.ndarray, *, trim: float = TRIM, refits: int = REFITS):
    """(scale, shift) with ``scale * depth + shift ~ reference`` on the pixels that agree.

    Least squares on a regular subsample, then ``refits`` times: drop the ``trim`` share of the
    largest residuals and fit again on the rest. None when no stable fit exists (a flat frame,
    too few finite pixels, or a non-positive scale, which would turn depth inside out)."""
    if reference.shape != depth.shape:
        raise ValueError(f"frames differ in size: {reference.shape} and {depth.shape}")
    where = _samples(depth.shape)
    x = np.asarray(depth[where], np.float64).ravel()
    y = np.asarray(reference[where], np.float64).ravel()
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size < 16:
        return None
    for round_ in range(refits + 1):
        x_mean, y_mean = x.mean(), y.mean()
        variance = float(np.mean((x - x_mean) ** 2))
        if not variance > 1e-20 * max(1.0, x_mean * x_mean):
            return None
        scale = float(np.mean((x - x_mean) * (y - y_mean))) / variance
        shift = float(y_mean - scale * x_mean)
        if round_ == refits:
            break
        residual = np.abs(scale * x + shift - y)
        kept = residual <= np.quantile(residual, 1.0 - trim)
        if kept.sum() < 16:
            break
        x, y = x[kept], y[kept]
    if not (math.isfinite(scale) and math.isfinite(shift) and scale > 0):
        return None
    return scale, shift


class DepthAligner:
    """Maps each frame onto the previous aligned one; keeps that one frame only."""

    def __init__(self):
        self._previous: np.ndarray | None = None
        self.last_fit: tuple[float, float] | None = None

    def __call__(self, depth: np.ndarray) -> tuple[np.ndarray, list[str]]:
        depth = np.asarray(depth, np.float32)
        notes = []
        if self._previous is not None and self._previous.shape == depth.shape:
            fit = fit_scale_shift(self._previous, depth)
            if fit is None:
                notes.append("depth alignment found no stable scale and shift; this frame is kept as the model gave it")
            else:
                depth = (depth * np.float32(fit[0]) + np.float32(fit[1])).astype(np.float32)
            self.last_fit = fit
        elif self._previous is not None:
            notes.append("frame size changed: depth alignment starts again from this frame")
        self._previous = depth
        return depth, notes


@dataclass
class ShotImageProduct(ImageProduct):
    """An image product with text metadata for the file (PNG text chunk, EXR header attribute)."""

    metadata: dict[str, str] = field(default_factory=dict)


class ShotDepth:
    """What a sequence's depth frames go through before they are written, pass by pass.

    ``record`` (first pass of auto-shot) keeps two floats per frame; ``product`` (the writing
    pass) aligns, then normalises with the range of the chosen mode."""

    def __init__(self, choice: DepthRangeChoice, *, align: bool = False):
        self.choice = choice
        self.align = align
        self._lows: list[float] = []
        self._highs: list[float] = []
        self.shot_range: tuple[float, float] | None = choice.given
        self._aligner = DepthAligner() if align else None

    @property
    def needs_first_pass(self) -> bool:
        return self.choice.mode == AUTO_SHOT

    @property
    def changes_output(self) -> bool:
        return self.align or self.choice.mode != PER_FRAME

    def start_pass(self) -> None:
        """The chain of aligned frames begins again (each pass sees the same frames)."""
        self._aligner = DepthAligner() if self.align else None

    def _aligned(self, depth) -> tuple[np.ndarray, list[str]]:
        if self._aligner is None:
            return np.asarray(depth, np.float32), []
        return self._aligner(depth)

    def record(self, depth) -> None:
        aligned, _ = self._aligned(depth)
        low, high = robust_range(aligned)
        self._lows.append(low)
        self._highs.append(high)

    def finish_first_pass(self) -> tuple[float, float]:
        if not self._lows:
            raise LeanImageError("No frame gave a depth map, so there is no shot range; nothing was written.")
        low, high = min(self._lows), max(self._highs)
        if not high > low:
            high = low + 1.0  # a flat shot: every frame writes black rather than dividing by zero
        self.shot_range = (low, high)
        self.start_pass()
        return self.shot_range

    @property
    def frames_recorded(self) -> int:
        return len(self._lows)

    def product(self, depth, suffix: str, float_suffixes) -> tuple[ShotImageProduct, list[str]]:
        """The image to write for one frame's depth, and notes for the report."""
        depth, notes = self._aligned(depth)
        if self.shot_range is not None:
            low, high = self.shot_range
        else:  # per-frame: as image_product, each frame's own min..max
            low, high = float(np.min(depth)), float(np.max(depth))
        metadata = {
            "lean_image_ai:depth_range": f"{low!r} {high!r}",
            "lean_image_ai:depth_range_mode": self.choice.mode,
            "lean_image_ai:depth_aligned": "yes" if self.align else "no",
        }
        if suffix.lower() in float_suffixes:
            return ShotImageProduct(depth, is_data=True, metadata=metadata), notes
        span = high - low
        normalised = (depth - np.float32(low)) / np.float32(span) if span > 0 else np.zeros_like(depth)
        pixels = np.clip(normalised, 0.0, 1.0).astype(np.float32)
        return ShotImageProduct(pixels, is_data=True, value_range=(low, high), metadata=metadata), notes

    def as_dict(self) -> dict:
        """For the job's JSON line."""
        return {
            "depth_range": {
                "mode": self.choice.mode,
                "range": list(self.shot_range) if self.shot_range is not None else None,
            },
            "align_depth": self.align,
        }
