"""Depth Anything 3: image in -> depth map (plus the model's other maps) out, at source resolution.

Export contract: one NCHW RGB input, RGB/255 then ImageNet mean/std. A fixed input
size in the model (the community export is 1x3x280x504) is used as is; otherwise DA3's own rule:
long side to `process_res`, each side rounded to a multiple of the patch size (14). Outputs:
`depth` (1x1xHxW, 1xHxW or HxW; the first output when none is called "depth") and any other
single-channel maps, e.g. `sky`, returned in `DepthResult.extras`.

Sky: upstream DA3's sky head ends in a ReLU and DA3 treats `sky >= 0.3` as sky, so a non-negative
`sky` output is returned raw. Exports documented as emitting logits exist too: with
`sky_activation="auto"` an output whose name contains "sky" and that has negative values
(impossible after a ReLU) is turned into a probability with a sigmoid. "sigmoid" and "none" force
either behaviour (the catalog should pass the export's known one, so frames of a sequence can
never switch between the two). Every other extra output is returned raw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ...runtime import SessionHandle, TensorInfo
from ...runtime.errors import InvalidModelOutputError, ModelContractError
from ..base import FLOAT_TYPES, RunOptions, check_contract, check_finite, squeeze_batch
from ..family import Family, Option, Output, Setting, one_of, positive_int, rgb_triple_or_none
from ..frame_loop import Frame, run_frames
from ..identify import LIKELY, NO, SURE, Match
from ..imaging import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    fit_multiple,
    normalization_constants,
    normalize,
    resize,
    resize_clipped,
    to_nchw,
)
from ..result_images import DEPTH

MODEL_NAME = "Depth Anything 3"
SKY_ACTIVATIONS = ("auto", "sigmoid", "none")
# a fixed-size model stretches the picture; past this aspect mismatch the user should know
ASPECT_WARNING = 0.10


@dataclass
class DepthResult:
    depth: np.ndarray  # HxW float32, source resolution, raw model units
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # name -> HxW float32
    model_size: tuple[int, int] = (0, 0)  # (height, width) actually fed to the model
    warnings: list[str] = field(default_factory=list)


def run(
    images,
    model_path,
    *,
    options: RunOptions | None = None,
    process_res: int = 504,
    multiple: int = 14,
    mean: Sequence[float] | None = IMAGENET_MEAN,
    std: Sequence[float] | None = IMAGENET_STD,
    sky_activation: str = "auto",
) -> DepthResult | list[DepthResult]:
    """Estimate depth for one image or a list of frames (one runtime operation)."""
    if int(process_res) <= 0 or int(multiple) <= 0:
        raise ValueError(f"process_res and multiple must be positive, got {process_res} and {multiple}")
    if sky_activation not in SKY_ACTIVATIONS:
        raise ValueError(f"sky_activation must be one of {SKY_ACTIVATIONS}, got {sky_activation!r}")
    mean, std = normalization_constants(mean, std)
    body = partial(
        _depth, process_res=int(process_res), multiple=int(multiple), mean=mean, std=std, sky_activation=sky_activation
    )
    return run_frames("da3", images, model_path, options, check=check_session, body=body)


def _depth(frame: Frame, *, process_res, multiple, mean, std, sky_activation) -> DepthResult:
    handle, depth_name = frame.handle, frame.contract
    image_input = handle.inputs[0]
    fixed = any(isinstance(d, int) and d > 0 for d in image_input.shape[2:4])
    frame.report(0.0, "preprocessing")
    prepared = frame.prepare()
    warnings = list(prepared.warnings)
    model_hw = _model_size(image_input, prepared.size, process_res, multiple)
    if fixed and _aspect_mismatch(prepared.size, model_hw) > ASPECT_WARNING:
        warnings.append(
            f"{handle.model_name} takes a fixed {model_hw[1]}x{model_hw[0]} input, so the "
            f"{prepared.size[1]}x{prepared.size[0]} image was stretched to it; depth near the "
            "edges may be less accurate. A model with a dynamic input size avoids this."
        )
    # trained on 8-bit photos: HDR values would push the normalised input off-distribution
    rgb = np.clip(prepared.rgb, 0.0, 1.0, out=prepared.rgb)  # our own copy, read nowhere else
    # antialiased cubic: DA3's own pipeline upsamples with cubic and shrinks with area
    resized = resize_clipped(rgb, model_hw, kernel="cubic")
    tensor = to_nchw(normalize(resized, mean, std), image_input.dtype)
    frame.report(0.2, frame.counter)
    outputs = frame.run({image_input.name: tensor})
    frame.report(0.8, "postprocessing")
    depth = _as_map(outputs[depth_name], handle.model_name, depth_name)
    check_finite(depth, handle.model_name, depth_name)
    extras = {}
    for name, array in outputs.items():
        if name == depth_name:
            continue
        extra = _as_map(array, handle.model_name, name, required=False)
        if extra is None:
            warnings.append(
                f"{handle.model_name}: output '{name}' with shape {list(np.shape(array))} is "
                "not a single-channel map and was not returned."
            )
            continue
        check_finite(extra, handle.model_name, name)
        if _wants_sigmoid(name, extra, sky_activation):
            extra = _sigmoid(extra)
        extras[name] = resize(extra, prepared.size, kernel="linear")
    # linear has no negative lobes: no overshoot, so depth stays within the model's range
    depth = resize(depth, prepared.size, kernel="linear")
    return DepthResult(depth, extras, tuple(model_hw), warnings)


def check_session(handle: SessionHandle) -> str:
    """The family's contract (ModelContractError when the model does not fit); the depth output's name."""
    check_contract(handle, MODEL_NAME, inputs=[{"rank": 4, "channels": 3, "types": FLOAT_TYPES}], outputs=[{}])
    return _validate(handle)


def _validate(handle: SessionHandle) -> str:
    """Check the contract beyond `check_contract` and return the depth output's name."""
    problems = []
    if len(handle.inputs) > 1:
        problems.append(f"expected 1 image input, found {len(handle.inputs)}")
    depth = next((o for o in handle.outputs if o.name.lower() == "depth"), handle.outputs[0])
    shape = list(depth.shape)
    if not (
        2 <= len(shape) <= 4
        and (len(shape) < 4 or not isinstance(shape[1], int) or shape[1] == 1)
        and depth.type in FLOAT_TYPES
    ):
        problems.append(
            f"expected a float depth output shaped 1x1xHxW, 1xHxW or HxW, found '{depth.name}' "
            f"with shape {shape} and type {depth.type}"
        )
    if problems:
        raise ModelContractError(
            f"{handle.model_name} does not look like a {MODEL_NAME} model: "
            + "; ".join(problems)
            + ". Choose a model exported for this family (see the add-on's model list)."
        )
    return depth.name


