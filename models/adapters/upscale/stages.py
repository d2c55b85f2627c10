"""A deep upscaler's default plan: staged tiling (models/tiles/stages.py). The body runs over the
whole frame when its working memory fits the window target, else in the fewest large windows that
do (their overlap covers the model's measured reach, seams blended); the head runs in windows
whose overlap covers its own proven radius, so it changes no pixel. With the body in one window
the result is exact; the plan's compute is each stage's window pixels over the frame's, weighted by
the stage's share of one whole-image run's multiply-adds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ....runtime.measure.budget import budget_for
from ...store.models_folder import cache_dir
from ...tiles.reach import PROBE_REACH
from ...tiles.stages import stages_for
from ...tiles.tile_memory import BUDGET_FRACTION, total_system_memory_bytes
from ...tiles.tile_plan import TilePlan, plan_tiles
from ...tiles.tiling import TiledRun, run_tiled
from .plan import (
    AUTO,
    AUTO_OVERLAP,
    AUTO_WINDOW_STEP,
    MAX_EXACT_RADIUS,
    auto_tile_for_frame,
    frame_tiles,
    reach_overlap,
    working_target,
)

MAX_PIECES = 16  # per axis, when the body must be cut: more means a target far below a sane one


@dataclass(frozen=True)
class FramePlan:
    """What a frame's plan is, as the report and the JSON line give it."""

    window: tuple[int, int]  # the largest window (h, w), input pixels, overlap included
    overlap: int  # of the windows that set the cost (the body's when staged)
    windows: int  # model runs of the plan (both stages when staged)
    compute: float  # multiply-adds over one whole-image run's
    staged: bool = False

    def as_dict(self) -> dict:
        return {
            "window": list(self.window), "overlap": self.overlap, "windows": self.windows,
            "compute": round(self.compute, 3), "staged": self.staged,
        }  # fmt: skip

    def words(self) -> str:
        stage = " (staged: body, then head)" if self.staged else ""
        return (
            f"{self.windows} window(s) of up to {self.window[1]}x{self.window[0]} px, overlap {self.overlap} px, "
            f"compute {self.compute:.2f}x one whole-image run{stage}"
        )


def compute_of(tiles, height: int, width: int) -> float:
    """Window pixels over image pixels: what a plan costs against one whole-image run."""
    return sum((t.wy1 - t.wy0) * (t.wx1 - t.wx0) for t in tiles) / float(height * width)


def body_window(height: int, width: int, overlap: int, max_pixels: float):
    """The body's window (h, w) for the fewest window pixels in all whose largest window holds at
    most `max_pixels`; None when the whole frame fits. An axis cut in one piece spans the frame."""
    if height * width <= max_pixels:
        return None
    best = None
    for rows in range(1, MAX_PIECES + 1):
        for cols in range(1, MAX_PIECES + 1):
            if rows == cols == 1:
                continue
            size = (_side(height, rows, overlap), _side(width, cols, overlap))
            tiles = plan_tiles(height, width, size, overlap)
            if max((t.wy1 - t.wy0) * (t.wx1 - t.wx0) for t in tiles) > max_pixels:
                continue
            cost = (compute_of(tiles, height, width), len(tiles))
            if best is None or cost < best[0]:
                best = (cost, size)
    if best is None:  # a target too small for any sane cut: the smallest pieces, said by the compute
        return _side(height, MAX_PIECES, overlap), _side(width, MAX_PIECES, overlap)
    return best[1]


