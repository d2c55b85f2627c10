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
