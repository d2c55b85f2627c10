"""MoGe-2 monocular geometry: image -> point map, depth, normals, mask and camera intrinsics.

The public export (`Ruicheng/moge-2-*-normal-onnx`) holds only MoGe's `forward()`: inputs
`image` (1x3xHxW RGB in [0, 1]; ImageNet normalisation happens inside) and `num_tokens` (int64
scalar), outputs `points` (1xHxWx3, an *affine* point map: the true camera-space points up to an
unknown focal length and z-shift), `normal` (1xHxWx3), `mask` (1xHxW sigmoid) and `metric_scale`.
The camera recovery that MoGe's `infer()` does in PyTorch + scipy is re-done here in numpy
(Blender ships no scipy):

* focal and shift: least squares over a subsample of valid pixels (models/adapters/moge2_solver.py).
* intrinsics: principal point at the image centre; `fx, fy` in pixels of the SOURCE image.
* `depth = (z + shift) * metric_scale`; points re-projected from depth and intrinsics (MoGe's
  default `force_projection=True`), or `(xyz + [0, 0, shift]) * metric_scale` when that is off.

Model input size rule (MoGe-2 `forward()`): for `T = num_tokens` and source aspect `a = W / H`,
the ViT grid is `rows = round(sqrt(T / a))`, `cols = round(sqrt(T * a))` patches of 14 px
(`model_input_size`: the encoder's input, `(14 * rows, 14 * cols)`). A dynamic-size export is fed
at the source's own size (`at_source_size`), so it computes what MoGe's `forward()` computes on the
picture and its outputs come at the source's size; a fixed-size export is fed the encoder's input,
stretched to its size, and its outputs are resized here (moge2_outputs.py). `T = int(1200 + level / 9 * 2400)` for
`resolution_level` 0..9, as in MoGe's `infer()`.

Frames: points/normals are in MoGe's camera frame (OpenCV convention: x right, y down, z
forward). Values outside `mask` are what the model predicted there and carry no meaning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ...runtime.errors import InvalidModelOutputError
from ..base import RunOptions, check_finite, fixed_hw
from ..family import Family, Option, Output, Setting, int_range, positive_int, unit_interval
from ..frame_loop import Frame, run_frames
from ..identify import NO, SURE, Match
from ..imaging import to_nchw
from ..result_images import MESH, ImageProduct
from . import shot_camera
from .moge2_contract import bind_contract, mask_output, metric_scale_output, normal_output, output_array
from .moge2_mesh import GeometryFiles, normal_map, write_geometry
from .moge2_outputs import mask_to_source, normal_to_source, points_to_source
from .moge2_solver import DegenerateGeometryError, recover_focal_shift, shift_for_focal
from .resampling import antialiased_preimage, torch_bilinear

PATCH_SIZE = 14
NUM_TOKENS_RANGE = (1200, 3600)
RESOLUTION_LEVELS = 10
MASK_THRESHOLD = 0.5


@dataclass
class GeometryResult:
    points: np.ndarray  # HxWx3 float32, camera space (OpenCV axes), metric when the model has a scale
    depth: np.ndarray  # HxW float32, z of `points`
    normal: np.ndarray | None  # HxWx3 float32 unit vectors, or None when the model has no normal output
    mask: np.ndarray  # HxW bool: model mask > threshold and finite depth > 0
    intrinsics: np.ndarray  # 3x3 float32, pixels of the source image, principal point at its centre
    fov_x: float  # radians
    fov_y: float  # radians
    metric_scale: float
    model_size: tuple[int, int]  # (h, w) of the encoder's input: the token grid in pixels (a fixed export's size)
    warnings: list[str] = field(default_factory=list)
    num_tokens: int = 0
    focal: float = 0.0  # relative to half the image diagonal (MoGe's convention)
    shift: float = 0.0  # z-shift added to the affine points, before metric scaling


# ---- sizes and token counts --------------------------------------------------------------------


def num_tokens_for_level(
    resolution_level: int,
    num_tokens_range: tuple[int, int] = NUM_TOKENS_RANGE,
    resolution_levels: int = RESOLUTION_LEVELS,
) -> int:
    """MoGe's `infer()` rule: level 0..levels-1 maps linearly (truncated) onto the token range."""
    top = resolution_levels - 1
    if isinstance(resolution_level, bool) or not isinstance(resolution_level, (int, np.integer)):
        raise ValueError(f"resolution_level must be an integer 0..{top}, got {resolution_level!r}")
    if not 0 <= resolution_level <= top:
        raise ValueError(f"resolution_level must be 0..{top}, got {resolution_level}")
    low, high = num_tokens_range
    return int(low + (int(resolution_level) / top) * (high - low))


