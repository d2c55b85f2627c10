"""A MoGe-2-like ONNX model with an analytic scene, built with the onnx helper API.

Same I/O contract as the public export (`image` 1x3xHxW float, `num_tokens` int64 scalar ->
`points` 1xHxWx3, `normal` 1xHxWx3, `mask` 1xHxW, `metric_scale` [1]). The graph builds MoGe's
normalised view-plane uv grid from the image's own (dynamic) shape, so whatever size the adapter
feeds, `points` is the affine point map of a known scene:

    plane n . X = d seen by a camera with focal `focal` (relative to half the image diagonal):
    Z(u, v) = d / (n0 u / f + n1 v / f + n2),  points = (Z u / f, Z v / f, Z - shift)

`mask` = sigmoid(gain * (R - 0.5)) of the red channel (the test paints valid pixels red) and
`normal` = normalize(u, v, -1), a field that varies per pixel so that resizing shortens it.
`expected_depth(...)` gives the analytic depth for any model size, for assertions.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import save_model

PLANE = (0.15, -0.1, 1.0, 2.0)  # n0, n1, n2, d: a plane tilted to the right and up, Z about 2


def expected_depth(model_h: int, model_w: int, source_h: int, source_w: int, *, focal, plane=PLANE):
    """Analytic Z at the source pixel centres, in the model's normalised coordinates."""
    n0, n1, n2, d = plane
    half_diagonal = math.hypot(model_h, model_w) / 2.0
    # a source pixel centre lands at this continuous model coordinate after the resize
    j = (np.arange(source_w) + 0.5) * model_w / source_w
    i = (np.arange(source_h) + 0.5) * model_h / source_h
    u = ((j - model_w / 2.0) / half_diagonal)[None, :]
    v = ((i - model_h / 2.0) / half_diagonal)[:, None]
    return d / (n0 * u / focal + n1 * v / focal + n2)


