"""BEN2 background removal: image in -> matte (and RGBA cut-out) out, at the source resolution.

Export contract: one NCHW RGB input (1x3x1024x1024 in the public exports, float32
or float16), resized as BEN2's `inference` does (Pillow's LANCZOS, on uint8 for an 8-bit picture)
and normalised with per-export constants (the catalog passes `mean`/`std`; mean 0 and std 1 mean
plain /255); one 1-channel matte output (Nx1xHxW or NxHxW). As upstream's `postprocess_image`, the
raw output is resized to the source size (bilinear, no antialias), then min-max normalised; the
matte stays float (upstream truncates it to uint8) and is multiplied into the source alpha.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from ...runtime.errors import InvalidModelOutputError, ModelContractError
from ..base import FLOAT_TYPES, RunOptions, check_contract, check_finite, squeeze_batch
from ..family import Family, Option, Output, Setting, rgb_triple_or_none, size_or_none
from ..frame_loop import Frame, run_frames
from ..identify import LIKELY, NO, SURE, Match, spatial
from ..imaging import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    normalization_constants,
    normalize,
    to_nchw,
)
from ..result_images import MASK
from .resampling import pil_lanczos, torch_bilinear

if TYPE_CHECKING:  # the families' table loads this module in Blender's process too, which loads no runtime
    from ...runtime import SessionHandle, TensorInfo

MODEL_NAME = "BEN2"
DEFAULT_INPUT_SIZE = 1024

# Below this spread the output carries no foreground/background boundary: min-max normalising it
# would blow float noise (an fp16 ulp near 1.0 is ~5e-4) up into a full 0..1 matte.
CONSTANT_RANGE = 1e-3


@dataclass
class MatteResult:
    matte: np.ndarray  # HxW float32 in [0, 1], source resolution
    rgba: np.ndarray  # HxWx4 float32: source RGB, alpha = matte * source alpha
    warnings: list[str] = field(default_factory=list)
    input_kind: str = "8-bit"  # the source's samples: "8-bit", "16-bit" or "float"


def run(
    images,
    model_path,
    *,
    options: RunOptions | None = None,
    mean: Sequence[float] | None = IMAGENET_MEAN,
    std: Sequence[float] | None = IMAGENET_STD,
    input_size: int | Sequence[int] | None = None,
) -> MatteResult | list[MatteResult]:
    """Remove the background of one image or of a list of frames (one runtime operation).

    `input_size` (int or (height, width)) is used only when the model's input size is dynamic;
    a fixed size in the model always wins. `mean`/`std` of None mean 0 and 1 (plain /255).
    """
    mean, std = normalization_constants(mean, std)
    body = partial(_cut_out, mean=mean, std=std, input_size=input_size)
    return run_frames("ben2", images, model_path, options, check=_validate, body=body)


def _cut_out(frame: Frame, *, mean, std, input_size) -> MatteResult:
    handle, matte_output = frame.handle, frame.contract
    model_hw = _model_size(handle.inputs[0], input_size)
    frame.report(0.0, "preprocessing")
    prepared = frame.prepare()
    tensor = to_nchw(normalize(_model_input(prepared, model_hw), mean, std), handle.inputs[0].dtype)
    frame.report(0.2, frame.counter)
    outputs = frame.run({handle.inputs[0].name: tensor}, output_names=[matte_output.name])
    frame.report(0.8, "postprocessing")
    raw = _as_map(outputs[matte_output.name], handle.model_name, matte_output.name)
    # upstream's postprocess_image: bilinear to the source size (no antialias), then min-max
    matte, warning = _normalise_matte(torch_bilinear(raw, prepared.size, antialias=False), handle.model_name)
    alpha = matte if prepared.alpha is None else matte * prepared.alpha
    rgba = np.concatenate([prepared.rgb, alpha[:, :, None]], axis=2).astype(np.float32, copy=False)
    warnings = list(prepared.warnings) + ([warning] if warning else [])
    return MatteResult(matte.astype(np.float32, copy=False), rgba, warnings, prepared.kind)


def _model_input(prepared, model_hw) -> np.ndarray:
    """HxWx3 float32 in [0, 1] at the model's size: upstream's Pillow LANCZOS resize, on uint8 (to
    the level) where the source is 8-bit."""
    if prepared.kind == "8-bit":
        picture = np.rint(prepared.rgb * np.float32(255.0)).astype(np.uint8)  # the source's own values
        return pil_lanczos(picture, model_hw).astype(np.float32) / np.float32(255.0)
    # trained on 8-bit photos: HDR values would push the normalised input off-distribution
    rgb = np.clip(prepared.rgb, 0.0, 1.0)
    return np.clip(pil_lanczos(rgb, model_hw), 0.0, 1.0)


def _validate(handle: SessionHandle) -> TensorInfo:
    """Check the contract and pick the matte output (its name varies between exports)."""
    check_contract(
        handle,
        MODEL_NAME,
        inputs=[{"rank": 4, "channels": 3, "types": FLOAT_TYPES}],
        outputs=[{}],
    )
    if len(handle.inputs) > 1:
        extra = ", ".join(f"'{i.name}'" for i in handle.inputs[1:])
        raise ModelContractError(
            f"{handle.model_name} does not look like a {MODEL_NAME} model: expected 1 image input, "
            f"found {len(handle.inputs)} (also {extra}). Choose a model exported for this family."
        )
    chosen = next((o for o in handle.outputs if _is_matte_shape(o.shape)), handle.outputs[0])
    rank = len(chosen.shape)
    single_channel = rank == 3 or (
        rank == 4 and (not isinstance(chosen.shape[1], int) or chosen.shape[1] == 1)
    )
    if not single_channel or chosen.type not in FLOAT_TYPES:
        raise ModelContractError(
            f"{handle.model_name} does not look like a {MODEL_NAME} model: expected a float matte output "
            f"shaped Nx1xHxW or NxHxW, found output '{chosen.name}' with shape {list(chosen.shape)} "
            f"and type {chosen.type}. Choose a model exported for this family."
        )
    return chosen


def _is_matte_shape(shape) -> bool:
    return len(shape) == 4 and shape[1] == 1


def _model_size(info: TensorInfo, requested) -> tuple[int, int]:
    """The model's own spatial size where it is fixed; `requested` (or 1024) where it is not."""
    if requested is None:
        fallback = (DEFAULT_INPUT_SIZE, DEFAULT_INPUT_SIZE)
    elif isinstance(requested, (int, np.integer)):
        fallback = (int(requested), int(requested))
    else:
        fallback = tuple(int(v) for v in requested)
        if len(fallback) != 2:
            raise ValueError(f"input_size must be an int or (height, width), got {requested!r}")
    if min(fallback) <= 0:
        raise ValueError(f"input_size must be positive, got {requested!r}")
    dims = info.shape[2:4]
    return tuple(d if isinstance(d, int) and d > 0 else f for d, f in zip(dims, fallback, strict=True))


