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

from ...runtime.errors import (
    InferenceError,
    InferenceOutOfMemoryError,
    ModelContractError,
    SessionClosedError,
)
from ...runtime.measure.budget import budget_for
from ...runtime.measure.memory import available_system_memory_bytes
from ..base import FLOAT_TYPES, JobOptions, check_contract, check_finite, fixed_hw
from ..family import Family, Option, Output, Setting, non_negative_int, one_of, positive_int
from ..frame_loop import run_frames
from ..imaging import from_nchw, resize, to_nchw
from ..result_images import ColourImage
from ..tiles.feather import feather_floor
from ..tiles.receptive import graph_receptive_field
from ..tiles.tiling import refuse_oversized_result, run_tiled, tile_floor, whole_scale
from .upscale_plan import (
    AUTO,
    AUTO_OVERLAP,
    auto_tile_for_frame,
    impulse_probe,
    plan_overlap,
    receptive_field,
    split_warning,
)

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
    feather: int = 0  # > 0: tile seams were blended over 2 * feather px (deep nets: not exact)
    input_kind: str = "8-bit"  # the source's samples: "8-bit", "16-bit" or "float"

    @property
    def seams(self) -> str:
        """How the tiles were joined, in one word for reports and JSON."""
        return "exact" if self.exact else ("feathered (not exact)" if self.feather else "cropped (not exact)")


