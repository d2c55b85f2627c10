"""Small real ONNX models for tests and benchmarks, built with the onnx helper API."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def save_model(graph, path) -> Path:
    """Wrap, check and write a graph (opset 17, IR 8: what the onnxruntime here reads)."""
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="lean_image_ai-tests"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = Path(path)
    onnx.save(model, str(path))
    return path


def conv_model(path, *, mid_channels=32, seed=0, height="H", width="W") -> Path:
    """3 -> mid -> 3 channels with 3x3 convs: intermediates are mid/3 times the input size."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(
        (rng.standard_normal((mid_channels, 3, 3, 3)) * 0.1).astype(np.float32), "w1"
    )
    w2 = numpy_helper.from_array(
        (rng.standard_normal((3, mid_channels, 3, 3)) * 0.1).astype(np.float32), "w2"
    )
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h"], ["h2"]),
        helper.make_node("Conv", ["h2", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, height, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, height, width])],
        [w1, w2],
    )
    return save_model(graph, path)


def sr_model(
    path, *, scale=2, mid_channels=8, tile=None, fp16=False, seed=0, input_name="input", output_name="output"
) -> Path:
    """A small super-resolution net: conv3x3 -> relu -> conv3x3 -> DepthToSpace (pixel shuffle).

    Receptive field radius: 2 input pixels (two 3x3 convs). `tile` fixes the input size.
    """
    rng = np.random.default_rng(seed)
    dtype = np.float16 if fp16 else np.float32
    elem = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    out_channels = 3 * scale * scale
    w1 = numpy_helper.from_array((rng.standard_normal((mid_channels, 3, 3, 3)) * 0.2).astype(dtype), "w1")
    w2 = numpy_helper.from_array(
        (rng.standard_normal((out_channels, mid_channels, 3, 3)) * 0.2).astype(dtype), "w2"
    )
    nodes = [
        helper.make_node("Conv", [input_name, "w1"], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h"], ["h2"]),
        helper.make_node("Conv", ["h2", "w2"], ["s"], pads=[1, 1, 1, 1]),
        helper.make_node("DepthToSpace", ["s"], [output_name], blocksize=scale, mode="CRD"),
    ]
    h = tile if tile else "H"
    w = tile if tile else "W"
    oh = tile * scale if tile else "OH"
    ow = tile * scale if tile else "OW"
    graph = helper.make_graph(
        nodes,
        "sr",
        [helper.make_tensor_value_info(input_name, elem, [1, 3, h, w])],
        [helper.make_tensor_value_info(output_name, elem, [1, 3, oh, ow])],
        [w1, w2],
    )
    return save_model(graph, path)


def release_probe_model() -> onnx.ModelProto:
    """Must serialise to runtime.cpu_arena.RELEASE_PROBE_MODEL byte for byte."""
    graph = helper.make_graph(
        [],
        "release_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="lean_image_ai"
    )
    model.ir_version = 8
    return model


def weights_model(path, *, n=4096, seed=0) -> Path:
    """A model whose cost is its weights (n x n float32 MatMul): loading it is like loading a real net."""
    weight = numpy_helper.from_array(
        np.random.default_rng(seed).standard_normal((n, n)).astype(np.float32), "w"
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [weight],
    )
    return save_model(graph, path)
