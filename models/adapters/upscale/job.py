"""One upscale job: its plan, made once the session is open (the overlap from the model's receptive
radius or measured reach, the tile size, a deep net's staged plan), then each frame through the
tiler. What a frame feeds the model is frame_input.py's; what its result says, result.py's."""

from __future__ import annotations

import math

import numpy as np

from ....runtime.errors import InferenceOutOfMemoryError
from ....runtime.measure.budget import budget_for
from ....runtime.measure.memory import available_system_memory_bytes
from ...base import check_finite, fixed_hw
from ...imaging import check_shape, from_nchw, to_nchw
from ...tiles.reach import cached_reach, reach_for
from ...tiles.tile_plan import TilePlan
from ...tiles.tiling import TiledRun, refuse_oversized_result, run_tiled
from .frame_input import ModelInput, keeps_hdr, model_input, with_alpha
from .plan import (
    AUTO,
    MAX_EXACT_RADIUS,
    auto_tile_for_frame,
    choose_tile,
    frame_tiles,
    impulse_probe,
    plan_overlap,
    receptive_field,
    split_warning,
)
from .result import UpscaleResult, frame_result
from .runs import ModelRuns, scale_hint, static_scale
from .stages import FramePlan, compute_of, honour_tile, staged_for, staged_frame