def run(
    images,
    model_path=DEFAULT_MODEL_PATH,
    *,
    options: JobOptions | None = None,
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
    A radius over MAX_EXACT_RADIUS (deep nets: RRDBNet's 349 px) gets FEATHER_OVERLAP instead,
    seams blended, and the result says it is not exact (`exact`, `seams`, a warning).
    `size_multiple`: round dynamic windows up to this (models that need even sizes, say).
    `available_memory_bytes`: what a frame's result may take (default: the memory the OS says is
    available when the frame starts); a frame whose float32 result is larger is refused
    (InvalidImageError) before any run of it.
    """
    if alpha_mode not in ALPHA_MODES:
        raise ValueError(f"alpha_mode must be one of {ALPHA_MODES}, got {alpha_mode!r}")
    if isinstance(tile_size, str) and tile_size != "auto":
        raise ValueError(f"tile_size must be 'auto', an int or None, got {tile_size!r}")
    if isinstance(tile_size, (bool, float)):
        raise ValueError(f"tile_size must be 'auto', an int or None, got {tile_size!r}")
    if isinstance(tile_size, int) and tile_size < 0:  # the Tile Size option's min (FAMILY below)
        raise ValueError(f"tile_size must be >= 0 (0 or 'auto': a fixed size per device), got {tile_size}")
    if tile_size == 0:  # what the artist's "Tile Size 0" means
        tile_size = "auto"
    options = options or JobOptions()
    if overlap is not None and int(overlap) < AUTO_OVERLAP:
        raise ValueError(f"overlap must be >= 0 ({AUTO_OVERLAP}: the model's receptive radius), got {overlap}")
    options.report(0.0, "loading model")
    job = _Upscale(tile_size, overlap, model_overlap, alpha_mode, memory_budget_bytes, size_multiple, available_memory_bytes)
    return run_frames(OPERATION_NAME, images, model_path, options, check=check_session, start=job.start, body=job.frame)


class _Upscale:
    """One upscale job: its tile plan, made once the session is open, and each frame's body."""

    def __init__(self, tile_size, overlap, model_overlap, alpha_mode, memory_budget_bytes, size_multiple, available):
        self.tile_size, self.overlap, self.model_overlap = tile_size, overlap, model_overlap
        self.alpha_mode, self.memory_budget_bytes = alpha_mode, memory_budget_bytes
        self.size_multiple, self.available_memory_bytes = size_multiple, available

    def start(self, loop) -> None:
        job = self.job = _Job(loop)
        loop.at_end(job.close)  # its buffers are back before the operation ends
        runtime = loop.runtime
        tile_size, overlap, size_multiple = self.tile_size, self.overlap, self.size_multiple
        in_info = job.handle.inputs[0]
        dtype = self.dtype = in_info.dtype
        fixed = self.fixed = fixed_hw(in_info.shape)
        scale = self.scale = _static_scale(job.handle)  # what the tiler checks every tile against
        job.scale = scale or _scale_hint(job.handle)  # what outputs are bound with from the first run
        job.hinted = scale is None and job.scale is not None

        def probe():
            def infer(window):
                output = job.infer(to_nchw(window, dtype), last=False, slot="probe")
                return from_nchw(check_finite(output, job.handle.model_name, job.handle.outputs[0].name))

            return impulse_probe(infer, scale=scale, fixed=fixed)

        field = receptive_field(job.handle.model_path, self.model_overlap, probe)
        planned = self.planned = plan_overlap(job.handle.model_name, field, overlap, size_multiple)
        overlap = planned.overlap
        plan_warnings = self.plan_warnings = list(planned.warnings)
        if fixed is not None:
            tile = fixed
            if isinstance(tile_size, int) and (tile_size, tile_size) != fixed:
                plan_warnings.append(
                    f"{job.handle.model_name} takes a fixed {fixed[1]}x{fixed[0]} input; "
                    f"tile size {tile_size} was ignored."
                )
            if 2 * overlap + 8 > min(fixed):
                overlap = max(0, (min(fixed) - 8) // 2)
                plan_warnings.append(
                    f"Overlap reduced to {overlap} px to fit the model's {fixed[1]}x{fixed[0]} input."
                )
                planned.exact = planned.covers(overlap)
            # a fixed window cannot grow: the ramps must fit its core (models/tiles/feather.py)
            planned.feather = min(planned.feather, overlap, max(0, (min(fixed) - 2 * overlap) // 4))
        elif tile_size == "auto":
            if self.memory_budget_bytes is None:  # the job's RAM or VRAM budget, by where the session runs
                self.memory_budget_bytes = budget_for(runtime, job.handle.gpu_device_id)
            tile = AUTO  # sized per frame below, from the model's measured working memory
        elif tile_size is None:
            tile = None
        else:
            tile = int(tile_size)
            # feathered seams need room for their ramps inside each tile (models/tiles/feather.py)
            floor = max(tile_floor(overlap), feather_floor(overlap, planned.feather) if planned.feather else 0)
            if tile < floor:
                plan_warnings.append(
                    f"Tile size {tile} is below the minimum for a {overlap} px overlap; using {floor}."
                )
                tile = floor
        self.tile, self.overlap, self.auto_sized = tile, overlap, False

    def frame(self, frame) -> UpscaleResult:
        job, runtime, options = self.job, frame.loop.runtime, frame.loop.options
        planned, fixed, overlap, dtype = self.planned, self.fixed, self.overlap, self.dtype
        tile, auto_sized, scale = self.tile, self.auto_sized, self.scale
        index, count, name = frame.index, frame.loop.count, frame.label
        prefix = "" if frame.loop.single else f"{frame.counter}, "
        options.report(index / count, prefix + "preprocessing")
        available = self.available_memory_bytes
        if available is None:
            available = available_system_memory_bytes()  # one read per frame, for both checks
        known = scale or job.scale
        shape = np.shape(frame.image)
        if known and len(shape) in (2, 3):  # else the tiler refuses it before allocating it
            channels = 4 if len(shape) == 3 and shape[2] in (2, 4) else 3
            # before even the float32 copy of the input: that alone can be gigabytes
            refuse_oversized_result(*shape[:2], known, channels, label=job.handle.model_name, available=available)
        if tile is AUTO or auto_sized:
            auto_sized = True  # until a split shows the size that fits: then that size stays
            tile = auto_tile_for_frame(job, runtime, overlap, planned.feather, self.memory_budget_bytes, shape[:2])
        # auto windows all of one shape (no larger than the frame): one memory plan in ORT
        uniform = auto_sized and tile is not None and fixed is None and len(shape) >= 2
        window = tile
        if uniform:  # an axis the window spans whole is one piece (its core is the frame)
            window = tuple(tile if tile < side else side + 2 * overlap for side in shape[:2])
        prepared = frame.prepare()
        warnings = list(self.plan_warnings) + list(prepared.warnings)
        rgb, alpha = prepared.rgb, prepared.alpha
        # min and max first: two reads and no masks for the usual in-range image
        outside = 0 if rgb.min() >= 0.0 and rgb.max() <= 1.0 else int(((rgb < 0.0) | (rgb > 1.0)).any(axis=2).sum())
        if outside:
            np.clip(rgb, 0.0, 1.0, out=rgb)  # prepare_image's array is always our own copy
            warnings.append(
                f"{name}: {outside} pixel(s) outside [0, 1] (HDR or negative) were clipped for the model."
            )
        alpha_constant = None
        if alpha is not None and float(alpha.min()) == float(alpha.max()):
            alpha_constant = float(alpha.min())  # no run needed to upscale a flat alpha
        model_alpha = alpha is not None and alpha_constant is None and self.alpha_mode == "model"
        source = np.concatenate([rgb, alpha[:, :, None]], axis=2) if model_alpha else rgb
        input_kind = prepared.kind
        del rgb, prepared  # only `source` (and `alpha`) are needed from here on

        def run_tile(window, last, _model_alpha=model_alpha):
            colour = job.infer(to_nchw(window[:, :, :3], dtype), last=last and not _model_alpha)
            if not _model_alpha:
                return colour  # 1x3xHxW: the tiler pastes it transposed, in one pass
            grey = np.repeat(window[:, :, 3:4], 3, axis=2)
            matte = job.infer(to_nchw(grey, dtype), last=last, slot="alpha")
            return np.concatenate([from_nchw(colour), from_nchw(matte).mean(axis=2, keepdims=True)], axis=2)

        def progress(fraction, done, total):
            options.report((index + fraction) / count, f"{prefix}tile {done}/{total}")

        tiled = run_tiled(
            source,
            run_tile,
            tile_size=window,
            overlap=overlap,
            fixed=fixed is not None,
            last=frame.last,
            scale=scale,
            label=job.handle.model_name,
            events=runtime.events,
            on_split=job.reacquire,
            progress=progress,
            multiple=self.size_multiple,
            clip=(0.0, 1.0),
            not_finite=lambda result: check_finite(result, job.handle.model_name, job.handle.outputs[0].name),
            available_memory=available,
            feather=planned.feather,
            uniform=uniform,
        )
        del source
        frame.op.check_cancelled()
        scale = self.scale = tiled.scale  # known from here on, for the next frames too
        if tiled.splits:
            tile = tiled.tile_size  # the size that fitted; no use retrying the bigger one
            auto_sized = False
            warnings.append(split_warning(tiled, exact=planned.exact))
        self.tile, self.auto_sized = tile, auto_sized
        image = tiled.image  # clipped to [0, 1] as each tile was pasted
        if alpha is not None and not model_alpha:
            out_h, out_w = image.shape[:2]
            if alpha_constant is not None:
                matte = np.full((out_h, out_w, 1), alpha_constant, np.float32)
            else:
                matte = np.clip(resize(alpha, (out_h, out_w), "cubic"), 0.0, 1.0)[:, :, None]
            image = np.concatenate([image, matte], axis=2)
        exact = planned.exact or (tiled.tiles_run == 1 and not tiled.splits)
        if exact and not planned.exact:  # one window: no seam, so the plan's "not exact" is moot
            warnings = [w for w in warnings if w not in planned.warnings]
        return UpscaleResult(
            image,
            int(scale),
            int(max(tiled.window_ran)),
            overlap=overlap,
            receptive_radius=planned.radius,
            exact=exact,
            warnings=warnings,
            feather=0 if tiled.tiles_run == 1 else planned.feather,
            input_kind=input_kind,
        )


class _Job:
    """The model runs of one upscale operation: the buffers its outputs are written into, and
    the scale they are bound with."""

    def __init__(self, loop):
        self.loop = loop
        self.op = loop.op
        self.scale: int | None = None  # known from fixed shapes, a hint, or the first output
        self.hinted = False  # `scale` is only a hint (`_scale_hint`), not yet seen in an output
        self.told_plan: tuple | None = None  # the auto tile plan last emitted as a `tile_plan` event
        self._buffers: dict[str, np.ndarray] = {}  # slot -> flat buffer from runtime.scratch

    @property
    def handle(self):
        return self.loop.handle

    def _buffer(self, slot: str, shape: tuple, dtype) -> np.ndarray:
        """The slot's buffer as a C-contiguous `shape` (a prefix of it: an edge tile's smaller
        output fits the buffer of a full one), a larger one taken when it does not fit."""
        count = math.prod(shape)
        flat = self._buffers.get(slot)
        if flat is None or flat.dtype != np.dtype(dtype) or flat.size < count:
            if flat is not None:
                self.op.runtime.scratch.give(flat)
            flat = self._buffers[slot] = self.op.runtime.scratch.take(count, dtype)
        return flat[:count].reshape(shape)

    def close(self) -> None:
        """The job's buffers back to the runtime, to be kept warm or let go (runtime/release/scratch.py)."""
        for flat in self._buffers.values():
            self.op.runtime.scratch.give(flat)
        self._buffers.clear()

    def reacquire(self, _tile, _error: InferenceOutOfMemoryError) -> None:
        self.loop.reacquire()

    def infer(self, feed: np.ndarray, *, last: bool, slot: str = "colour") -> np.ndarray:
        """The model's 1x3xHxW output for a 1x3xhxw feed. Once the scale is known (or hinted:
        `_scale_hint`) the output is written by the runtime straight into a buffer this job owns
        (one per `slot`, reused from tile to tile: the tiler pastes it before the next run), so
        nothing is copied out of the arena and no new array is made per tile. Unknown, the output
        comes out of the arena and is copied (and the arena needs a release run of its own)."""
        handle = self.handle
        in_name, out_name = handle.inputs[0].name, handle.outputs[0].name
        out = None
        if self.scale is not None:
            shape = (1, 3, feed.shape[2] * self.scale, feed.shape[3] * self.scale)
            out = {out_name: self._buffer(slot, shape, handle.outputs[0].dtype)}
        try:
            output = self.op.run(handle, {in_name: feed}, last=last, output_names=[out_name], out=out)[out_name]
        except InferenceError as exc:
            if out is None or isinstance(exc, SessionClosedError) or not self.hinted:
                raise
            # a hinted scale this input does not have (a model whose factor depends on the size):
            # run it unbound, as if nothing were known, and learn the scale from its output
            _LEARNED_SCALE.pop(handle.key, None)
            self.scale, self.hinted = None, False
            return self.infer(feed, last=last, slot=slot)
        if output.ndim != 4 or output.shape[1] != 3:
            raise ModelContractError(
                f"{handle.model_name} returned '{out_name}' with shape {list(output.shape)}; an upscale "
                "model must return 1x3xHxW."
            )
        # NaN/Inf: the tiler checks each tile's owned part while it pastes it (`not_finite`)
        self.hinted = False  # an output of the hinted scale came back: it is the model's
        if self.scale is None and output.shape[2] % feed.shape[2] == 0:
            found = output.shape[2] // feed.shape[2]
            if output.shape[3] == feed.shape[3] * found:  # else the tiler reports the contract error
                self.scale = found
                if fixed_hw(handle.outputs[0].shape) is None:  # a fixed output's factor varies
                    _remember(handle.key, found)
        return output


# The scale each cached session showed (by its cache key: model file identity, device, settings),
# so the next job binds even its first run's output into its own buffer: that run would otherwise
# return the output in arena memory, to be copied out (200 MB for a 1024 px input at x4) and
# released by a run of its own.
_LEARNED_SCALE: dict[tuple, int] = {}
_LEARNED_MAX = 64


def _learned(handle) -> int | None:
    return _LEARNED_SCALE.get(handle.key)


def _remember(key: tuple, scale: int) -> None:
    if len(_LEARNED_SCALE) >= _LEARNED_MAX and key not in _LEARNED_SCALE:
        _LEARNED_SCALE.pop(next(iter(_LEARNED_SCALE)))  # the oldest: a bound, not an eviction policy
    _LEARNED_SCALE[key] = scale


def _scale_hint(handle) -> int | None:
    """The scale to bind the first run's output with before any output was seen: the one this
    session showed before, else the one the graph walk read (Conv strides, DepthToSpace, Resize
    factors). A wrong hint costs one failed run (`_Job.infer` retries unbound), never a result."""
    learned = _learned(handle)
    if learned is not None:
        return learned
    field_ = graph_receptive_field(handle.model_path)
    walked = field_.scale
    if field_.radius is None or field_.is_global or walked is None or walked < 1 or not float(walked).is_integer():
        return None
    return int(walked)


def check_session(handle) -> None:
    """The family's contract: ModelContractError when the model is not an RGB-to-RGB NCHW net."""
    check_contract(
        handle,
        MODEL_NAME,
        inputs=[{"rank": 4, "channels": 3, "types": FLOAT_TYPES}],
        outputs=[{"rank": 4, "channels": 3, "types": FLOAT_TYPES}],
    )


def _static_scale(handle) -> int | None:
    """The scale from fixed input/output shapes, when the model declares both."""
    fixed_in, fixed_out = fixed_hw(handle.inputs[0].shape), fixed_hw(handle.outputs[0].shape)
    if fixed_in is None or fixed_out is None:
        return None
    return whole_scale(fixed_in, fixed_out, handle.model_name)


FAMILY = Family(
    id="upscale",
    title="super-resolution",
    produces="the image at the model's scale (x2 with the built-in bicubic model)",
    run=run,
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
            "Side of the tiles the image is cut into, in pixels. 0: sized from the working memory the model "
            "was measured to take (2 GB per tile on CPU, 4 GB on a GPU, less under a memory budget; made "
            "smaller only when memory runs short)",
            min=0,
            soft_max=2048,
            alias="tile",
        ),
        Option(
            "overlap",
            int,
            AUTO_OVERLAP,
            "Overlap",
            "Context pixels around each tile. -1: the model's receptive radius, so tiles give exactly "
            "the pixels of one whole-image run when the radius is read from the model's graph (a "
            "measured one is not proven: a warning says so, as when set below it)",
            min=AUTO_OVERLAP,
            soft_max=256,
        ),
    ),
    action="Upscale",
    icon="FULLSCREEN_ENTER",
    operator="upscale",
    command="upscale",
    fallback_model=DEFAULT_MODEL_PATH,
    check_session=check_session,
    output=Output(tag="upscaled", what="an upscaled image", suffix=".png", float_suffix=".exr", image=ColourImage("image")),
)
