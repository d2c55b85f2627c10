"""How an upscale job cuts its image: the overlap (from the model's receptive radius; for a deep
net, from how far it was measured to reach, once per model file: models/tiles/reach.py) and the
tile size (deterministic: the same image, model and settings give the same plan, whatever memory
is free; memory pressure is met by the out-of-memory split, which with an overlap at least the
radius does not change a single pixel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ....runtime.measure.budget import budget_for, working_estimate
from ...imaging import to_nchw
from ...tiles.reach import PROBE_REACH
from ...tiles.receptive import GLOBAL, ReceptiveField, graph_receptive_field
from ...tiles.tile_memory import BUDGET_FRACTION, FALLBACK_TILE, MAX_AUTO_TILE, tile_floor
from ...tiles.tile_plan import TilePlan

AUTO = "auto"  # a tile size chosen per frame from the model's measured working memory
AUTO_OVERLAP = -1  # the artist's "Overlap -1": the model's receptive radius
GLOBAL_OVERLAP = 32  # context for a model that sees the whole image, when it must be tiled
PROBE_RADIUS = 48  # an impulse probe sees this far; a model reaching past it counts as global
AUTO_WORKING_CPU = 2 << 30
"""Working memory one auto window may take on CPU: RealESRGAN_x4plus (~16 KB per input pixel)
then runs 1920x1080 in ~350 px windows and peaks under 4 GB; the compact x4 net (~0.9 KB/px)
in windows of up to MAX_AUTO_TILE."""
AUTO_WORKING_GPU = 4 << 30  # the same on CUDA (the weights and cuDNN's workspaces come on top)
MEASURE_WINDOW = 128  # side of the window a never-measured model is first run on, to measure it
SMALL_IMAGE = 2 * MEASURE_WINDOW  # frames up to this side run as one window without measuring
AUTO_WINDOW_STEP = 32
MAX_EXACT_RADIUS = 64
"""Largest receptive radius tiled exactly by default. Past it the overlap costs more than the
tile (RRDBNet, 349 px: a 2048 px window keeps a 1350 px core, and that window's working memory
is ~64 GB), so the overlap covers how far the model was measured to reach instead (its tiles
feathered), and the job says it is not exact."""
FEATHER_OVERLAP = 32
"""The least overlap of a deep net's tiles (input pixels), and the one used before its reach is
measured (a frame that runs as one window never measures it)."""
REACH_STEP = 16  # a measured reach is rounded up to this: noise in the probe rarely moves the plan
REACH_FEATHER = 8
"""A deep net's seams are blended over 2 * REACH_FEATHER px *outside* its measured reach (the
overlap is the reach plus this): every blended pixel keeps the context the reach asks for. A
feather of half the overlap (as before) blends in pixels with half the context, and on trained
x4plus that is worse than cropping (bench/seams.py)."""
SEAM_LEVELS = 2
"""What the job promises for a deep net's default plan: at most this many 8-bit levels from one
whole-image run. bench/seams.py measures it on trained Real-ESRGAN x4plus (tests/test_trained_seams.py
checks it), so the words the job prints are measured, not hoped."""
SEAM_MEASURED_ON = "trained Real-ESRGAN x4plus, bench/seams.py"
ROUNDING_LEVELS = 0.01
"""A covered but not bit-exact plan (a Resize by 0.75: animevideov3-x3) differs by fp32 rounding
only; bench/seams.py measures it on trained realesr-animevideov3-x3."""


@dataclass
class OverlapPlan:
    overlap: int
    radius: int | None  # input pixels; None when the receptive field is global
    how: str  # "graph", "probe", "catalog"
    exact: bool  # tiles give exactly one whole-image run's pixels
    warnings: list[str] = field(default_factory=list)
    feather: int = 0  # > 0: seams blended over 2 * feather px (models/tiles/feather.py), not cropped
    proven: bool = False  # the graph walk proved the radius; a probe's is measured, not proven
    bit_exact: bool = True  # covering the radius gives the same bits (receptive.ReceptiveField)
    reach: float | None = None  # how far a one-pixel change was measured to reach (math.inf: past the probe)
    needs_reach: bool = False  # a deep net on its default overlap: the job measures its reach first
    bound: str = "not exact"  # what the seams are, when not exact (UpscaleResult.seams)

    def covers(self, overlap: int) -> bool:
        """Tiles with this overlap are exact: only a proven radius can say so."""
        return self.proven and self.bit_exact and self.radius is not None and overlap >= self.radius


def _round_up(value: int, multiple: int) -> int:
    return -(-int(value) // multiple) * multiple if multiple > 1 else int(value)


def receptive_field(model_path, model_overlap, probe) -> ReceptiveField:
    """The catalog's figure when it has one, else the graph's, else the probe's. The catalog's
    figure is proven only when the graph walk reads a radius it covers; a probe's never is."""
    found = graph_receptive_field(model_path)
    if model_overlap is not None:
        covered = found.radius is not None and not found.is_global and found.radius <= int(model_overlap)
        gave_up = found.detail if found.radius is None else ""
        return ReceptiveField(
            int(model_overlap), "catalog", gave_up, found.scale, proven=covered, bit_exact=found.bit_exact
        )
    if found.radius is None and probe is not None:
        radius = probe()
        return ReceptiveField(GLOBAL if radius is None else radius, "probe", found.detail)
    return found


