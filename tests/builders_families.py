"""Small real ONNX models that honour the BEN2 and DA3 export contracts.

Their outputs are simple known functions of the input, so tests can compute the expected
result in numpy from the same preprocessing:

- `ben2_like_model`: matte = sigmoid(scale * mean over channels of the input tensor).
- `da3_like_model`: depth = depth_scale * mean over channels + depth_offset;
  sky = SKY_WEIGHTS . input channels (a 1x1 conv), optionally through a ReLU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import save_model

SKY_WEIGHTS = np.array([-1.0, 0.5, 1.5], np.float32)  # mixed signs: the sky map has negative values


def _save(nodes, name, inputs, outputs, initializers, path) -> Path:
    return save_model(helper.make_graph(nodes, name, inputs, outputs, initializers), path)


def _const(name, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _image_input(name, *, fp16, channels, rank, hw):
    elem = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    h, w = hw
    shape = [1, channels, h, w] if rank == 4 else [channels, h, w]
    return helper.make_tensor_value_info(name, elem, shape)


def _float_input_nodes(input_name, fp16) -> tuple[list, str]:
    """fp16 exports take float16 at the boundary; compute in float32 (the CPU EP lacks fp16 kernels)."""
    if not fp16:
        return [], input_name
    return [helper.make_node("Cast", [input_name], ["x32"], to=TensorProto.FLOAT)], "x32"


def _float_output_node(source, output_name, fp16) -> onnx.NodeProto:
    if fp16:
        return helper.make_node("Cast", [source], [output_name], to=TensorProto.FLOAT16)
    return helper.make_node("Identity", [source], [output_name])


def ben2_like_model(
    path,
    *,
    size: int = 64,
    fixed: bool = True,
    fp16: bool = False,
    scale: float = 4.0,
    output: str = "sigmoid",
    constant: float = 0.8,
    input_name: str = "input",
    output_name: str = "output",
    channels: int = 3,
    input_rank: int = 4,
    output_rank: int = 4,
    extra_first_output: bool = False,
) -> Path:
    """A BEN2-shaped model: input 1x3xSxS (or dynamic HxW), output 1x1xSxS matte.

    output: "sigmoid" -> sigmoid(scale * mean_c(x)); "constant" -> `constant` everywhere;
    "nan" -> NaN everywhere; "raw" -> scale * mean_c(x) (no sigmoid, can leave [0, 1]).
    `extra_first_output` puts a 1x3xHxW copy of the input before the matte, as a decoy: the
    adapter must pick the Nx1xHxW output, not the first one.
    """
    hw = (size, size) if fixed else ("H", "W")
    nodes, x = _float_input_nodes(input_name, fp16)
    axis = 1 if input_rank == 4 else 0
    if input_rank == 3:
        output_rank = 3  # the channel mean of a CxHxW input is 1xHxW
    initializers = [_const("scale", scale)]
    nodes.append(helper.make_node("ReduceMean", [x], ["m"], axes=[axis], keepdims=1))
    nodes.append(helper.make_node("Mul", ["m", "scale"], ["z"]))
    if output == "sigmoid":
        nodes.append(helper.make_node("Sigmoid", ["z"], ["y"]))
    elif output == "raw":
        nodes.append(helper.make_node("Identity", ["z"], ["y"]))
    elif output in ("constant", "nan"):
        fill = np.nan if output == "nan" else constant
        initializers += [_const("zero", 0.0), _const("fill", fill)]
        nodes.append(helper.make_node("Mul", ["z", "zero"], ["z0"]))
        nodes.append(helper.make_node("Add", ["z0", "fill"], ["y"]))
    else:
        raise ValueError(output)
    last = "y"
    if output_rank == 3 and input_rank == 4:
        initializers.append(numpy_helper.from_array(np.array([1], np.int64), "sq_axes"))
        nodes.append(helper.make_node("Squeeze", ["y", "sq_axes"], ["y3"]))
        last = "y3"
    nodes.append(_float_output_node(last, output_name, fp16))
    elem = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    out_shape = [1, 1, *hw] if output_rank == 4 else [1, *hw]
    outputs = [helper.make_tensor_value_info(output_name, elem, out_shape)]
    if extra_first_output:
        nodes.append(helper.make_node("Identity", [input_name], ["decoy"]))
        outputs.insert(0, helper.make_tensor_value_info("decoy", elem, [1, channels, *hw]))
    inputs = [_image_input(input_name, fp16=fp16, channels=channels, rank=input_rank, hw=hw)]
    return _save(nodes, "ben2_like", inputs, outputs, initializers, path)


def da3_like_model(
    path,
    *,
    fixed_hw: tuple[int, int] | None = (280, 504),
    with_sky: bool = True,
    sky_relu: bool = False,
    sky_first: bool = False,
    fp16: bool = False,
    depth_scale: float = 2.0,
    depth_offset: float = 3.0,
    depth_name: str = "depth",
    sky_name: str = "sky",
    depth_rank: int = 4,
    nan: bool = False,
    channels: int = 3,
    input_name: str = "pixel_values",
    extra_multichannel: bool = False,
) -> Path:
    """A DA3-shaped model: input 1x3xHxW (fixed `fixed_hw` or dynamic), outputs depth (+ sky).

    depth = depth_scale * mean_c(x) + depth_offset (1x1xHxW, or 1xHxW with depth_rank=3; all NaN
    with nan=True); sky = SKY_WEIGHTS . x over channels (Relu'd with sky_relu, like DA3's own head).
    `sky_first` lists sky before depth so the adapter must find depth by name.
    `extra_multichannel` adds a 1x3xHxW output that is no single-channel map.
    """
    hw = tuple(fixed_hw) if fixed_hw else ("H", "W")
    nodes, x = _float_input_nodes(input_name, fp16)
    initializers = [_const("dscale", depth_scale), _const("doffset", depth_offset)]
    nodes += [
        helper.make_node("ReduceMean", [x], ["m"], axes=[1], keepdims=1),
        helper.make_node("Mul", ["m", "dscale"], ["ms"]),
        helper.make_node("Add", ["ms", "doffset"], ["d"]),
    ]
    depth_source = "d"
    if nan:
        initializers.append(_const("nanc", np.nan))
        nodes.append(helper.make_node("Add", ["d", "nanc"], ["dn"]))
        depth_source = "dn"
    if depth_rank == 3:
        initializers.append(numpy_helper.from_array(np.array([1], np.int64), "sq_axes"))
        nodes.append(helper.make_node("Squeeze", [depth_source, "sq_axes"], ["d3"]))
        depth_source = "d3"
    nodes.append(_float_output_node(depth_source, depth_name, fp16))
    elem = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    depth_shape = [1, 1, *hw] if depth_rank == 4 else [1, *hw]
    outputs = [helper.make_tensor_value_info(depth_name, elem, depth_shape)]
    if with_sky:
        weights = SKY_WEIGHTS if channels == 3 else np.full(channels, 1.0 / channels, np.float32)
        initializers.append(numpy_helper.from_array(weights.reshape(1, channels, 1, 1), "skyw"))
        nodes.append(helper.make_node("Conv", [x, "skyw"], ["s"]))
        sky_source = "s"
        if sky_relu:
            nodes.append(helper.make_node("Relu", ["s"], ["sr"]))
            sky_source = "sr"
        nodes.append(_float_output_node(sky_source, sky_name, fp16))
        sky_info = helper.make_tensor_value_info(sky_name, elem, [1, 1, *hw])
        outputs.insert(0 if sky_first else len(outputs), sky_info)
    if extra_multichannel:
        nodes.append(helper.make_node("Identity", [input_name], ["features"]))
        outputs.append(helper.make_tensor_value_info("features", elem, [1, channels, *hw]))
    inputs = [_image_input(input_name, fp16=fp16, channels=channels, rank=4, hw=hw)]
    return _save(nodes, "da3_like", inputs, outputs, initializers, path)


def photo(h=37, w=53, channels=3, seed=0, dtype=np.uint8):
    """A deterministic test picture: smooth gradients plus noise, so resize kernels differ measurably."""
    rng = np.random.default_rng(seed)
    # smooth gradients plus noise: enough structure for resize kernels to differ measurably
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([(xx / max(w - 1, 1)), (yy / max(h - 1, 1)), ((xx + yy) % 7) / 6.0], axis=2)
    data = np.clip(0.7 * base + 0.3 * rng.random((h, w, 3)), 0, 1)
    if channels == 4:
        data = np.concatenate([data, rng.random((h, w, 1))], axis=2)
    if dtype == np.uint8:
        return np.round(data * 255).astype(np.uint8)
    if dtype == np.uint16:
        return np.round(data * 65535).astype(np.uint16)
    return data.astype(dtype)