def _as_map(array: np.ndarray, model_name: str, output_name: str) -> np.ndarray:
    """Nx1xHxW / NxHxW / HxW (batch 1) -> HxW float32, finite."""
    array = np.asarray(array)
    squeezed = squeeze_batch(array, 2)
    if squeezed.ndim != 2 or min(squeezed.shape) == 0:
        raise InvalidModelOutputError(
            f"{model_name} returned '{output_name}' with shape {list(array.shape)}; expected one "
            "1xHxW matte. The model may not be a BEN2 export."
        )
    check_finite(squeezed, model_name, output_name)
    return squeezed.astype(np.float32)


def _normalise_matte(raw: np.ndarray, model_name: str) -> tuple[np.ndarray, str | None]:
    """Min-max normalise to [0, 1]; a constant output becomes all 0 or all 1 with a warning."""
    low = float(raw.min())
    high = float(raw.max())
    if high - low > CONSTANT_RANGE:
        return ((raw - low) / (high - low)).astype(np.float32), None
    # the export ends in a sigmoid, so 0.5 is the natural decision point for a flat answer
    value = (low + high) / 2.0
    keep = value >= 0.5
    matte = np.full(raw.shape, 1.0 if keep else 0.0, np.float32)
    return matte, (
        f"{model_name} returned a constant matte (value {value:.4g}): no foreground/background "
        f"boundary was found, so the whole image was treated as "
        f"{'foreground (fully kept)' if keep else 'background (fully transparent)'}. "
        "Check the model's normalisation constants in the model list."
    )


def identify(model) -> Match:
    """One channel ending in a Sigmoid (seen through shape-only ops); without one, a plane at the
    input size that stays within [0, 1] on a probe."""
    for out in model.outputs:
        dims = spatial(out.shape)
        if dims is not None and dims[0] == 1 and model.ops.get(out.name) == "Sigmoid" and model.input_hw:
            return Match(SURE, f"one channel ('{out.name}') ending in a Sigmoid")
    plane = model.plane()
    if plane is None or not plane.finite:
        return NO
    if plane.op == "Sigmoid":
        return Match(SURE, f"one channel ('{plane.name}') ending in a Sigmoid")
    if 0.0 <= plane.low and plane.high <= 1.0:
        return Match(LIKELY, f"one channel ('{plane.name}') at the input size within [0, 1] ({plane.span})")
    return NO


FAMILY = Family(
    id="ben2",
    title="BEN2 background removal",
    produces="a cut-out: the image with the subject's matte as its alpha",
    run=run,
    identify=identify,
    looks="a background-removal (matte) model",
    identify_rank=40,
    settings=(
        Setting("mean", rgb_triple_or_none),
        Setting("std", rgb_triple_or_none),
        Setting("input_size", size_or_none),
    ),
    user_defaults={"mean": IMAGENET_MEAN, "std": IMAGENET_STD},
    options=(
        Option(
            "replace",
            bool,
            False,
            "Replace",
            "Write the cut-out into the source image instead of a new image",
            to_adapter=False,
            blender_only=True,
        ),
    ),
    action="Remove Background",
    heading="Background Removal",
    button="Remove Background from {}",
    icon="IMAGE_RGB_ALPHA",
    operator="remove_background",
    command="remove-background",
    check_session=_validate,
    output=Output(tag="cutout", what="a cut-out", product=MASK),
)