def model_input_size(
    height: int, width: int, num_tokens: int, patch_size: int = PATCH_SIZE
) -> tuple[int, int]:
    """(h, w) to feed: multiples of the patch size, source aspect, about `num_tokens` patches."""
    aspect = width / height
    rows = max(1, round(math.sqrt(num_tokens / aspect)))
    cols = max(1, round(math.sqrt(num_tokens * aspect)))
    return rows * patch_size, cols * patch_size


# ---- model contract ----------------------------------------------------------------------------


def resolve_num_tokens(
    resolution_level: int = 9,
    num_tokens: int | None = None,
    num_tokens_range: tuple[int, int] = NUM_TOKENS_RANGE,
    resolution_levels: int = RESOLUTION_LEVELS,
) -> int:
    low, high = (int(v) for v in num_tokens_range)
    if num_tokens is None:
        return num_tokens_for_level(resolution_level, (low, high), resolution_levels)
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)):
        raise ValueError(f"num_tokens must be an integer in [{low}, {high}], got {num_tokens!r}")
    if not low <= num_tokens <= high:
        raise ValueError(
            f"num_tokens must be in [{low}, {high}] (the range MoGe-2 was trained on), got {num_tokens}"
        )
    return int(num_tokens)


def run(
    images,
    model_path,
    *,
    options: RunOptions | None = None,
    resolution_level: int = 9,
    num_tokens: int | None = None,
    num_tokens_range: tuple[int, int] = NUM_TOKENS_RANGE,
    resolution_levels: int = RESOLUTION_LEVELS,
    patch_size: int = PATCH_SIZE,
    mask_threshold: float = MASK_THRESHOLD,
    force_projection: bool = True,
    focal_width: float | None = None,  # one camera for a shot: fx / width for every frame (shot_camera.py)
) -> GeometryResult | list[GeometryResult]:
    """Geometry for one image (-> GeometryResult) or a list of frames (-> list), one operation."""
    tokens = resolve_num_tokens(resolution_level, num_tokens, num_tokens_range, resolution_levels)
    body = partial(
        _geometry,
        tokens=tokens,
        patch_size=patch_size,
        mask_threshold=mask_threshold,
        force_projection=force_projection,
        focal_width=focal_width,
    )
    return run_frames("moge2", images, model_path, options, check=bind_contract, body=body)


def _geometry(
    frame: Frame, *, tokens, patch_size, mask_threshold, force_projection, focal_width
) -> GeometryResult:
    handle, binding = frame.handle, frame.contract
    frame.report(0.0, "preprocessing")
    prepared = frame.prepare()
    warnings = list(prepared.warnings)
    source_h, source_w = prepared.size
    fixed = fixed_hw(binding.image.shape)
    if fixed is not None:
        model_h, model_w = fixed
        if abs(model_w / model_h - source_w / source_h) > 0.02 * source_w / source_h:
            warnings.append(
                f"{handle.model_name} takes a fixed {model_w}x{model_h} input, so the "
                f"{source_w}x{source_h} image is stretched; geometry may be distorted."
            )
    else:
        model_h, model_w = model_input_size(source_h, source_w, tokens, patch_size)
    picture = np.clip(prepared.rgb, 0.0, 1.0)
    if fixed is None:
        rgb = at_source_size(picture, (model_h, model_w))
    else:  # MoGe's encoder: bilinear with antialias on the [0, 1] picture (ImageNet constants inside)
        rgb = torch_bilinear(picture, (model_h, model_w), antialias=True)
    del picture
    token_shape = (1,) * len(binding.tokens.shape)
    feeds = {
        binding.image.name: to_nchw(rgb, binding.image.dtype),
        binding.tokens.name: np.array(tokens, dtype=binding.tokens.dtype).reshape(token_shape),
    }
    del rgb
    frame.report(0.0, "inference" if frame.loop.single else frame.counter)
    outputs = frame.run(feeds, output_names=binding.output_names)
    frame.report(0.8, "recovering camera")
    result = _postprocess(
        outputs,
        binding,
        handle.model_name,
        frame.label,
        (source_h, source_w),
        mask_threshold=mask_threshold,
        force_projection=force_projection,
        warnings=warnings,
        focal_width=focal_width,
    )
    result.num_tokens = tokens
    result.model_size = (model_h, model_w)
    return result


