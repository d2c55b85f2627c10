"""MoGe-2's ONNX contract: find its inputs and outputs by name, else by rank and type (bpy-free).

Published copies differ (the scale output is 'metric_scale' or 'scale'; normals may be absent), so
the binding reads what the session has and says exactly what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...runtime.errors import InvalidModelOutputError, ModelContractError
from ..base import FLOAT_TYPES, check_finite, squeeze_batch

MODEL_NAME = "MoGe-2"
INT_TYPES = ("tensor(int64)", "tensor(int32)")
SCALE_NAMES = ("metric_scale", "scale")  # some published copies call the output 'scale'


@dataclass
class _Binding:
    image: object
    tokens: object
    points: object
    normal: object | None
    mask: object | None
    scale: object | None

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in (self.points, self.normal, self.mask, self.scale) if o is not None]


def _describe(infos) -> str:
    return ", ".join(f"'{i.name}' {i.type} {list(i.shape)}" for i in infos) or "none"


def _pick(infos, names, predicate=None, exclude=()):
    for info in infos:
        if info.name in names and info not in exclude:
            return info
    if predicate is not None:
        for info in infos:
            if info not in exclude and info.name not in names and predicate(info):
                return info
    return None


def _dim_is(value, expected) -> bool:
    return not isinstance(value, int) or value in (expected, -1)


def _image_problems(image) -> list[str]:
    if image is None:
        return ["no 'image' input (float 1x3xHxW)"]
    problems = []
    if len(image.shape) != 4:
        problems.append(f"input '{image.name}': expected rank 4 (1x3xHxW), found shape {list(image.shape)}")
    elif not _dim_is(image.shape[1], 3):
        problems.append(f"input '{image.name}': expected 3 channels, found {image.shape[1]}")
    if image.type not in FLOAT_TYPES:
        problems.append(f"input '{image.name}': expected type tensor(float), found {image.type}")
    return problems


def _tokens_problems(tokens) -> list[str]:
    if tokens is None:
        return ["no 'num_tokens' input (int64 scalar)"]
    problems = []
    if tokens.type not in INT_TYPES:
        problems.append(f"input '{tokens.name}': expected type tensor(int64), found {tokens.type}")
    if len(tokens.shape) > 1 or (len(tokens.shape) == 1 and not _dim_is(tokens.shape[0], 1)):
        problems.append(f"input '{tokens.name}': expected a scalar, found shape {list(tokens.shape)}")
    return problems


def _output_problems(points, normal, mask, scale) -> list[str]:
    problems = []
    if points is None:
        problems.append("no 'points' output (1xHxWx3)")
    elif len(points.shape) != 4 or not _dim_is(points.shape[3], 3):
        problems.append(f"output '{points.name}': expected shape 1xHxWx3, found {list(points.shape)}")
    if normal is not None and (len(normal.shape) != 4 or not _dim_is(normal.shape[3], 3)):
        problems.append(f"output '{normal.name}': expected shape 1xHxWx3, found {list(normal.shape)}")
    if mask is not None and len(mask.shape) != 3:
        problems.append(f"output '{mask.name}': expected shape 1xHxW, found {list(mask.shape)}")
    if scale is not None and len(scale.shape) > 1:
        problems.append(f"output '{scale.name}': expected a scalar or shape [1], found {list(scale.shape)}")
    for info in (points, normal, mask, scale):
        if info is not None and info.type not in FLOAT_TYPES:
            problems.append(f"output '{info.name}': expected type tensor(float), found {info.type}")
    return problems


def bind_contract(handle) -> _Binding:
    """Find MoGe-2's inputs/outputs by name (else by rank/dtype); ModelContractError if absent."""
    image = _pick(handle.inputs, ("image",), lambda i: len(i.shape) == 4 and i.type in FLOAT_TYPES)
    tokens = _pick(handle.inputs, ("num_tokens",), lambda i: i.type in INT_TYPES, exclude=(image,))
    problems = _image_problems(image) + _tokens_problems(tokens)
    extra = [i for i in handle.inputs if i is not image and i is not tokens]
    if extra:
        problems.append(f"unexpected input(s) {_describe(extra)}")

    outputs = handle.outputs
    points = _pick(outputs, ("points",), lambda o: len(o.shape) == 4)
    normal = _pick(outputs, ("normal", "normals"), lambda o: len(o.shape) == 4, exclude=(points,))
    mask = _pick(outputs, ("mask",), lambda o: len(o.shape) == 3, exclude=(points, normal))
    scale = _pick(outputs, SCALE_NAMES, lambda o: len(o.shape) <= 1, exclude=(points, normal, mask))
    problems += _output_problems(points, normal, mask, scale)
    if problems:
        raise ModelContractError(
            f"{handle.model_name} does not look like a {MODEL_NAME} model: "
            + "; ".join(problems)
            + ". Expected inputs 'image' (float 1x3xHxW) and 'num_tokens' (int64 scalar) and outputs "
            "'points' (1xHxWx3), 'normal' (1xHxWx3), 'mask' (1xHxW), 'metric_scale'; found inputs "
            f"{_describe(handle.inputs)} and outputs {_describe(outputs)}. Choose a MoGe-2 ONNX export "
            "with dynamic size and num_tokens (see the add-on's model list)."
        )
    return _Binding(image, tokens, points, normal, mask, scale)


# ---- the adapter -------------------------------------------------------------------------------


# ---- the outputs a run returned, held to the contract: one batch, shapes that agree, finite values ----


def output_array(array, shape_tail: int, name: str, model_name: str) -> np.ndarray:
    array = squeeze_batch(array, shape_tail)
    if array.ndim != shape_tail:
        raise InvalidModelOutputError(
            f"{model_name} returned '{name}' with shape {list(np.shape(array))}; "
            f"expected a batch of one ({shape_tail} dims after the batch)."
        )
    return array.astype(np.float32, copy=False)


def _output_like_points(outputs, port, dims: int, model_name: str, points_shape) -> np.ndarray:
    """An output read per pixel alongside the points: its shape must be theirs."""
    array = output_array(outputs[port.name], dims, port.name, model_name)
    check_finite(array, model_name, port.name)
    if array.shape != tuple(points_shape):
        raise InvalidModelOutputError(
            f"{model_name} returned '{port.name}' {list(array.shape)} but points "
            f"{list(points_shape)}; they must match."
        )
    return array


def normal_output(outputs, binding, model_name: str, points_shape) -> np.ndarray | None:
    if binding.normal is None:
        return None
    return _output_like_points(outputs, binding.normal, 3, model_name, points_shape)


def mask_output(outputs, binding, model_name: str, model_hw, warnings: list) -> np.ndarray | None:
    """The model's mask (a probability per pixel), or None (every pixel valid, said so) without one."""
    if binding.mask is None:
        warnings.append(f"{model_name} has no mask output: every pixel is treated as valid.")
        return None
    return _output_like_points(outputs, binding.mask, 2, model_name, model_hw)


def metric_scale_output(outputs, binding, model_name: str, warnings: list) -> float:
    if binding.scale is None:
        warnings.append(f"{model_name} has no metric scale output: geometry is up to an unknown scale.")
        return 1.0
    scale_array = np.asarray(outputs[binding.scale.name], np.float64)
    check_finite(scale_array, model_name, binding.scale.name)
    if scale_array.size != 1 or not scale_array.reshape(-1)[0] > 0:
        raise InvalidModelOutputError(
            f"{model_name} returned '{binding.scale.name}' = {scale_array.ravel()[:4].tolist()}; "
            "expected one positive number."
        )
    return float(scale_array.reshape(-1)[0])