class UpscaleJob:
    """One upscale job: its plan, made once the session is open (`start`), then each frame's
    steps (`frame`). The tile size it settles on carries over from frame to frame."""

    def __init__(self, tile_size, overlap, model_overlap, alpha_mode, memory_budget_bytes, size_multiple, available):
        self.tile_size, self.requested_overlap, self.model_overlap = tile_size, overlap, model_overlap
        self.alpha_mode, self.memory_budget = alpha_mode, memory_budget_bytes
        self.size_multiple, self.available_memory = size_multiple, available
        self.auto_sized = False  # the tile is sized per frame, until a split shows the size that fits

    # ---- once per job ----------------------------------------------------------------------------

    def start(self, loop) -> None:
        self.loop = loop
        runs = self.runs = ModelRuns(loop)
        loop.at_end(runs.close)  # its buffers are back before the operation ends
        handle = loop.handle
        self.dtype = handle.inputs[0].dtype
        self.fixed = fixed_hw(handle.inputs[0].shape)
        self.hdr = keeps_hdr(handle)
        self.scale = static_scale(handle)  # what the tiler checks every tile against
        runs.scale = self.scale or scale_hint(handle)  # what outputs are bound with from the first run
        runs.hinted = self.scale is None and runs.scale is not None
        self.field = receptive_field(handle.model_path, self.model_overlap, self._probe)
        deep = self.field.radius is not None and MAX_EXACT_RADIUS < self.field.radius < math.inf
        known, reach = cached_reach(handle.model_path) if deep else (False, None)  # hashes the file: deep nets only
        self._plan(math.inf if known and reach is None else reach)
        self.staged = staged_for(self, handle)  # a deep net's default: body and head apart
        if self.tile is AUTO and self.memory_budget is None:  # the job's RAM or VRAM budget, by where it runs
            self.memory_budget = budget_for(loop.op.budgets, handle.gpu_device_id)

    def _plan(self, reach) -> None:
        handle = self.loop.handle
        self.planned = plan_overlap(handle.model_name, self.field, self.requested_overlap, self.size_multiple, reach)
        self.tile, tile_warnings = choose_tile(handle.model_name, self.fixed, self.tile_size, self.planned)
        self.plan_warnings = list(self.planned.warnings) + tile_warnings

    def measure_reach(self) -> tuple[int | None, list[str]]:
        """How far this model file reaches (models/tiles/reach.py: cached per content, else measured
        on the fixed probe), the plan made again with it; (reach, notes to pass on)."""
        reach, notes = reach_for(self.runs.handle.model_path, self._infer_whole)
        self._plan(math.inf if reach is None else reach)
        return reach, notes

    def not_finite(self, result) -> None:
        check_finite(result, self.runs.handle.model_name, self.runs.handle.outputs[0].name)

    def _settle_reach(self, frame, fed, shape) -> TilePlan:
        """A deep net's overlap from how far it really reaches, before the first frame that has seams."""
        old = self.plan_warnings
        frame.report(0.0, "measuring how far the model reaches")
        try:
            _reach, notes = self.measure_reach()
        except InferenceOutOfMemoryError:
            self.planned.needs_reach = False  # no room for the probe: the bounded default stays, said so
            return self._tiles(shape)
        fed.warnings = list(self.plan_warnings) + notes + [w for w in fed.warnings if w not in old]
        return self._tiles(shape)

    def _probe(self) -> int | None:
        """The receptive radius, measured by an impulse probe (plan.py impulse_probe)."""
        return impulse_probe(self._infer_whole, scale=self.scale, fixed=self.fixed)

    def _infer_whole(self, window: np.ndarray) -> np.ndarray:
        """One probe run of the whole model on an HxWxC window."""
        output = self.runs.infer(to_nchw(window, self.dtype), last=False, slot="probe")
        return from_nchw(check_finite(output, self.runs.handle.model_name, self.runs.handle.outputs[0].name))

    # ---- per frame -------------------------------------------------------------------------------

    def frame(self, frame) -> UpscaleResult:
        prefix = "" if frame.loop.single else f"{frame.counter}, "
        frame.report(0.0, prefix + "preprocessing")
        available = self.available_memory
        if available is None:
            available = available_system_memory_bytes()  # one read per frame, for both checks
        shape = np.shape(frame.image)
        check_shape(shape, frame.label)  # before the tile plan reads it as HxW
        self._refuse_oversized(shape, available)
        if self.staged is not None:
            return self._staged_frame(frame, shape, prefix)
        tiles = self._tiles(shape)
        fed = self._model_input(frame)
        if self.planned.needs_reach and len(tiles.tiles(*shape[:2], tiles.tile_size)) > 1:
            tiles = self._settle_reach(frame, fed, shape)
        tiles, raised = honour_tile(self, tiles, shape)
        fed.warnings += [raised] if raised else []
        tiled = self._run_tiles(frame, fed, tiles, available, prefix)
        frame.op.check_cancelled()
        self.scale = tiled.scale  # known from here on, for the next frames too
        if tiled.splits:
            # the size that fitted, kept for the next frames: no use retrying the bigger one
            self.tile, self.auto_sized = tiled.tile_size, False
            fed.warnings.append(split_warning(tiled, exact=self.planned.exact))
        ran = tiles.tiles(*shape[:2], tiled.tile_size if tiled.splits else tiles.tile_size)
        shown = FramePlan(tiled.window_ran, tiles.overlap, tiled.tiles_run, compute_of(ran, *shape[:2]))
        return frame_result(self.planned, with_alpha(tiled.image, fed), tiled, fed, shown)

    def _staged_frame(self, frame, shape, prefix: str) -> UpscaleResult:
        fed = self._model_input(frame)
        fed.warnings = [w for w in fed.warnings if w not in self.planned.warnings]  # the stages say their own
        tiled, exact, shown, feather, warnings = staged_frame(self, frame, fed, shape, prefix)
        frame.op.check_cancelled()
        self.scale = tiled.scale
        fed.warnings = warnings + fed.warnings
        result = frame_result(self.planned, with_alpha(tiled.image, fed), tiled, fed, shown)
        result.exact, result.feather, result.overlap = exact, feather, shown.overlap
        result.tile_size_used = max(shown.window)
        return result

    def _refuse_oversized(self, shape, available) -> None:
        """Before even the float32 copy of the input (that alone can be gigabytes): a frame whose
        result cannot fit is refused. Unknown scale or shape: the tiler refuses it before allocating it."""
        known = self.scale or self.runs.scale
        if known and len(shape) in (2, 3):
            channels = 4 if len(shape) == 3 and shape[2] in (2, 4) else 3
            label = self.loop.handle.model_name
            refuse_oversized_result(*shape[:2], known, channels, label=label, available=available)

    def _tiles(self, shape) -> TilePlan:
        """This frame's tile plan; an auto tile is sized for it (until a split shows the size that fits)."""
        if self.tile is AUTO or self.auto_sized:
            self.auto_sized = True
            self.tile = auto_tile_for_frame(
                self.runs, self.loop.runtime, self.planned.overlap, self.planned.feather, self.memory_budget, shape[:2]
            )
        return frame_tiles(
            self.tile,
            self.planned,
            auto_sized=self.auto_sized,
            fixed=self.fixed is not None,
            multiple=self.size_multiple,
            frame_hw=shape[:2],
        )

    def _model_input(self, frame) -> ModelInput:
        model_name = self.loop.handle.model_name
        return model_input(frame, alpha_mode=self.alpha_mode, hdr=self.hdr, model_name=model_name, plan_warnings=self.plan_warnings)

    def _run_tiles(self, frame, fed: ModelInput, tiles: TilePlan, available, prefix: str):
        runs, dtype, model_alpha = self.runs, self.dtype, fed.model_alpha

        def run_tile(window, last):
            colour = runs.infer(to_nchw(window[:, :, :3], dtype), last=last and not model_alpha)
            if not model_alpha:
                return colour  # 1x3xHxW: the tiler pastes it transposed, in one pass
            # the alpha as a grey image, straight into its NCHW feed (one copy, not three)
            height, width = window.shape[:2]
            grey = np.broadcast_to(window[None, None, :, :, 3], (1, 3, height, width))
            matte = runs.infer(np.ascontiguousarray(grey, dtype), last=last, slot="alpha")
            # 1x4xHxW: pasted transposed by the tiler, like the colour alone (one copy, not four)
            return np.concatenate([colour, matte.mean(axis=1, keepdims=True, dtype=np.float32)], axis=1, dtype=np.float32)

        source, fed.source = fed.source, None  # the input goes as soon as the tiler is done with it
        return run_tiled(
            source,
            TiledRun(
                run_tile,
                tiles,
                last=frame.last,
                scale=self.scale,
                label=runs.handle.model_name,
                events=self.loop.runtime.events,
                on_split=runs.reacquire,
                progress=lambda fraction, done, total: frame.report(fraction, f"{prefix}tile {done}/{total}"),
                clip=(0.0, fed.high),
                not_finite=self.not_finite,
                available_memory=available,
            ),
        )
