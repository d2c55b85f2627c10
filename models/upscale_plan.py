"""How an upscale job cuts its image: the overlap (from the model's receptive radius) and the
tile size (deterministic: the same image, model and settings give the same plan, whatever memory
is free; memory pressure is met by the out-of-memory split, which with an overlap at least the
radius does not change a single pixel).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .receptive import GLOBAL, ReceptiveField, graph_receptive_field
from .tiling import auto_tile_size, estimate_bytes_per_pixel, tile_floor

AUTO_OVERLAP = -1  # the artist's "Overlap -1": the model's receptive radius
GLOBAL_OVERLAP = 32  # context for a model that sees the whole image, when it must be tiled
PROBE_RADIUS = 48  # an impulse probe sees this far; a model reaching past it counts as global
AUTO_WINDOW_CPU = 2048  # largest auto window (input pixels): one window for most images
AUTO_WINDOW_GPU = 1024  # CUDA's out-of-memory error is cheap and splits the plan


@dataclass
class OverlapPlan:
    overlap: int
    radius: int | None  # input pixels; None when the receptive field is global
    how: str  # "graph", "probe", "catalog"
    exact: bool  # tiles give exactly one whole-image run's pixels
    warnings: list[str] = field(default_factory=list)
    proven: bool = False  # the graph walk proved the radius; a probe's is measured, not proven

    def covers(self, overlap: int) -> bool:
        """Tiles with this overlap are exact: only a proven radius can say so."""
        return self.proven and self.radius is not None and overlap >= self.radius


def _round_up(value: int, multiple: int) -> int:
    return -(-int(value) // multiple) * multiple if multiple > 1 else int(value)


def receptive_field(model_path, model_overlap, probe) -> ReceptiveField:
    """The catalog's figure when it has one, else the graph's, else the probe's. The catalog's
    figure is proven only when the graph walk reads a radius it covers; a probe's never is."""
    found = graph_receptive_field(model_path)
    if model_overlap is not None:
        covered = found.radius is not None and not found.is_global and found.radius <= int(model_overlap)
        gave_up = found.detail if found.radius is None else ""
        return ReceptiveField(int(model_overlap), "catalog", gave_up, found.scale, proven=covered)
    if found.radius is None and probe is not None:
        radius = probe()
        return ReceptiveField(GLOBAL if radius is None else radius, "probe", found.detail)
    return found


def plan_overlap(name: str, field_: ReceptiveField, requested: int | None, multiple: int = 1) -> OverlapPlan:
    """The overlap to run with, and what the artist should be told about it."""
    warnings: list[str] = []
    if field_.radius is None:  # no probe possible: keep the old default and say so
        radius, global_ = None, False
    else:
        global_ = field_.is_global
        radius = None if global_ else int(field_.radius)
    if requested is None or requested == AUTO_OVERLAP:
        overlap = _round_up(radius, multiple) if radius is not None else GLOBAL_OVERLAP
    else:
        overlap = int(requested)
        if overlap < 0:
            raise ValueError(f"overlap must be >= 0 ({AUTO_OVERLAP}: the model's receptive radius), got {overlap}")
        if radius is not None and overlap < radius:
            warnings.append(
                f"Overlap {overlap} px is below {name}'s receptive radius ({radius} px): with more than "
                "one tile the result is not exact; pixels near tile seams can differ from one whole-image run."
            )
    if global_:
        where = f" ({field_.detail})" if field_.detail else ""
        warnings.append(
            f"{name} sees the whole image{where}: it cannot be tiled exactly; results with more than "
            "one tile differ from one whole-image run."
        )
    elif field_.radius is None:
        warnings.append(
            f"{name}'s receptive radius is unknown ({field_.detail}); using a {overlap} px overlap."
        )
    elif not field_.proven and radius is not None and overlap >= radius:
        source = "measured by an impulse probe" if field_.how == "probe" else "given by its catalog entry"
        why = f" (the graph walk gave up at {field_.detail})" if field_.detail else ""
        warnings.append(
            f"{name}'s receptive radius ({radius} px) is {source}, not proven from its "
            f"graph{why}: with more than one tile the result is not exact; pixels near tile seams can "
            "differ slightly from one whole-image run."
        )
    plan = OverlapPlan(overlap, radius, field_.how, False, warnings, proven=field_.proven)
    plan.exact = plan.covers(overlap)
    return plan


def impulse_probe(infer, *, scale: int | None, channels: int = 3, fixed=None) -> int | None:
    """Measure the radius once: how far a change of one input pixel reaches in the output.

    `infer(window HxWxC float32) -> (H*s)x(W*s)xC`. None when it reaches the window's edge
    (global, or beyond PROBE_RADIUS).
    """
    side = fixed[0] if fixed else 2 * PROBE_RADIUS + 1
    width = fixed[1] if fixed else side
    base = np.full((side, width, channels), 0.5, np.float32)
    cy, cx = side // 2, width // 2
    bumped = base.copy()
    bumped[cy, cx] += 0.25
    before, after = infer(base), infer(bumped)
    s = scale or before.shape[0] // side
    changed = np.argwhere(np.abs(after - before).max(axis=2) > 0)
    if changed.size == 0:
        return 0
    ys, xs = changed[:, 0] // s, changed[:, 1] // s
    reach = int(max(np.abs(ys - cy).max(), np.abs(xs - cx).max()))
    edge = min(cy, cx, side - 1 - cy, width - 1 - cx)
    return None if reach >= edge else reach


def auto_tile(handle, scale, dtype, overlap: int, budget: int | None) -> int:
    """The auto window side: from the caller's budget if given, else a fixed size per device kind,
    never from the memory free at call time (that made the same job's plan change run to run)."""
    if budget is not None:
        cost = estimate_bytes_per_pixel(scale or 4, element_size=np.dtype(dtype).itemsize)
        return auto_tile_size(cost, budget_bytes=budget, overlap=overlap)
    window = AUTO_WINDOW_GPU if handle.gpu_device_id is not None else AUTO_WINDOW_CPU
    return max(window, tile_floor(overlap), 4 * overlap)  # the overlap never dominates a window