def at_source_size(picture: np.ndarray, encoder_size: tuple[int, int]) -> np.ndarray:
    """What to feed a dynamic-size export so that it computes what MoGe's forward() computes on
    the picture: forward() takes the picture itself, shrinks it to the token grid (bilinear WITH
    antialias; the export's ONNX mode shrinks without) and resizes the heads' raw maps to the
    picture's size before its exp/sigmoid/normalise. Fed an image at the picture's size whose
    plain shrink is the antialiased one (`antialiased_preimage`; along a side smaller than the grid
    the picture itself), the export's encoder input, its token grid, its uv's aspect and its one
    output resize are MoGe's: points, mask and normals come out at the picture's size, as MoGe's
    (issue 42: fed at the heads' size, the normals were resized after their normalisation, 1.6 to
    3.1 degrees mean off on the seeded ViT-S)."""
    return antialiased_preimage(picture, encoder_size)


def _postprocess(
    outputs,
    binding,
    model_name,
    label,
    source_size,
    *,
    mask_threshold,
    force_projection,
    warnings,
    focal_width=None,
) -> GeometryResult:
    points = output_array(outputs[binding.points.name], 3, binding.points.name, model_name)
    model_h, model_w = points.shape[:2]
    if points.shape[2] != 3:
        raise InvalidModelOutputError(
            f"{model_name} returned '{binding.points.name}' with shape {list(points.shape)}; expected HxWx3."
        )
    normal = normal_output(outputs, binding, model_name, points.shape)
    mask_prob = mask_output(outputs, binding, model_name, (model_h, model_w), warnings)
    valid = np.ones((model_h, model_w), bool) if mask_prob is None else mask_prob > mask_threshold
    metric_scale = metric_scale_output(outputs, binding, model_name, warnings)

    no_geometry = (
        f"{model_name} found no valid geometry in {label}: its mask rejects every pixel (threshold "
        f"{mask_threshold}). The image may be blank, or show only sky or background."
    )
    if not valid.any():
        raise InvalidModelOutputError(no_geometry)
    # non-finite points matter only where the mask keeps them
    finite = np.isfinite(points).all(axis=2)
    if not finite[valid].all():
        check_finite(points[valid], model_name, binding.points.name)
    if not finite.all():
        points = np.where(finite[:, :, None], points, np.float32(0.0))
    height, width = source_size
    # the solver reads the uv of the map's own size: the picture's when the export ran at it, as
    # MoGe's does; a fixed-size export's (stretched) grid's otherwise
    aspect = width / height
    focal, shift = _camera(points, valid, aspect, focal_width, model_name, label, mask_threshold)
    if not (valid & (points[:, :, 2] + np.float32(shift) > 0)).any():
        raise InvalidModelOutputError(no_geometry)

    # MoGe's infer(): fx = focal / 2 * sqrt(1 + a^2) / a of the width, fy = focal / 2 * sqrt(1 + a^2)
    fx_norm = focal / 2.0 * math.sqrt(1.0 + aspect * aspect) / aspect
    fy_norm = focal / 2.0 * math.sqrt(1.0 + aspect * aspect)
    fov_x = 2.0 * math.atan(0.5 / fx_norm)
    fov_y = 2.0 * math.atan(0.5 / fy_norm)
    fx, fy = fx_norm * width, fy_norm * height
    cx, cy = width / 2.0, height / 2.0
    intrinsics = np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], np.float32)

    # the heads' maps at the source size, resampled where MoGe resamples them (moge2_outputs.py)
    points_source = points_to_source(points, (height, width))
    depth = points_source[:, :, 2] + np.float32(shift)
    mask = np.isfinite(depth) & (depth > 0)
    if mask_prob is not None:
        mask &= mask_to_source(mask_prob, (height, width)) > mask_threshold
    depth *= np.float32(metric_scale)
    if force_projection:
        x = ((np.arange(width, dtype=np.float32) + 0.5 - cx) / fx)[None, :]
        y = ((np.arange(height, dtype=np.float32) + 0.5 - cy) / fy)[:, None]
        points_out = np.stack(np.broadcast_arrays(x * depth, y * depth, depth), axis=-1)  # float32 already
    else:
        points_source[:, :, 2] += np.float32(shift)
        points_out = points_source * np.float32(metric_scale)
    if normal is not None:
        normal = normal_to_source(normal, (height, width))
    return GeometryResult(
        points=np.ascontiguousarray(points_out, np.float32),
        depth=np.ascontiguousarray(depth, np.float32),
        normal=normal,
        mask=mask,
        intrinsics=intrinsics,
        fov_x=fov_x,
        fov_y=fov_y,
        metric_scale=metric_scale,
        model_size=(model_h, model_w),
        warnings=warnings,
        focal=float(focal),
        shift=float(shift),
    )


