"""Upscale family: any ONNX super-resolution model (Real-ESRGAN and friends, or the embedded
bicubic x2 graph), tiled so that image size never decides memory use.

Contract (read from the session): input rank 4, 3 channels, float or float16 (RGB in [0, 1]);
output rank 4, 3 channels, an integer multiple of the input size. Fixed-shape exports are fed
exactly their size; dynamic ones get tiles sized from a memory budget (see models/tiles/tiling.py).

Alpha: the default `alpha_mode="model"` runs the alpha channel through the model as a grey image
(mean of the three output channels), so transparency edges line up with the colour edges the
model sharpened. It costs one extra run per tile, but only when the alpha is not constant:
opaque images (the common case for renders and photos) skip it. `alpha_mode="resize"` uses a
cubic resize instead (same kernel as the embedded bicubic model) and never runs the model twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...runtime.errors import InferenceOutOfMemoryError
from ...runtime.measure.budget import budget_for
from ...runtime.measure.memory import available_system_memory_bytes
from ..base import FLOAT_TYPES, RunOptions, check_contract, check_finite, fixed_hw
from ..family import Family, Option, Output, Setting, non_negative_int, one_of, positive_int
from ..frame_loop import run_frames
from ..imaging import check_shape, clip_for_model, from_nchw, resize_clipped, to_nchw
from ..result_images import IMAGE
from ..tiles.reach import cached_reach, reach_for
from ..tiles.tiling import TiledRun, TilePlan, refuse_oversized_result, run_tiled
from .upscale_plan import (
    AUTO,
    AUTO_OVERLAP,
    MAX_EXACT_RADIUS,
    auto_tile_for_frame,
    choose_tile,
    frame_tiles,
    impulse_probe,
    plan_overlap,
    receptive_field,
    split_warning,
)
from .upscale_runs import ModelRuns, identify, scale_hint, static_scale
from .upscale_stages import FramePlan, compute_of, honour_tile, staged_for, staged_frame

DEFAULT_MODEL_PATH = Path(__file__).parents[1] / "assets" / "bicubic_x2.onnx"
OPERATION_NAME = "upscale"
MODEL_NAME = "super-resolution"  # as messages name the model: "a super-resolution model"
ALPHA_MODES = ("model", "resize")


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
    bound: str = "not exact"  # how far from one whole-image run, when not exact (upscale_plan.OverlapPlan)
    plan: dict | None = None  # window, overlap, windows, compute (upscale_stages.FramePlan.as_dict)

    @property
    def seams(self) -> str:
        """How the tiles were joined, for reports and JSON: "exact" only where tiles are bit-identical."""
        if self.exact:
            return "exact"
        return f"tiles blended; {self.bound}" if self.feather else f"tiles cropped; {self.bound}"


def run(
    images,
    model_path=DEFAULT_MODEL_PATH,
    *,
    options: RunOptions | None = None,
    tile_size: int | str | None = "auto",
    overlap: int | None = None,
    model_overlap: int | None = None,
    alpha_mode: str = "model",
    memory_budget_bytes: int | None = None,
    size_multiple: int = 1,
    available_memory_bytes: int | None = None,
) -> UpscaleResult | list[UpscaleResult]:
    """Upscale one image (HxW[xC] uint8/uint16/float) or a list of frames (one operation).

    `tile_size`: "auto" or 0 (per frame, from the working memory this model was measured to take
    per pixel and a working target per device kind, lowered by `memory_budget_bytes` when given,
    else by the runtime's RAM or VRAM budget for the device the session runs on (runtime/measure/budget.py
    ``budget_for``): never from the memory free at call time, so a job's plan is the same every
    run; see upscale_plan.auto_tile), an int (window side in input pixels, overlap included), or
    None for one window over the image. Whatever is chosen is halved on out-of-memory. Ignored for
    fixed-shape models, which get exactly their input size.
    `overlap`: context pixels around each tile; None or -1: the model's receptive radius
    (`model_overlap` from its catalog entry, else read from the graph, else measured by an impulse
    probe), rounded up to `size_multiple`: then tiles give exactly one whole-image run's pixels
    when the graph proved the radius (a probe's figure is measured, not proven: `exact` False).
    A radius over MAX_EXACT_RADIUS (deep nets: RRDBNet's 349 px) gets an overlap covering how
    far the model was measured to reach (models/tiles/reach.py, once per model file, on a crop of
    the first frame that has seams), seams blended, and the result says it is not exact (`exact`,
    `seams`, a warning). Tiles that are not bit-identical are blended at any overlap.
    `size_multiple`: round dynamic windows up to this (models that need even sizes, say).
    `available_memory_bytes`: what a frame's result may take (default: the memory the OS says is
    available when the frame starts); a frame whose float32 result is larger is refused
    (InvalidImageError) before any run of it.
    """
    if alpha_mode not in ALPHA_MODES:
        raise ValueError(f"alpha_mode must be one of {ALPHA_MODES}, got {alpha_mode!r}")
    tile_size = _checked_tile_size(tile_size)
    if overlap is not None and int(overlap) < AUTO_OVERLAP:
        raise ValueError(f"overlap must be >= 0 ({AUTO_OVERLAP}: the model's receptive radius), got {overlap}")
    options = options or RunOptions()
    options.report(0.0, "loading model")
    job = _Upscale(
        tile_size, overlap, model_overlap, alpha_mode, memory_budget_bytes, size_multiple, available_memory_bytes
    )
    return run_frames(
        OPERATION_NAME, images, model_path, options, check=check_session, start=job.start, body=job.frame
    )


def _checked_tile_size(tile_size):
    """`tile_size` as the plan reads it: AUTO, None or a positive int (the artist's 0 is AUTO)."""
    if isinstance(tile_size, str) and tile_size != AUTO:
        raise ValueError(f"tile_size must be 'auto', an int or None, got {tile_size!r}")
    if isinstance(tile_size, (bool, float)):
        raise ValueError(f"tile_size must be 'auto', an int or None, got {tile_size!r}")
    if isinstance(tile_size, int) and tile_size < 0:  # the Tile Size option's min (FAMILY below)
        raise ValueError(f"tile_size must be >= 0 (0 or 'auto': a fixed size per device), got {tile_size}")
    return AUTO if tile_size == 0 else tile_size  # what the artist's "Tile Size 0" means


@dataclass
class _ModelInput:
    """What one frame feeds the tiler, and what its result needs from the source besides."""

    source: np.ndarray  # HxWx3 RGB in [0, 1], or HxWx4 when the alpha runs through the model
    alpha: np.ndarray | None  # the source's alpha, None when it has none
    alpha_constant: float | None  # a flat alpha's value: no run needed to upscale it
    model_alpha: bool  # the alpha runs through the model (the 4th channel of `source`)
    kind: str  # the source's samples: "8-bit", "16-bit" or "float"
    warnings: list[str]
    clipped: str | None = None  # what was clipped for the model, in words
    high: float = 1.0  # the highest value the output keeps (an HDR frame's own through the embedded model)


class _Upscale:
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
        """The receptive radius, measured by an impulse probe (upscale_plan.impulse_probe)."""
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
        return self._result(_with_alpha(tiled.image, fed), tiled, fed, shown)

    def _staged_frame(self, frame, shape, prefix: str) -> UpscaleResult:
        fed = self._model_input(frame)
        fed.warnings = [w for w in fed.warnings if w not in self.planned.warnings]  # the stages say their own
        tiled, exact, shown, feather, warnings = staged_frame(self, frame, fed, shape, prefix)
        frame.op.check_cancelled()
        self.scale = tiled.scale
        fed.warnings = warnings + fed.warnings
        result = self._result(_with_alpha(tiled.image, fed), tiled, fed, shown)
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

    def _model_input(self, frame) -> _ModelInput:
        """The frame as the model takes it: RGB clipped to [0, 1], with the alpha as a 4th channel
        when it runs through the model."""
        prepared = frame.prepare()
        warnings = list(self.plan_warnings) + list(prepared.warnings)
        rgb, alpha = prepared.rgb, prepared.alpha
        high = 1.0
        if self.hdr and prepared.kind == "float":  # an HDR frame keeps its range, not the resampling's ringing
            high = max(1.0, float(rgb.max()))
        clipped = clip_for_model(rgb, high, self.loop.handle.model_name, hdr_hint="the embedded bicubic model keeps HDR values")
        if clipped:
            warnings.append(f"{frame.label}: {clipped}")
        alpha_constant = None
        if alpha is not None and float(alpha.min()) == float(alpha.max()):
            alpha_constant = float(alpha.min())
        model_alpha = alpha is not None and alpha_constant is None and self.alpha_mode == "model"
        source = np.concatenate([rgb, alpha[:, :, None]], axis=2) if model_alpha else rgb
        return _ModelInput(source, alpha, alpha_constant, model_alpha, prepared.kind, warnings, clipped, high)

    def _run_tiles(self, frame, fed: _ModelInput, tiles: TilePlan, available, prefix: str):
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

    def _result(self, image: np.ndarray, tiled, fed: _ModelInput, shown: FramePlan) -> UpscaleResult:
        planned, warnings = self.planned, fed.warnings
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


def keeps_hdr(handle) -> bool:
    """Whether the model keeps values above 1: the embedded bicubic model is a plain resampling
    (linear, trained on nothing), so an HDR frame goes through it unclipped; a trained model
    learnt [0, 1] and gets its input clipped to that."""
    return Path(handle.model_path).resolve() == DEFAULT_MODEL_PATH.resolve()


def _with_alpha(image: np.ndarray, fed: _ModelInput) -> np.ndarray:
    """The upscaled RGB(A) with the source's alpha joined back: resized (cubic) or constant, unless
    it already ran through the model."""
    if fed.alpha is None or fed.model_alpha:
        return image  # clipped to [0, 1] as each tile was pasted
    out_h, out_w = image.shape[:2]
    if fed.alpha_constant is not None:
        matte = np.full((out_h, out_w, 1), fed.alpha_constant, np.float32)
    else:
        matte = resize_clipped(fed.alpha, (out_h, out_w), "cubic")[:, :, None]
    return np.concatenate([image, matte], axis=2)


def check_session(handle) -> None:
    """The family's contract: ModelContractError when the model is not an RGB-to-RGB NCHW net."""
    check_contract(
        handle,
        MODEL_NAME,
        inputs=[{"rank": 4, "channels": 3, "types": FLOAT_TYPES}],
        outputs=[{"rank": 4, "channels": 3, "types": FLOAT_TYPES}],
    )


FAMILY = Family(
    id="upscale",
    title="Super-Resolution",
    produces="the image at the model's scale (x2 with the built-in bicubic model)",
    run=run,
    identify=identify,
    looks="a super-resolution model",
    identify_rank=30,
    settings=(
        Setting("tile_overlap", non_negative_int, keyword="model_overlap"),
        Setting("alpha_mode", one_of(*ALPHA_MODES)),
        Setting("size_multiple", positive_int),
    ),
    user_defaults={},  # the overlap comes from the model's graph
    options=(
        Option(
            "tile_size",
            int,
            0,
            "Tile Size",
            "Size of the square pieces the image is upscaled in, in pixels. 0: chosen for you from the "
            "memory the model needs; a smaller size uses less memory and is a little slower",
            min=0,
            soft_max=2048,
            alias="tile",
        ),
        Option(
            "overlap",
            int,
            AUTO_OVERLAP,
            "Overlap",
            "Extra pixels each piece sees around its edges, so no seams show between pieces. -1: as many "
            "as the model needs (for very deep models, as far as it was measured to reach); pieces that "
            "are not exact are blended, and a warning says so",
            min=AUTO_OVERLAP,
            soft_max=256,
        ),
    ),
    action="Upscale",
    heading="Super-Resolution",
    button="Upscale {}",
    icon="FULLSCREEN_ENTER",
    operator="upscale",
    command="upscale",
    fallback_model=DEFAULT_MODEL_PATH,
    check_session=check_session,
    output=Output(tag="upscaled", what="an upscaled image", product=IMAGE),
)