def _side(length: int, pieces: int, overlap: int) -> int:
    if pieces == 1:
        return length + 2 * overlap
    return -(-length // pieces) + 2 * overlap


class StagedUpscale:
    """One job's staged runs: the body's and the head's sessions (through the job's operation and
    the shared runtime) and each frame's plan."""

    def __init__(self, job, stages, radius: int):
        self.job, self.stages, self.radius = job, stages, radius
        self.reach: float | None = None  # the whole model's measured reach, once the body is cut

    def _session(self, path):
        loop = self.job.loop
        return loop.op.session(path, loop.options.device)

    def body_overlap(self) -> tuple[int, int]:
        """(overlap, feather) of the body's windows: the reach's plan (plan.py reach_overlap)."""
        return reach_overlap(self.radius, self.reach)

    def plan(self, height: int, width: int, target: float, body_target: float | None = None):
        """(body plan, head plan, what the frame's plan is) for a frame: the head's windows under
        `target` bytes each (its overlap is a few pixels: larger windows would buy nothing), the
        body's under `body_target` (default: `target`)."""
        stages = self.stages
        overlap, feather = self.body_overlap()
        body_room = target if body_target is None else body_target
        window = body_window(height, width, overlap, body_room / stages.body_bytes_per_pixel)
        if window is None:
            body = TilePlan(None, 0, keeps_pixels=False)
        else:
            body = TilePlan(window, overlap, feather=feather, keeps_pixels=False)
        head_side = max(4 * stages.head_radius + 8, int(math.sqrt(target / stages.head_bytes_per_pixel)))
        head_side -= head_side % AUTO_WINDOW_STEP
        head_window = tuple(
            head_side if head_side < side else side + 2 * stages.head_radius for side in (height, width)
        )
        head = TilePlan(head_window, stages.head_radius)  # balanced cuts: windows within a pixel of each other
        body_tiles = body.tiles(height, width, body.tile_size)
        head_tiles = head.tiles(height, width, head.tile_size)
        share = stages.body_share
        compute = share * compute_of(body_tiles, height, width) + (1 - share) * compute_of(
            head_tiles, height, width
        )
        largest = max(body_tiles, key=lambda t: t.area).window_shape
        shown = FramePlan(largest, body.overlap, len(body_tiles) + len(head_tiles), compute, staged=True)
        return body, head, shown

    def run(self, frame, image: np.ndarray, plans, *, last: bool, clip, not_finite, progress):
        """The frame's HxWx3 `image` through the body, then the head: the tiler's result of the head."""
        body_plan, head_plan = plans
        job, stages = self.job, self.stages
        dtype = job.dtype
        label = job.loop.handle.model_name
        body = self._session(stages.body)
        in_name = body.inputs[0].name

        def run_body(window, _last):
            feed = np.ascontiguousarray(window.transpose(2, 0, 1)[None], dtype)
            return job.loop.op.run(body, {in_name: feed}, last=False, output_names=[stages.cut])[stages.cut]

        frame.report(0.0, "the model's body (its 1x part)")
        features = run_tiled(image, TiledRun(run_body, body_plan, last=False, scale=1, label=label,
                                             events=job.loop.runtime.events)).image  # fmt: skip
        head = self._session(stages.head)
        out_name = head.outputs[0].name

        def run_head(window, is_last):
            feed = np.ascontiguousarray(window.transpose(2, 0, 1)[None], dtype)
            return job.loop.op.run(head, {stages.cut: feed}, last=is_last, output_names=[out_name])[out_name]

        def reacquire(_tile, _error):  # the head keeps its pixels at any window: a split is safe
            nonlocal head
            head = self._session(stages.head)

        return run_tiled(features, TiledRun(
            run_head, head_plan, last=last, label=label, events=job.loop.runtime.events, clip=clip,
            not_finite=not_finite, progress=progress, on_split=reacquire,
        ))  # fmt: skip


def staged_exact(body_plan: TilePlan) -> bool:
    """The result equals one whole-image run: the body ran whole, the head's overlap covers its radius."""
    return body_plan.tile_size is None


def body_target(op, handle, budget: int | None) -> int:
    """The working memory the body's window may take: BUDGET_FRACTION of the memory the job may use
    (the caller's budget, else the job's RAM budget, else the machine's physical RAM: never what
    other processes leave free, so the plan is the same whatever else runs); on a GPU, or where the
    OS does not say, the fixed per-device target (plan.py working_target)."""
    if handle.gpu_device_id is not None:
        return working_target(op, handle, budget)
    room = budget if budget is not None else budget_for(op.budgets, None)
    room = room if room else total_system_memory_bytes()
    return int(BUDGET_FRACTION * room) if room else working_target(op, handle, budget)


def staged_for(job, handle) -> StagedUpscale | None:
    """The job's staged runs, when its plan is a deep net's default (Overlap and Tile Size auto,
    a dynamic input) and the graph cuts into a body and a head; else None (tiled as one net)."""
    planned = job.planned
    auto_overlap = job.requested_overlap is None or job.requested_overlap == AUTO_OVERLAP
    deep = planned.radius is not None and planned.radius > MAX_EXACT_RADIUS
    if not (auto_overlap and deep and job.tile is AUTO and job.fixed is None and job.size_multiple == 1):
        return None
    try:
        stages = stages_for(handle.model_path, cache_dir() / "tiling")
    except OSError:
        return None  # no room for the stage files: tiled as one net
    return None if stages is None else StagedUpscale(job, stages, planned.radius)


def staged_frame(job, frame, fed, shape, prefix: str):
    """One frame through the staged plan: (the tiler's result, exact, what the plan is, feather,
    warnings about the seams)."""
    staged, height, width = job.staged, shape[0], shape[1]
    target = working_target(job.loop.op, job.loop.handle, job.memory_budget)
    room = body_target(job.loop.op, job.loop.handle, job.memory_budget)
    body, head, shown = staged.plan(height, width, target, room)
    notes = []
    if body.tile_size is not None and staged.reach is None:
        frame.report(0.0, "measuring how far the model reaches")
        reach, notes = job.measure_reach()
        staged.reach = math.inf if reach is None else reach
        body, head, shown = staged.plan(height, width, target, room)
    source = fed.source

    def through(image, last):
        return staged.run(
            frame, image, (body, head), last=last, clip=(0.0, fed.high), not_finite=job.not_finite,
            progress=lambda fraction, done, total: frame.report(fraction, f"{prefix}tile {done}/{total}"),
        )  # fmt: skip

    fed.source = None
    tiled = through(source[:, :, :3], frame.last and not fed.model_alpha)
    if fed.model_alpha:  # the alpha as a grey image, through the same stages
        matte = through(np.repeat(source[:, :, 3:4], 3, axis=2), frame.last).image
        tiled.image = np.concatenate([tiled.image, matte.mean(axis=2, keepdims=True)], axis=2)
    exact = staged_exact(body)
    warnings = notes + ([] if exact else [_body_warning(job, body)])
    return tiled, exact, shown, (0 if exact else body.feather), warnings


def _body_warning(job, body: TilePlan) -> str:
    name, reach = job.loop.handle.model_name, job.staged.reach
    reached = f"past the {PROBE_REACH} px the probe sees" if math.isinf(reach) else f"{int(reach)} px"
    return (
        f"Not exact: {name}'s body (its 1x part) ran in windows for memory: they overlap {body.overlap} px "
        f"(how far a one-pixel change reaches: {reached}) and are blended; {job.planned.bound}. Its head "
        "ran exactly. A larger memory budget runs the body whole, and the result exact."
    )


EXPLICIT_COST_LIMIT = 2.0  # an explicit tile may cost up to this many times its auto plan's compute
TILE_STEP = 16


def honour_tile(job, tiles: TilePlan, shape) -> tuple[TilePlan, str | None]:
    """A deep net's explicit tile, raised when it would cost more than EXPLICIT_COST_LIMIT times the
    automatic plan's compute (a habitual 192 px tile on its 72 px overlap keeps a 48 px core: 12x the
    work); (the plan to run, the one line that says to what and why, or None)."""
    radius = job.planned.radius
    if tiles.fixed or not isinstance(tiles.tile_size, int) or radius is None or radius <= MAX_EXACT_RADIUS:
        return tiles, None  # a net tiled exactly pays its own radius: what the artist asked to test
    height, width = shape[:2]
    cost = compute_of(tiles.tiles(height, width, tiles.tile_size), height, width)
    auto = auto_compute(job, shape)
    if cost <= EXPLICIT_COST_LIMIT * auto:
        return tiles, None
    largest = max(height, width) + 2 * tiles.overlap
    raised, raised_cost = tiles.tile_size, cost
    while raised < largest and raised_cost > EXPLICIT_COST_LIMIT * auto:
        raised = min(largest, raised + TILE_STEP)
        raised_cost = compute_of(tiles.tiles(height, width, raised), height, width)
    core = tiles.tile_size - 2 * tiles.overlap
    warning = (
        f"Tile size {tiles.tile_size} would cost {cost:.1f}x one whole-image run ({tiles.overlap} px of overlap "
        f"around a {core} px core); raised to {raised} ({raised_cost:.2f}x), as a tile may cost at most "
        f"{EXPLICIT_COST_LIMIT:g}x the automatic plan ({auto:.2f}x)."
    )
    return replace(tiles, tile_size=raised), warning


def auto_compute(job, shape) -> float:
    """The compute of the plan Tile Size auto would run on this frame."""
    height, width = shape[:2]
    planned = job.planned
    target = working_target(job.loop.op, job.loop.handle, job.memory_budget)
    stages = None
    if planned.radius is not None and planned.radius > MAX_EXACT_RADIUS and job.fixed is None:
        try:
            stages = stages_for(job.loop.handle.model_path, cache_dir() / "tiling")
        except OSError:
            stages = None
    if stages is not None:
        room = body_target(job.loop.op, job.loop.handle, job.memory_budget)
        return StagedUpscale(job, stages, planned.radius).plan(height, width, target, room)[2].compute
    tile = auto_tile_for_frame(
        job.runs, job.loop.runtime, planned.overlap, planned.feather, job.memory_budget, shape[:2]
    )
    auto = frame_tiles(
        tile, planned, auto_sized=True, fixed=False, multiple=job.size_multiple, frame_hw=shape[:2]
    )
    return compute_of(auto.tiles(height, width, auto.tile_size), height, width)
