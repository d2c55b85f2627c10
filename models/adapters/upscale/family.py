"""Upscale family: any ONNX super-resolution model (Real-ESRGAN and friends, or the embedded
bicubic x2 graph), tiled so that image size never decides memory use. This module is the family's
face: its record (FAMILY), its entry (`run`: the arguments checked, the frames run by job.py's
UpscaleJob) and its contract.

Contract (read from the session): input rank 4, 3 channels, float or float16 (RGB in [0, 1]);
output rank 4, 3 channels, an integer multiple of the input size. Fixed-shape exports are fed
exactly their size; dynamic ones get tiles sized from a memory budget (see models/tiles/tiling.py).
How the alpha goes through: frame_input.py.
"""

from __future__ import annotations

from ...base import FLOAT_TYPES, RunOptions, check_contract
from ...family import Family, Option, Output, Setting, non_negative_int, one_of, positive_int
from ...frame_loop import run_frames
from ...result_images import IMAGE
from .frame_input import ALPHA_MODES, DEFAULT_MODEL_PATH
from .job import UpscaleJob
from .plan import AUTO, AUTO_OVERLAP
from .result import UpscaleResult
from .runs import identify

OPERATION_NAME = "upscale"
MODEL_NAME = "super-resolution"  # as messages name the model: "a super-resolution model"


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
    run; see plan.py auto_tile), an int (window side in input pixels, overlap included), or
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
    job = UpscaleJob(
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