def reach_overlap(radius: int, reach: float | None, multiple: int = 1) -> tuple[int, int]:
    """A deep net's default (overlap, feather): its measured reach rounded up to REACH_STEP, plus
    REACH_FEATHER for the blend, at least FEATHER_OVERLAP, at most the radius; FEATHER_OVERLAP
    (half of it blended) while the reach is not measured (a one-window frame never measures it)."""
    if reach is None:
        return _round_up(min(FEATHER_OVERLAP, radius), multiple), FEATHER_OVERLAP // 2
    covered = _round_up(min(reach, PROBE_REACH), REACH_STEP)
    overlap = _round_up(min(max(FEATHER_OVERLAP, covered + REACH_FEATHER), radius), multiple)
    return overlap, min(REACH_FEATHER, overlap // 2)


def plan_overlap(
    name: str, field_: ReceptiveField, requested: int | None, multiple: int = 1, reach: float | None = None
) -> OverlapPlan:
    """The overlap to run with, and what the artist should be told about it. `reach`: how far a
    one-pixel change was measured to reach (models/tiles/reach.py), for a deep net's default."""
    global_ = field_.is_global  # no radius at all (no probe possible): the old default, said so
    radius = None if field_.radius is None or global_ else int(field_.radius)
    auto = requested is None or requested == AUTO_OVERLAP
    deep = auto and radius is not None and radius > MAX_EXACT_RADIUS
    if deep:
        overlap, feather, bound, warning = _deep_overlap(name, radius, reach, multiple)
        warnings = [warning]
    else:
        overlap, feather, bound = _plain_overlap(radius, requested, multiple), None, "not exact"
        warnings = [] if auto else _requested_overlap_warnings(name, overlap, radius)
    warning, bound = _field_warning(name, field_, radius, overlap, global_, bound)
    warnings += [warning] if warning else []
    plan = OverlapPlan(
        overlap, radius, field_.how, False, warnings, proven=field_.proven, bit_exact=field_.bit_exact,
        reach=reach, needs_reach=deep and reach is None, bound=bound,
    )  # fmt: skip
    plan.exact = plan.covers(overlap)
    if feather is None:
        # tiles that are not bit-identical are blended, whatever set the overlap (a seam's step becomes
        # a ramp), but for a covered radius: blending would mix in pixels with less context than it
        feather = 0 if plan.exact or (plan.proven and radius is not None and overlap >= radius) else overlap // 2
    plan.feather = feather
    return plan


def _deep_overlap(name: str, radius: int, reach: float | None, multiple: int) -> tuple[int, int, str, str]:
    """A deep net's (overlap, feather, bound, warning): blended seams, as far as a change reaches."""
    overlap, feather = reach_overlap(radius, reach, multiple)
    reached = "not measured yet" if reach is None else (
        f"past the {PROBE_REACH} px the probe sees" if math.isinf(reach) else f"{int(reach)} px")
    bound = "not exact"
    if reach is not None and not math.isinf(reach):
        bound = f"at most {SEAM_LEVELS} levels from one whole-image run (measured on {SEAM_MEASURED_ON})"
    warning = (
        f"Not exact: {name}'s receptive radius is {radius} px, too large to tile exactly at a sane cost; "
        f"tiles overlap {overlap} px (how far a one-pixel change reaches: {reached}) and are blended "
        f"across their seams: {bound} (Overlap set to the radius makes it exact, at that cost)."
    )
    return overlap, feather, bound, warning


def _plain_overlap(radius: int | None, requested: int | None, multiple: int) -> int:
    """The receptive radius (rounded up to `multiple`) on Auto, else the requested overlap."""
    if requested is None or requested == AUTO_OVERLAP:
        return _round_up(radius, multiple) if radius is not None else GLOBAL_OVERLAP
    return int(requested)


def _requested_overlap_warnings(name: str, overlap: int, radius: int | None) -> list[str]:
    if overlap < 0:
        raise ValueError(f"overlap must be >= 0 ({AUTO_OVERLAP}: the model's receptive radius), got {overlap}")
    if radius is not None and overlap < radius:
        return [
            f"Overlap {overlap} px is below {name}'s receptive radius ({radius} px): with more than "
            "one tile the result is not exact; tiles are blended across their seams, and pixels near "
            "them can differ from one whole-image run."
        ]
    return []


def _field_warning(name, field_: ReceptiveField, radius, overlap: int, global_: bool, bound: str):
    """(what the artist is told about the receptive field, or None; the seams' bound)."""
    if global_:
        where = f" ({field_.detail})" if field_.detail else ""
        return (
            f"{name} sees the whole image{where}: it cannot be tiled exactly; results with more than "
            "one tile differ from one whole-image run."
        ), bound
    if field_.radius is None:
        return f"{name}'s receptive radius is unknown ({field_.detail}); using a {overlap} px overlap.", bound
    covered = radius is not None and overlap >= radius
    if not field_.proven and covered:
        source = "measured by an impulse probe" if field_.how == "probe" else "given by its catalog entry"
        why = f" (the graph walk gave up at {field_.detail})" if field_.detail else ""
        return (
            f"{name}'s receptive radius ({radius} px) is {source}, not proven from its "
            f"graph{why}: with more than one tile the result is not exact; pixels near tile seams can "
            "differ slightly from one whole-image run."
        ), bound
    if not field_.bit_exact and covered:
        bound = f"at most {ROUNDING_LEVELS} levels from one whole-image run (fp32 rounding of a resize by a " \
            "factor that is not a power of two; measured on trained realesr-animevideov3-x3, bench/seams.py)"
    return None, bound


def choose_tile(name: str, fixed: tuple[int, int] | None, tile_size, planned: OverlapPlan) -> tuple[object, list[str]]:
    """The job's tile and what the artist should be told about it: a fixed-shape model's own input
    size (the overlap, and with it the plan's exactness and feather, cut down to fit it), AUTO
    (sized per frame), None (one window), or the asked size raised to the floor the overlap and
    the feather need."""
    overlap, warnings = planned.overlap, []
    if fixed is not None:
        if isinstance(tile_size, int) and (tile_size, tile_size) != fixed:
            warnings.append(f"{name} takes a fixed {fixed[1]}x{fixed[0]} input; tile size {tile_size} was ignored.")
        if 2 * overlap + 8 > min(fixed):
            overlap = planned.overlap = max(0, (min(fixed) - 8) // 2)
            warnings.append(f"Overlap reduced to {overlap} px to fit the model's {fixed[1]}x{fixed[0]} input.")
            planned.exact = planned.covers(overlap)
        # a fixed window cannot grow: the ramps must fit its core (models/tiles/feather.py)
        planned.feather = min(planned.feather, overlap, max(0, (min(fixed) - 2 * overlap) // 4))
        return fixed, warnings
    if tile_size == AUTO:
        return AUTO, warnings
    if tile_size is None:
        return None, warnings
    tile = int(tile_size)
    floor = tile_floor(overlap, feather=planned.feather)
    if tile < floor:
        warnings.append(f"Tile size {tile} is below the minimum for a {overlap} px overlap; using {floor}.")
        tile = floor
    return tile, warnings


def frame_tiles(tile, planned: OverlapPlan, *, auto_sized: bool, fixed: bool, multiple: int, frame_hw) -> TilePlan:
    """The tiler's plan for one frame: `tile` (the job's, or this frame's auto size), the overlap
    and feather of `planned`. Auto windows are all of one shape, no larger than the frame (one
    memory plan in ORT): an axis the window spans whole is one piece, its core the frame."""
    uniform = auto_sized and tile is not None and not fixed and len(frame_hw) == 2
    window = tile
    if uniform:
        window = tuple(tile if tile < side else side + 2 * planned.overlap for side in frame_hw)
    # smaller windows keep the pixels only when the overlap covers a proven radius: else memory short at
    # run time stops the job (models/tiles/tiling.py), whatever other processes hold
    keeps = planned.proven and planned.radius is not None and planned.overlap >= planned.radius
    return TilePlan(
        window, planned.overlap, fixed=fixed, multiple=multiple, feather=planned.feather, uniform=uniform,
        keeps_pixels=keeps,
    )  # fmt: skip


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


def working_target(op, handle, budget: int | None) -> int:
    """The working memory one window may take: a fixed figure per device kind, lowered to
    BUDGET_FRACTION of the caller's budget when given, else of the job's RAM or VRAM budget for the
    device the session runs on (the operation's: runtime/measure/budget.py ``budget_for``, the one
    route every front-end's budget takes), and on CUDA of the job's `gpu_mem_limit`. Never the
    memory free at call time: that made the same job's plan change run to run."""
    on_gpu = handle.gpu_device_id is not None
    limits = [AUTO_WORKING_GPU if on_gpu else AUTO_WORKING_CPU]
    caps = [budget if budget is not None else budget_for(op.budgets, handle.gpu_device_id)]
    if on_gpu:
        caps.append(op.gpu_mem_limit)  # the CUDA arena's cap (the weights sit outside it)
    limits += [int(BUDGET_FRACTION * cap) for cap in caps if cap]
    return max(1, min(limits))


def measured_bytes_per_pixel(runtime, handle) -> float | None:
    """Working memory per input pixel of this model on this device, as measured (the budget
    remembers what runs grew per model and input shape; runtime/measure/budget.py); None: not yet."""
    shape = ((1, 3, MEASURE_WINDOW, MEASURE_WINDOW),)  # the upscale contract: 3 input channels
    grew, _how = working_estimate(runtime, handle.model_name, shape)
    return None if not grew else grew / (MEASURE_WINDOW * MEASURE_WINDOW)


def auto_tile(op, handle, overlap: int, budget: int | None, *, feather: int = 0, measure=None, frame_hw=None):
    """(window side in input pixels, or None for one window over the frame; how it was chosen).

    From the working memory this model was measured to take per pixel and `working_target`:
    the whole frame when it fits, else the largest square window that does, rounded down to
    AUTO_WINDOW_STEP so a few percent of measuring noise rarely moves the plan. A model never
    measured is measured first by `measure()` (one MEASURE_WINDOW run: the job's first, which the
    budget meters), unless the frame is no larger than SMALL_IMAGE (then one window)."""
    floor = max(tile_floor(overlap, feather=feather), 4 * overlap)
    height, width = frame_hw if frame_hw is not None else (None, None)
    rate = measured_bytes_per_pixel(op.runtime, handle)
    if rate is None and height is not None and max(height, width) <= SMALL_IMAGE:
        return None, "one window (a small image)"
    if rate is None and measure is not None:
        measure()
        rate = measured_bytes_per_pixel(op.runtime, handle)
    if rate is None:
        return max(FALLBACK_TILE, floor), "a fixed size (working memory could not be measured)"
    target = working_target(op, handle, budget)
    how = f"{rate / 1024:.1f} KB per pixel measured, {target / 2**30:.1f} GiB per window"
    if height is not None and height * width * rate <= target and max(height, width) <= MAX_AUTO_TILE:
        return None, f"one window ({how})"
    side = int(math.sqrt(target / rate)) // AUTO_WINDOW_STEP * AUTO_WINDOW_STEP
    return int(min(max(side, floor), MAX_AUTO_TILE)), how



def auto_tile_for_frame(job, runtime, overlap: int, feather: int, budget: int | None, frame_hw):
    """The auto tile size for one frame (None: one window), told to the event log when it changes."""

    def measure():
        runtime.release_now("measuring working memory")  # a warm arena would hide the growth
        grey = np.full((MEASURE_WINDOW, MEASURE_WINDOW, 3), 0.5, np.float32)
        job.infer(to_nchw(grey, job.handle.inputs[0].dtype), last=False, slot="probe")

    tile, how = auto_tile(job.op, job.handle, overlap, budget, feather=feather, measure=measure, frame_hw=frame_hw)
    if (tile, how) != job.told_plan:
        job.told_plan = (tile, how)
        runtime.events.emit(
            "tile_plan", model=job.handle.model_name, tile_size=tile, overlap=overlap, feather=feather, how=how
        )
    return tile


def split_warning(tiled, *, exact: bool) -> str:
    """What the artist reads when tiles were made smaller: by the budget, or after running out."""
    budget = sum(s["reason"] == "memory_budget" for s in tiled.splits)
    same = " (the same pixels: the overlap covers the model's receptive radius)" if exact else ""
    if budget == len(tiled.splits):
        return (
            f"Memory budget: tiles were made smaller {budget} time(s), down to {max(tiled.tile_size)} px, "
            f"to fit the memory free under the budget{same}."
        )
    return f"Ran out of memory; tiles were split {len(tiled.splits)} time(s), down to {max(tiled.tile_size)} px{same}."