def _model_size(info: TensorInfo, source_hw, process_res: int, multiple: int) -> tuple[int, int]:
    """The model's fixed spatial size where it has one, DA3's resize rule where it does not."""
    natural = fit_multiple(source_hw[0], source_hw[1], process_res, multiple)
    dims = info.shape[2:4]
    return tuple(d if isinstance(d, int) and d > 0 else n for d, n in zip(dims, natural, strict=True))


def _aspect_mismatch(source_hw, model_hw) -> float:
    source = source_hw[1] / source_hw[0]
    model = model_hw[1] / model_hw[0]
    return abs(np.log(model / source))


def _as_map(array, model_name: str, output_name: str, *, required: bool = True) -> np.ndarray | None:
    """1x1xHxW / 1xHxW / HxW -> HxW float32; None (or an error when required) for other shapes."""
    array = np.asarray(array)
    squeezed = squeeze_batch(array, 2)
    if squeezed.ndim == 2 and min(squeezed.shape) > 0 and np.issubdtype(squeezed.dtype, np.floating):
        return squeezed.astype(np.float32)
    if not required:
        return None
    raise InvalidModelOutputError(
        f"{model_name} returned '{output_name}' with shape {list(array.shape)} and type {array.dtype}; "
        "expected one float depth map (1x1xHxW, 1xHxW or HxW). The model may not be a DA3 export."
    )


def _wants_sigmoid(name: str, values: np.ndarray, mode: str) -> bool:
    if mode == "none" or "sky" not in name.lower():
        return False
    return mode == "sigmoid" or bool((values < 0).any())


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # written on exp(-|x|) so large logits of either sign cannot overflow
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.float32)


def identify(model) -> Match:
    """An output named 'depth'; without the name, one plane at the input size, positive and
    unbounded on a probe (a matte stays within [0, 1])."""
    if "depth" in model.output_names:
        return Match(SURE, "an output named 'depth'")
    plane = model.plane()
    if plane is not None and plane.finite and plane.low > 0.0 and plane.high > 1.0:
        return Match(LIKELY, f"one channel ('{plane.name}') at the input size, unbounded and positive ({plane.span})")
    return NO


FAMILY = Family(
    id="da3",
    title="Depth Anything 3 depth",
    produces="a float depth map",  # the plane is an option of the Blender operator only
    run=run,
    identify=identify,
    looks="a depth model",
    identify_rank=20,
    settings=(
        Setting("process_res", positive_int),
        Setting("patch_multiple", positive_int, keyword="multiple"),
        Setting("mean", rgb_triple_or_none),
        Setting("std", rgb_triple_or_none),
        Setting("sky_activation", one_of(*SKY_ACTIVATIONS)),
    ),
    user_defaults={"process_res": 504, "patch_multiple": 14, "mean": IMAGENET_MEAN, "std": IMAGENET_STD},
    options=(
        Option(
            "make_plane",
            bool,
            False,
            "Make Plane",
            "Also add a plane with the image's aspect, displaced by the depth map",
            to_adapter=False,
            blender_only=True,
        ),
    ),
    action="Estimate Depth",
    heading="Depth",
    button="Estimate Depth of {}",
    icon="IMAGE_ZDEPTH",
    operator="estimate_depth",
    command="depth",
    check_session=check_session,
    shot=frozenset({"depth"}),
    output=Output(tag="depth", what="depth", product=DEPTH),
)
