"""Small real ONNX models and helpers for the tiling / upscale / CLI tests (onnx helper API)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import save_model


def resize_model(path, *, factor=2.0, channels=3, tile=None, out_shape=None, nan=False) -> Path:
    """Nearest-neighbour Resize by `factor` (1.5 gives a non-integer scale).

    `tile` fixes the input size (then `out_shape` is the declared output size); `nan` adds
    log(-1) to every output value, so the model returns NaN everywhere.
    """
    scales = numpy_helper.from_array(np.array([1, 1, factor, factor], np.float32), "scales")
    initializers = [scales]
    nodes = [helper.make_node("Resize", ["input", "", "scales"], ["r"], mode="nearest")]
    if nan:
        initializers.append(numpy_helper.from_array(np.array([-1.0], np.float32), "minus_one"))
        nodes += [
            helper.make_node("Log", ["minus_one"], ["nan"]),
            helper.make_node("Add", ["r", "nan"], ["output"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["r"], ["output"]))
    in_shape = [1, channels, tile or "H", tile or "W"]
    out_shape = out_shape or [1, channels, "OH", "OW"]
    graph = helper.make_graph(
        nodes,
        "resize",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, out_shape)],
        initializers,
    )
    return save_model(graph, path)


def compact_model(path, *, num_conv=16, scale=4, feat=8, seed=0, tile=None) -> Path:
    """Built like Real-ESRGAN's SRVGGNetCompact: conv3x3 + PReLU, `num_conv` x (conv3x3 + PReLU),
    conv3x3 to 3*scale^2, DepthToSpace, plus the nearest-upsampled input.

    Receptive radius: num_conv + 2 input pixels (18 for 16 convs, 34 for 32: realesr-general-x4v3).
    Random weights, scaled so activations neither vanish nor explode through 34 convs.
    """
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def conv(src, cin, cout, index):
        w = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.01).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"w{index}"), numpy_helper.from_array(b, f"b{index}")])
        nodes.append(helper.make_node("Conv", [src, f"w{index}", f"b{index}"], [f"c{index}"], pads=[1, 1, 1, 1]))
        return f"c{index}"

    def prelu(src, channels, index):
        inits.append(numpy_helper.from_array(np.full((channels, 1, 1), 0.25, np.float32), f"a{index}"))
        nodes.append(helper.make_node("PRelu", [src, f"a{index}"], [f"p{index}"]))
        return f"p{index}"

    x = prelu(conv("input", 3, feat, 0), feat, 0)
    for k in range(1, num_conv + 1):
        x = prelu(conv(x, feat, feat, k), feat, k)
    x = conv(x, feat, 3 * scale * scale, num_conv + 1)
    inits.append(numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), "scales"))
    nodes += [
        helper.make_node("DepthToSpace", [x], ["shuffled"], blocksize=scale, mode="CRD"),
        helper.make_node(
            "Resize", ["input", "", "scales"], ["base"], mode="nearest",
            coordinate_transformation_mode="asymmetric", nearest_mode="floor",
        ),
        helper.make_node("Add", ["shuffled", "base"], ["output"]),
    ]
    side = tile or "H"
    out = tile * scale if tile else "OH"
    graph = helper.make_graph(
        nodes,
        "compact",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, side, tile or "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, out, tile * scale if tile else "OW"])],
        inits,
    )
    return save_model(graph, path)


def global_context_model(path, *, scale=2, seed=0) -> Path:
    """Transformer-like: a conv, then every pixel is modulated by the image's mean (global pooling,
    as attention or squeeze-excitation do), then DepthToSpace. Not tileable exactly."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array((rng.standard_normal((3 * scale * scale, 3, 3, 3)) * 0.2).astype(np.float32), "w1")
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c"], ["g"]),
        helper.make_node("Sigmoid", ["g"], ["gate"]),
        helper.make_node("Mul", ["c", "gate"], ["m"]),
        helper.make_node("DepthToSpace", ["m"], ["output"], blocksize=scale, mode="CRD"),
    ]
    graph = helper.make_graph(
        nodes,
        "global",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, "OH", "OW"])],
        [w1],
    )
    return save_model(graph, path)


def heavy_sr_model(path, *, weights_mib=64, scale=2, mid_channels=32, seed=0) -> Path:
    """sr_model plus `weights_mib` of weights that cost no compute: one element of them is
    gathered at an index computed from a RandomUniform draw (onnxruntime folds no random op, so
    the weights cannot be dropped) and added times zero. Loading it holds its weights like a real
    net of that size; its receptive radius stays the two convs' (the draw does not read the
    image), so a tiler may split it without changing its pixels."""
    rng = np.random.default_rng(seed)
    out_channels = 3 * scale * scale
    big = numpy_helper.from_array(rng.standard_normal(weights_mib << 18).astype(np.float32), "big")
    w1 = numpy_helper.from_array((rng.standard_normal((mid_channels, 3, 3, 3)) * 0.2).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(
        (rng.standard_normal((out_channels, mid_channels, 3, 3)) * 0.2).astype(np.float32), "w2"
    )
    zero = numpy_helper.from_array(np.zeros((), np.float32), "zero")
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h"], ["h2"]),
        helper.make_node("Conv", ["h2", "w2"], ["s"], pads=[1, 1, 1, 1]),
        helper.make_node("DepthToSpace", ["s"], ["shuffled"], blocksize=scale, mode="CRD"),
        # index = int(random * 0): always 0, never folded into a constant
        helper.make_node("RandomUniform", [], ["low"], shape=[1], seed=1.0),
        helper.make_node("Mul", ["low", "zero"], ["low0"]),
        helper.make_node("Cast", ["low0"], ["index"], to=TensorProto.INT64),
        helper.make_node("Gather", ["big", "index"], ["picked"]),
        helper.make_node("Mul", ["picked", "zero"], ["nothing"]),
        helper.make_node("Add", ["shuffled", "nothing"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "heavy_sr",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, "OH", "OW"])],
        [big, w1, w2, zero],
    )
    return save_model(graph, path)