def _camera(points, valid, aspect, focal_width, model_name, label, mask_threshold) -> tuple[float, float]:
    """(focal, shift): fitted (the robust solver, moge2_solver.py), or the shift for a given focal."""
    try:
        if focal_width is None:
            focal, shift = recover_focal_shift(points, valid)
        else:
            focal = shot_camera.moge_focal(focal_width, 1.0, aspect)  # depends on the aspect only
            shift = shift_for_focal(points, valid, focal)
    except DegenerateGeometryError as exc:
        raise InvalidModelOutputError(
            f"{model_name} gave no usable geometry for {label}: {exc} (mask threshold "
            f"{mask_threshold}); nothing was written."
        ) from None
    if not (math.isfinite(focal) and focal > 0 and math.isfinite(shift)):
        raise InvalidModelOutputError(
            f"{model_name} produced a point map for {label} that no pinhole camera explains "
            f"(recovered focal {focal:.4g}); nothing was written."
        )
    return focal, shift


def _write_files(path, result, values: dict, write_image) -> list[str]:
    """The mesh, its camera and its normal map (models/adapters/moge2_mesh.py); no notes."""
    write_geometry(path, result, discontinuity=values.get("discontinuity", 0.04), write_normals=write_image)
    return []


def _stage_files(path, result, values: dict) -> GeometryFiles:
    """The same files, made a band per call by the front-end's pump (models/adapters/moge2_mesh.py)."""
    return GeometryFiles(path, result, discontinuity=values.get("discontinuity", 0.04))


def _preview(result) -> ImageProduct:
    """The normal map, or the depth scaled to 0..1 when the model gives no normals."""
    if result.normal is not None:
        return ImageProduct(normal_map(result.normal, result.mask), is_data=True)
    return ImageProduct(result.depth / max(float(result.depth.max()), 1e-12), is_data=True)


def identify(model) -> Match:
    """An output named 'points' (the rest of the export's contract is bind_contract's, by name)."""
    if "points" not in model.output_names:
        return NO
    named = sorted(model.input_names & {"image", "num_tokens"})
    inputs = f"inputs {' and '.join(repr(n) for n in named)}, " if named else ""
    return Match(SURE, f"{inputs}an output named 'points'")


FAMILY = Family(
    id="moge2",
    title="MoGe-2 geometry",
    produces="a metric mesh of the photo, its normal map and a matching camera",
    run=run,
    identify=identify,
    looks="a MoGe-2 geometry model",
    identify_rank=10,  # its export also has a one-channel mask, which alone looks like a matte
    settings=(
        Setting("num_tokens_range", int_range),
        Setting("resolution_levels", positive_int),
        Setting("patch_size", positive_int),
        Setting("mask_threshold", unit_interval),
    ),
    user_defaults={
        "num_tokens_range": NUM_TOKENS_RANGE,
        "resolution_levels": RESOLUTION_LEVELS,
        "patch_size": PATCH_SIZE,
        "mask_threshold": MASK_THRESHOLD,
    },
    options=(
        Option(
            "resolution_level",
            int,
            9,
            "Resolution Level",
            "Detail the model works at: 0 fastest, 9 finest",
            min=0,
            max=RESOLUTION_LEVELS - 1,
        ),
        Option(
            "discontinuity",
            float,
            0.04,
            "Discontinuity",
            "Relative depth jump above which no face joins neighbouring pixels (0.04 = 4%)",
            min=0.0,
            soft_max=1.0,
            to_adapter=False,
        ),
        Option(
            "make_camera",
            bool,
            True,
            "Make Camera",
            "Add a camera at the origin whose field of view matches the photo, and make it the scene camera",
            to_adapter=False,
            blender_only=True,
        ),
    ),
    action="Reconstruct Geometry",
    heading="3D Geometry",
    button="Reconstruct {} in 3D",
    icon="MESH_GRID",
    operator="reconstruct_geometry",
    command="geometry",
    check_session=bind_contract,
    shot=frozenset({"camera"}),
    output=Output(
        tag="geometry",
        what="geometry",
        product=MESH,
        formats_hint="a .ply mesh file (the camera goes to a .json file and the normal map to an .exr file beside it)",
        companions=("{stem}.json", "{stem}_normal.exr"),
        write=_write_files,
        stage=_stage_files,
        description="PLY mesh, JSON camera, float EXR normals",
        preview=_preview,
    ),
)
