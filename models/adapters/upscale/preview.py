"""The plan an upscale job would run, said without running it (the CLI's ``--plan-only``): from the
model's graph (its receptive radius, its stages and their memory), the reach already measured for
its content, the frame's size and the job's settings. No session is made and nothing runs; what
only a run can tell (a never-measured net's working memory) is said as such."""

from __future__ import annotations

import math
from pathlib import Path

from ...store.models_folder import cache_dir
from ...tiles.reach import cached_reach
from ...tiles.stages import stages_for
from ...tiles.tile_memory import BUDGET_FRACTION, total_system_memory_bytes
from ...tiles.tile_plan import plan_tiles
from .plan import (
    AUTO,
    AUTO_OVERLAP,
    AUTO_WORKING_CPU,
    MAX_EXACT_RADIUS,
    choose_tile,
    plan_overlap,
    receptive_field,
)
from .stages import FramePlan, StagedUpscale, compute_of


def preview_plan(model_path, height: int, width: int, *, values: dict, ram_budget: int | None = None) -> FramePlan | str:
    """The FramePlan a CPU job with these option `values` (tile_size, overlap, tile_overlap) would
    run on a `height` x `width` frame, or what cannot be told before a run, in words."""
    name = Path(model_path).name
    tile_size = values.get("tile_size", 0)
    tile_size = AUTO if tile_size in (0, None, AUTO) else int(tile_size)
    overlap = values.get("overlap", AUTO_OVERLAP)
    field_ = receptive_field(model_path, values.get("tile_overlap"), None)
    known, reach = cached_reach(model_path)
    planned = plan_overlap(name, field_, overlap, 1, math.inf if known and reach is None else reach)
    target = AUTO_WORKING_CPU if not ram_budget else min(AUTO_WORKING_CPU, int(BUDGET_FRACTION * ram_budget))
    deep = planned.radius is not None and planned.radius > MAX_EXACT_RADIUS
    if deep and tile_size is AUTO and overlap in (None, AUTO_OVERLAP):
        staged = _staged_preview(model_path, planned.radius, height, width, target, ram_budget)
        if staged is not None:
            return staged
    if tile_size is AUTO:
        return "windows sized at the first run, from the working memory this model is measured to take"
    tile, _warnings = choose_tile(name, None, tile_size, planned)
    tiles = plan_tiles(height, width, tile, planned.overlap)
    largest = max(tiles, key=lambda t: t.area).window_shape
    return FramePlan(largest, planned.overlap, len(tiles), compute_of(tiles, height, width))


def _staged_preview(model_path, radius: int, height: int, width: int, target: int, ram_budget):
    """A deep net's staged plan (None: its graph does not cut), said with what is not known yet."""
    stages = stages_for(model_path, cache_dir() / "tiling")
    if stages is None:
        return None
    known, reach = cached_reach(model_path)
    staged = StagedUpscale(None, stages, radius)
    staged.reach = math.inf if known and reach is None else reach
    room = int(BUDGET_FRACTION * (ram_budget or total_system_memory_bytes() or 2 * AUTO_WORKING_CPU))
    body, _head, shown = staged.plan(height, width, target, room)
    if body.tile_size is not None and not known:
        return f"{shown.words()}; the body's overlap is settled when its reach is first measured (two runs)"
    return shown