def moge2_like_model(
    path,
    *,
    focal: float = 1.2,
    shift: float = -1.5,
    metric_scale: float = 2.5,
    plane=PLANE,
    mask_gain: float = 20.0,
    num_tokens_input: bool = True,
    num_tokens_rank: int = 0,
    points_rank: int = 4,
    poison: str | None = None,
    fp16: bool = False,
    scale_name: str = "metric_scale",
    scale_rank: int = 1,
    with_normal: bool = True,
    fixed_hw: tuple[int, int] | None = None,
) -> Path:
    """Write the model to `path` and return it.

    `poison="nan"` adds NaN to the points; `points_rank=3` drops the batch dim of `points`;
    `num_tokens_input=False` leaves out the `num_tokens` input (both: broken contracts).
    """
    n0, n1, n2, d = (float(v) for v in plane)
    elem = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    inits = []

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    nodes = []

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    image = "image"
    if fp16:
        image = node("Cast", ["image"], "image32", to=TensorProto.FLOAT)
    shape = node("Shape", [image], "shape")
    h_int = node("Gather", [shape, const("i2", 2, np.int64)], "h_int")
    w_int = node("Gather", [shape, const("i3", 3, np.int64)], "w_int")
    zero_i = const("zero_i", 0, np.int64)
    one_i = const("one_i", 1, np.int64)
    rows = node("Cast", [node("Range", [zero_i, h_int, one_i], "rows_i")], "rows", to=TensorProto.FLOAT)
    cols = node("Cast", [node("Range", [zero_i, w_int, one_i], "cols_i")], "cols", to=TensorProto.FLOAT)
    h = node("Cast", [h_int], "h", to=TensorProto.FLOAT)
    w = node("Cast", [w_int], "w", to=TensorProto.FLOAT)
    half_diag = node(
        "Mul",
        [
            node(
                "Sqrt", [node("Add", [node("Mul", [h, h], "hh"), node("Mul", [w, w], "ww")], "hw2")], "diag"
            ),
            const("half", 0.5),
        ],
        "half_diag",
    )
    # u = (j + 0.5 - W / 2) / (diag / 2), as MoGe's normalized_view_plane_uv
    half_w = node("Mul", [w, "half"], "half_w")
    half_h = node("Mul", [h, "half"], "half_h")
    u = node("Div", [node("Sub", [node("Add", [cols, "half"], "cols_c"), half_w], "du"), half_diag], "u")
    v = node("Div", [node("Sub", [node("Add", [rows, "half"], "rows_c"), half_h], "dv"), half_diag], "v")
    u3 = node("Reshape", [u, const("shape_u", [1, 1, -1], np.int64)], "u3")  # 1x1xW
    v3 = node("Reshape", [v, const("shape_v", [1, -1, 1], np.int64)], "v3")  # 1xHx1
    rx = node("Div", [u3, const("focal", focal)], "rx")
    ry = node("Div", [v3, "focal"], "ry")
    denom = node(
        "Add",
        [
            node(
                "Add",
                [node("Mul", [rx, const("n0", n0)], "a0"), node("Mul", [ry, const("n1", n1)], "a1")],
                "a01",
            ),
            const("n2", n2),
        ],
        "denom",
    )
    depth = node("Div", [const("d", d), denom], "depth")  # 1xHxW
    x = node("Mul", [depth, rx], "x")
    y = node("Mul", [depth, ry], "y")
    z = node("Sub", [depth, const("shift", shift)], "z")
    axis = const("axis_last", [-1], np.int64)
    parts = [node("Unsqueeze", [t, axis], f"{t}_e") for t in (x, y, z)]
    points = node("Concat", parts, "points_raw", axis=-1)  # 1xHxWx3
    if poison == "nan":
        points = node("Add", [points, const("nan", np.nan)], "points_poisoned")
    if points_rank == 3:
        points = node("Squeeze", [points, const("axis0", [0], np.int64)], "points_r3")

    ones = node("Add", [node("Mul", [depth, const("zero", 0.0)], "zeros"), const("one", 1.0)], "ones")
    nx = node("Mul", [u3, ones], "nx")
    ny = node("Mul", [v3, ones], "ny")
    nz = node("Mul", [ones, const("minus_one", -1.0)], "nz")
    nvec = node("Concat", [node("Unsqueeze", [t, axis], f"{t}_e") for t in (nx, ny, nz)], "nvec", axis=-1)
    length = node(
        "Sqrt", [node("ReduceSum", [node("Mul", [nvec, nvec], "n2sq"), axis], "nlen2", keepdims=1)], "nlen"
    )
    normal = node("Div", [nvec, length], "normal_raw")

    red = node(
        "Slice",
        [image, const("s0", [0], np.int64), const("s1", [1], np.int64), const("axes_c", [1], np.int64)],
        "red",
    )  # 1x1xHxW
    red = node("Squeeze", [red, const("axis1", [1], np.int64)], "red3")
    mask = node(
        "Sigmoid",
        [node("Mul", [node("Sub", [red, "half"], "red_c"), const("gain", mask_gain)], "logit")],
        "mask_raw",
    )

    scale_value = np.asarray([metric_scale] if scale_rank == 1 else metric_scale, np.float32)
    scale = const("scale_const", scale_value)
    height, width = fixed_hw or ("H", "W")  # a fixed input size, as a static export declares it
    inputs = [helper.make_tensor_value_info("image", elem, [1, 3, height, width])]
    if num_tokens_input:
        token_shape = [] if num_tokens_rank == 0 else [1]
        inputs.append(helper.make_tensor_value_info("num_tokens", TensorProto.INT64, token_shape))
        # the real model sizes its ViT grid from num_tokens; here it only has to be consumed
        tokens_f = node("Cast", ["num_tokens"], "tokens_f", to=TensorProto.FLOAT)
        scale = node("Add", [scale, node("Mul", [tokens_f, "zero"], "tokens_zero")], "scale_used")
        if num_tokens_rank == 1 and scale_rank == 0:
            scale = node("Squeeze", [scale, const("axis0s", [0], np.int64)], "scale_sq")

    outs = {"points": points, "normal": normal, "mask": mask, scale_name: scale}
    if not with_normal:
        del outs["normal"]
    shapes = {
        "points": [1, "H", "W", 3] if points_rank == 4 else ["H", "W", 3],
        "normal": [1, "H", "W", 3],
        "mask": [1, "H", "W"],
        scale_name: [1] if scale_rank == 1 else [],
    }
    outputs = []
    for name, tensor in outs.items():
        if fp16:
            node("Cast", [tensor], name, to=TensorProto.FLOAT16)
        else:
            node("Identity", [tensor], name)
        outputs.append(helper.make_tensor_value_info(name, elem, shapes[name]))
    graph = helper.make_graph(nodes, "moge2_like", inputs, outputs, inits)
    return save_model(graph, path)
