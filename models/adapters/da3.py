"""Depth Anything 3: image in -> depth map (plus the model's other maps) out, at source resolution.

Export contract: one NCHW RGB input, RGB/255 then ImageNet mean/std, resized as DA3's own
InputProcessor does (`resize_like_upstream`: OpenCV's area when shrinking, cubic when enlarging, the
long side to `process_res` then each side to a multiple of the patch size, on uint8 for an 8-bit
picture). A fixed input size in the model (the community export is 1x3x280x504) is used as is; a
picture of another aspect is stretched to it (`fixed_fit="stretch"`, the default: on DA3-SMALL it
stays closer to upstream's run at the picture's own aspect than a letterbox does, see
docs/models.md) or letterboxed (`fixed_fit="letterbox"`), and the result's warning says which.
Outputs:
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
from typing import TYPE_CHECKING

import numpy as np

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
    to_nchw,
)
from ..result_images import DEPTH
from .resampling import cv2_resize

if TYPE_CHECKING:  # the families' table loads this module in Blender's process too, which loads no runtime
    from ...runtime import SessionHandle, TensorInfo

MODEL_NAME = "Depth Anything 3"
SKY_ACTIVATIONS = ("auto", "sigmoid", "none")
# past this aspect mismatch a fixed-size model gets the picture letterboxed (or stretched, by
# choice) and the user is told; below it the stretch is of the size of upstream's own rounding
ASPECT_WARNING = 0.10
FIXED_FITS = ("letterbox", "stretch")


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
    fixed_fit: str = "stretch",
) -> DepthResult | list[DepthResult]:
    """Estimate depth for one image or a list of frames (one runtime operation)."""
    if int(process_res) <= 0 or int(multiple) <= 0:
        raise ValueError(f"process_res and multiple must be positive, got {process_res} and {multiple}")
    if sky_activation not in SKY_ACTIVATIONS:
        raise ValueError(f"sky_activation must be one of {SKY_ACTIVATIONS}, got {sky_activation!r}")
    if fixed_fit not in FIXED_FITS:
        raise ValueError(f"fixed_fit must be one of {FIXED_FITS}, got {fixed_fit!r}")
    mean, std = normalization_constants(mean, std)
    body = partial(
        _depth,
        process_res=int(process_res),
        multiple=int(multiple),
        mean=mean,
        std=std,
        sky_activation=sky_activation,
        fixed_fit=fixed_fit,
    )
    return run_frames("da3", images, model_path, options, check=check_session, body=body)


def _depth(frame: Frame, *, process_res, multiple, mean, std, sky_activation, fixed_fit) -> DepthResult:
    handle, depth_name = frame.handle, frame.contract
    image_input = handle.inputs[0]
    frame.report(0.0, "preprocessing")
    prepared = frame.prepare()
    warnings = list(prepared.warnings)
    placement = _placement(image_input, prepared.size, process_res, multiple, fixed_fit)
    if placement.warning:
        warnings.append(placement.warning.format(model=handle.model_name))
    rgb = _model_input(prepared, placement, process_res)
    tensor = to_nchw(normalize(rgb, mean, std), image_input.dtype)
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
        extras[name] = resize(placement.crop(extra), prepared.size, kernel="linear")
    # linear has no negative lobes: no overshoot, so depth stays within the model's range
    depth = resize(placement.crop(depth), prepared.size, kernel="linear")
    return DepthResult(depth, extras, tuple(placement.model_hw), warnings)


@dataclass(frozen=True)
class Placement:
    """Where the picture goes in the model's input: the whole input (`content` = `model_hw`,
    stretched when a fixed size has another aspect) or a centred window of the source's aspect
    (letterbox: the rest is padded and the outputs are cropped back to the window)."""

    model_hw: tuple[int, int]
    content: tuple[int, int]
    offset: tuple[int, int] = (0, 0)
    warning: str = ""

    def crop(self, plane: np.ndarray) -> np.ndarray:
        if plane.shape[:2] != tuple(self.model_hw) or self.content == self.model_hw:
            return plane  # an output at another size than the input carries no window to crop
        (top, left), (h, w) = self.offset, self.content
        return plane[top : top + h, left : left + w]


def _placement(info: TensorInfo, source_hw, process_res: int, multiple: int, fixed_fit: str) -> Placement:
    model_hw = _model_size(info, source_hw, process_res, multiple)
    fixed = any(isinstance(d, int) and d > 0 for d in info.shape[2:4])
    if not fixed or _aspect_mismatch(source_hw, model_hw) <= ASPECT_WARNING:
        # a dynamic model's multiple-of-14 rounding (or a fixed size of nearly the same aspect)
        # stretches the picture a little, exactly as upstream's own rounding does
        return Placement(model_hw, model_hw)
    size = f"{source_hw[1]}x{source_hw[0]}"
    fixed_size = f"{model_hw[1]}x{model_hw[0]}"
    if fixed_fit == "stretch":
        return Placement(
            model_hw,
            model_hw,
            warning=f"{{model}} takes a fixed {fixed_size} input, so the {size} image was stretched to it "
            "(fixed_fit='stretch'); depth near the edges may be less accurate. A model with a dynamic "
            "input size avoids this.",
        )
    scale = min(model_hw[0] / source_hw[0], model_hw[1] / source_hw[1])
    content = tuple(min(m, max(1, round(s * scale))) for s, m in zip(source_hw, model_hw, strict=True))
    offset = tuple((m - c) // 2 for m, c in zip(model_hw, content, strict=True))
    return Placement(
        model_hw,
        content,
        offset,
        warning=f"{{model}} takes a fixed {fixed_size} input: the {size} image was fitted into it at "
        f"{content[1]}x{content[0]} with its aspect kept, the rest padded, and the depth cropped back "
        "(fixed_fit='letterbox'); a model with a dynamic input size sees more detail.",
    )


def _model_input(prepared, placement: Placement, process_res: int) -> np.ndarray:
    """HxWx3 float32 in [0, 1] at the model's size: DA3's own resize of the picture into the
    placement's window (uint8 where the source is 8-bit, as upstream's cv2 works on 8-bit
    photos), the padding at the ImageNet mean (0 once normalised)."""
    if prepared.kind == "8-bit":
        picture = np.rint(prepared.rgb * np.float32(255.0)).astype(np.uint8)  # the source's own values
    else:
        # trained on 8-bit photos: HDR values would push the normalised input off-distribution
        picture = np.clip(prepared.rgb, 0.0, 1.0, out=prepared.rgb)  # our own copy, read nowhere else
    resized = resize_like_upstream(picture, placement.content, process_res)
    if resized.dtype == np.uint8:
        resized = resized.astype(np.float32) / np.float32(255.0)
    if placement.content == placement.model_hw:
        return resized
    canvas = np.empty((*placement.model_hw, 3), np.float32)
    canvas[:] = np.asarray(IMAGENET_MEAN, np.float32)
    (top, left), (h, w) = placement.offset, placement.content
    canvas[top : top + h, left : left + w] = resized
    return canvas


def resize_like_upstream(image: np.ndarray, size: tuple[int, int], process_res: int) -> np.ndarray:
    """DA3's InputProcessor (`upper_bound_resize`): the long side to `process_res` (cubic when
    enlarging, area when shrinking), then to `size` (cubic when a side grows, area otherwise)."""
    height, width = image.shape[:2]
    if max(height, width) != process_res:
        scale = process_res / float(max(height, width))
        step = (max(1, int(round(height * scale))), max(1, int(round(width * scale))))
        image = cv2_resize(image, step, "cubic" if scale > 1.0 else "area")
    if image.shape[:2] != tuple(size):
        grows = size[0] > image.shape[0] or size[1] > image.shape[1]
        image = cv2_resize(image, size, "cubic" if grows else "area")
    return image


def check_session(handle: SessionHandle) -> str:
    """The family's contract (ModelContractError when the model does not fit); the depth output's name."""
    check_contract(
        handle, MODEL_NAME, inputs=[{"rank": 4, "channels": 3, "types": FLOAT_TYPES}], outputs=[{}]
    )
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
        return Match(
            LIKELY, f"one channel ('{plane.name}') at the input size, unbounded and positive ({plane.span})"
        )
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
        Setting("fixed_fit", one_of(*FIXED_FITS)),
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
