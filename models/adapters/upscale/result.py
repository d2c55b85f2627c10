"""What one upscaled frame says about itself: the image, the plan that ran, and how far its tiles
are from one whole-image run (exact, blended or cropped, and the bound when not exact)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class UpscaleResult:
    image: np.ndarray  # (H*scale) x (W*scale) x C float32, C = 4 when the source had alpha, else 3
    scale: int
    tile_size_used: int  # the largest window side that actually ran (input pixels, overlap included)
    overlap: int = 0  # context pixels around each tile
    receptive_radius: int | None = None  # input pixels; None: the model sees the whole image
    exact: bool = True  # tiles give exactly the pixels of one whole-image run
    warnings: list[str] = field(default_factory=list)
    feather: int = 0  # > 0: tile seams were blended over 2 * feather px (not bit-exact)
    input_kind: str = "8-bit"  # the source's samples: "8-bit", "16-bit" or "float"
    clipped: str | None = None  # what of the source was clipped for the model, in words (None: nothing)
    bound: str = "not exact"  # how far from one whole-image run, when not exact (plan.py OverlapPlan)
    plan: dict | None = None  # window, overlap, windows, compute (stages.py FramePlan.as_dict)

    @property
    def seams(self) -> str:
        """How the tiles were joined, for reports and JSON: "exact" only where tiles are bit-identical."""
        if self.exact:
            return "exact"
        return f"tiles blended; {self.bound}" if self.feather else f"tiles cropped; {self.bound}"


def frame_result(planned, image: np.ndarray, tiled, fed, shown) -> UpscaleResult:
    """The frame's result from the job's overlap plan (plan.py OverlapPlan), the tiler's run, what
    the frame fed the model (frame_input.py ModelInput) and the plan as shown (stages.py FramePlan)."""
    warnings = fed.warnings
    exact = planned.exact or (tiled.tiles_run == 1 and not tiled.splits)
    if exact and not planned.exact:  # one window: no seam, so the plan's "not exact" is moot
        warnings = [w for w in warnings if w not in planned.warnings]
    return UpscaleResult(
        image,
        int(tiled.scale),
        int(max(tiled.window_ran)),
        overlap=planned.overlap,
        receptive_radius=planned.radius,
        exact=exact,
        warnings=warnings,
        feather=0 if tiled.tiles_run == 1 else planned.feather,
        input_kind=fed.kind,
        clipped=fed.clipped,
        bound=planned.bound,
        plan=shown.as_dict(),
    )
