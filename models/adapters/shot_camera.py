"""One camera for a MoGe-2 shot (bpy-free): a focal length for every frame, then each frame's
z-shift solved for that focal.

MoGe-2 recovers focal and shift per frame (models/adapters/moge2_solver.py), so a locked-off shot's field
of view jitters. Here the focal is the median of the frames' own fits (robust to the few frames
whose geometry is ambiguous), or a field of view the artist gives; each frame then only solves
its shift (models/adapters/moge2_solver.py's shift_for_focal). Focals are carried as ``fx / image width`` (``focal_width``), which does not depend
on the size the model ran at.
"""

from __future__ import annotations

import math
import statistics

from ...runtime.errors import LeanImageError

PER_FRAME, SHOT = "per-frame", "shot"
MODES = (PER_FRAME, SHOT)
FOV_LIMITS_DEG = (1.0, 170.0)


def focal_width_from_fov(fov_x_deg: float) -> float:
    return 0.5 / math.tan(math.radians(fov_x_deg) / 2.0)


def fov_from_focal_width(focal_width: float) -> float:
    return math.degrees(2.0 * math.atan(0.5 / focal_width))


def moge_focal(focal_width: float, model_h: int, model_w: int) -> float:
    """The focal in MoGe's convention (relative to half the image diagonal)."""
    return focal_width * model_w / (math.hypot(model_h, model_w) / 2.0)


def shot_focal_width(focal_widths) -> float:
    """One focal for the shot: the median of the frames' own fits."""
    values = [float(v) for v in focal_widths if math.isfinite(v) and v > 0]
    if not values:
        raise LeanImageError("No frame of the shot gave a camera, so there is no shot focal; nothing was written.")
    return statistics.median(values)


class ShotCamera:
    """The camera choice of one sequence: per frame, one fitted for the shot, or a given FOV."""

    def __init__(self, mode: str = PER_FRAME, fov_deg: float | None = None):
        if mode not in MODES:
            raise LeanImageError(f"Camera mode {mode!r} is not known: give one of {', '.join(MODES)}.")
        if fov_deg is not None and not (math.isfinite(fov_deg) and FOV_LIMITS_DEG[0] <= fov_deg <= FOV_LIMITS_DEG[1]):
            raise LeanImageError(
                f"Field of view {fov_deg:g} is not usable: give degrees between {FOV_LIMITS_DEG[0]:g} and {FOV_LIMITS_DEG[1]:g}."
            )
        self.mode = mode
        self.fov_deg = fov_deg
        self.focal_width = focal_width_from_fov(fov_deg) if fov_deg is not None else None
        self._recorded: list[float] = []

    @property
    def changes_output(self) -> bool:
        return self.mode == SHOT or self.fov_deg is not None

    @property
    def needs_first_pass(self) -> bool:
        return self.mode == SHOT and self.fov_deg is None

    def record(self, result) -> None:
        """Keeps one float of a frame's result: its own focal."""
        self._recorded.append(float(result.intrinsics[0][0]) / float(result.mask.shape[1]))

    def finish_first_pass(self) -> float:
        self.focal_width = shot_focal_width(self._recorded)
        return self.focal_width

    def adapter_kwargs(self) -> dict:
        return {"focal_width": self.focal_width} if self.focal_width is not None else {}

    def describe(self) -> str:
        source = f"median of {len(self._recorded)} frame(s)" if self._recorded else "given"
        return f"horizontal FOV {fov_from_focal_width(self.focal_width):.4g} deg ({source})"

    def as_dict(self) -> dict:
        spread = None
        if len(self._recorded) > 1:
            spread = [round(fov_from_focal_width(max(self._recorded)), 4), round(fov_from_focal_width(min(self._recorded)), 4)]
        return {
            "mode": self.mode if self.fov_deg is None else "fov",
            "fov_x_deg": round(fov_from_focal_width(self.focal_width), 6) if self.focal_width else None,
            "per_frame_fov_x_deg_range": spread,
        }
