"""Receptive radius of an image-to-image ONNX model, read from its graph (no `onnx` package).

The radius is how far, in input pixels, an output pixel can see: a tile whose overlap is at least
this gives exactly the pixels one whole-image run gives. It is found by walking the graph from
the image input to the first output: each tensor carries (reach in input pixels, resolution
relative to the input). Conv/ConvTranspose/pooling add their kernel's reach (dilations, pads and
strides included), Resize/DepthToSpace/SpaceToDepth change the resolution (and add their
interpolation's reach), element-wise ops take the largest reach of their operands. Ops that mix
every pixel (global pooling, reductions, MatMul over flattened pixels, Reshape/Transpose...) make
the reach *global*: such a model cannot be tiled exactly. An op this walk does not know makes the
result *unknown*; the caller then measures the radius with an impulse probe.

Only the graph's structure is read: the protobuf wire format is parsed here in pure Python
(Blender ships no `onnx`), initializer payloads are skipped, external data is never opened. Small
constants (Resize scales) are read from initializers and from `Constant` nodes alike.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ...runtime import onnx_wire

GLOBAL = math.inf


@dataclass(frozen=True)
class ReceptiveField:
    radius: float | None  # input pixels (an int); math.inf: global; None: the graph walk gave up
    how: str  # "graph", "probe" or "catalog"
    detail: str = ""  # the op that made it global or unknown
    scale: float | None = None  # the output's resolution over the input's, when the walk knows it
    # the graph walk proved `radius` (or a smaller one): tiles with an overlap of at least `radius`
    # give exactly one whole-image run's pixels. A probe only measures: a one-pixel bump's far
    # influence can fall below fp32 resolution (29 px read on RRDBNet x4plus, whose radius is 349).
    proven: bool = False
    # a tile equals a whole-image run bit for bit when the overlap covers `radius`: False when a
    # Resize by a factor that is not a power of two (x3's bicubic 0.75) samples at positions fp32
    # rounds differently in a window than in the whole image (0.003 levels apart on trained x3)
    bit_exact: bool = True

    @property
    def is_global(self) -> bool:
        return self.radius is not None and math.isinf(self.radius)


# ---- protobuf wire format -----------------------------------------------------------------------


def _fields(data):
    """(field number, wire type, value) of one message; non-varint values as slices of ``data``."""
    for number, wire, value in onnx_wire.fields(data):
        yield number, wire, (value if wire == onnx_wire.VARINT else data[value[0] : value[1]])


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _ints(wire: int, value) -> list[int]:
    if wire == 0:
        return [_signed(value)]
    out, pos, data = [], 0, bytes(value)
    while pos < len(data):
        item, pos = onnx_wire.varint(data, pos)
        out.append(_signed(item))
    return out


def _floats(value) -> list[float]:
    data = bytes(value)
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def _attribute(data) -> tuple[str, object]:
    name, single, ints, floats, tensor = "", None, [], [], None
    for number, wire, value in _fields(data):
        if number == 1:
            name = bytes(value).decode()
        elif number == 2:
            single = struct.unpack("<f", bytes(value))[0]
        elif number == 3:
            single = _signed(value)
        elif number == 4:
            single = bytes(value).decode(errors="replace")
        elif number == 5:
            tensor = _tensor(value)
        elif number == 7:
            floats += _floats(value)
        elif number == 8:
            ints += _ints(wire, value)
    return name, tensor if tensor is not None else (ints or floats or single)


@dataclass
class _Tensor:
    name: str
    dims: list[int]
    values: list[float] | None  # only for small float/int64 tensors (Resize scales, sizes)


def _tensor(data) -> _Tensor:
    name, dims, dtype, values, raw = "", [], 0, None, None
    for number, wire, value in _fields(data):
        if number == 1:
            dims += _ints(wire, value)
        elif number == 2:
            dtype = value
        elif number == 4:
            values = (values or []) + _floats(value)
        elif number == 7:
            values = (values or []) + [float(v) for v in _ints(wire, value)]
        elif number == 8:
            name = bytes(value).decode()
        elif number == 9 and len(value) <= 64:
            raw = bytes(value)
    if values is None and raw is not None:
        values = _raw_values(dtype, raw)
    return _Tensor(name, dims, values)


def _raw_values(dtype: int, raw: bytes) -> list[float] | None:
    """A small tensor's raw bytes as floats: float32 (1) and int64 (7) only."""
    if dtype == 1:
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    if dtype == 7:
        return [float(v) for v in struct.unpack(f"<{len(raw) // 8}q", raw)]
    return None


@dataclass
class _Node:
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict


def _constant(node: _Node) -> _Tensor | None:
    """A `Constant` node's value as a tensor named by its output (`torch.onnx.export` puts Resize
    scales there, not in initializers)."""
    if node.op != "Constant" or len(node.outputs) != 1:
        return None
    name, attrs = node.outputs[0], node.attrs
    value = attrs.get("value")
    if isinstance(value, _Tensor):
        return _Tensor(name, value.dims, value.values)
    for key in ("value_ints", "value_floats"):
        if isinstance(attrs.get(key), list):
            return _Tensor(name, [len(attrs[key])], [float(v) for v in attrs[key]])
    for key in ("value_int", "value_float"):
        if isinstance(attrs.get(key), int | float):
            return _Tensor(name, [], [float(attrs[key])])
    return None


def _node(data) -> _Node:
    node = _Node("", [], [], {})
    for n, _, v in _fields(data):
        if n == 1:
            node.inputs.append(bytes(v).decode())
        elif n == 2:
            node.outputs.append(bytes(v).decode())
        elif n == 4:
            node.op = bytes(v).decode()
        elif n == 5:
            key, attr = _attribute(v)
            node.attrs[key] = attr
    return node


def _graph(model: bytes):
    graph = next((v for n, _, v in _fields(model) if n == 7), None)
    if graph is None:
        raise ValueError("no graph in the model file")
    nodes, tensors, inputs, outputs = [], {}, [], []
    for number, _, value in _fields(graph):
        if number == 1:
            node = _node(value)
            nodes.append(node)
            constant = _constant(node)
            if constant is not None:
                tensors[constant.name] = constant
        elif number == 5:
            tensor = _tensor(value)
            tensors[tensor.name] = tensor
        elif number in (11, 12):
            name = next((bytes(v).decode() for n, _, v in _fields(value) if n == 1), "")
            (inputs if number == 11 else outputs).append(name)
    return nodes, tensors, [i for i in inputs if i not in tensors], outputs


# ---- the walk ------------------------------------------------------------------------------------

_POINTWISE = {
    "Add", "Sub", "Mul", "Div", "Pow", "Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid",
    "HardSwish", "Tanh", "Clip", "Identity", "Cast", "Concat", "Neg", "Abs", "Exp", "Log", "Sqrt",
    "Min", "Max", "Where", "Erf", "Elu", "Selu", "Softplus", "Mish", "Gelu", "Round", "Floor",
    "Ceil", "Reciprocal", "BatchNormalization", "Dropout", "Sum",
    "Mean", "Equal", "Greater", "Less", "Not", "And", "Or", "Sign", "Pad",
}
# every output pixel depends on every input pixel
_MIXING = {
    "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "ReduceMean", "ReduceSum", "ReduceMax",
    "ReduceMin", "ReduceL2", "ReduceProd", "MatMul", "Gemm", "Softmax", "LayerNormalization",
    "InstanceNormalization", "GroupNormalization", "Reshape", "Transpose", "Flatten", "Attention",
    "MultiHeadAttention", "Einsum", "TopK", "ArgMax", "ArgMin",
}
_CONV = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"}
_SHAPE_ONLY = {"Shape", "Size", "ConstantOfShape", "Constant", "Range"}


def _kernel(node: _Node, tensors) -> list[int] | None:
    shape = node.attrs.get("kernel_shape")
    if shape:
        return list(shape)
    weight = tensors.get(node.inputs[1]) if len(node.inputs) > 1 else None
    return list(weight.dims[2:]) if weight is not None and len(weight.dims) >= 3 else None


def _reach_of(node: _Node, tensors, scale: float) -> tuple[float, float] | None:
    """(reach added in input pixels, new relative resolution); None when unknown."""
    op = node.op
    if op in _CONV:
        return _conv_reach(node, tensors, scale)
    if op == "DepthToSpace":
        return 0.0, scale * int(node.attrs.get("blocksize", 1))
    if op == "SpaceToDepth":
        block = int(node.attrs.get("blocksize", 1))
        return (block - 1) / scale, scale / block
    if op in ("Resize", "Upsample"):
        return _resize_reach(node, tensors, scale)
    return None


def _conv_reach(node: _Node, tensors, scale: float) -> tuple[float, float] | None:
    kernel = _kernel(node, tensors)
    if kernel is None:
        return None
    dims = len(kernel)
    dilations = list(node.attrs.get("dilations") or [1] * dims)
    strides = list(node.attrs.get("strides") or [1] * dims)
    pads = list(node.attrs.get("pads") or [0] * (2 * dims))
    transposed = node.op == "ConvTranspose"
    reach = 0.0
    for axis in range(dims):
        span = (kernel[axis] - 1) * dilations[axis]
        if transposed:  # an output pixel gathers inputs within span / stride
            side = math.ceil(span / strides[axis])
        elif node.attrs.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER", "VALID"):
            side = span - span // 2
        else:
            begin = pads[axis]
            side = max(begin, span - begin)
        reach = max(reach, side / scale)
    stride = max(strides)
    return reach, scale * stride if transposed else scale / stride


def _resize_reach(node: _Node, tensors, scale: float) -> tuple[float, float] | None:
    factors = _resize_factors(node, tensors)
    if not factors or factors[0] != factors[1] or factors[0] <= 0:
        return None
    factor = float(factors[0])
    mode = node.attrs.get("mode", "nearest")
    taps = {"nearest": 0.0 if factor >= 1 and factor.is_integer() else 1.0, "linear": 1.0}.get(mode, 2.0)
    return taps * max(1.0, 1.0 / factor) / scale, scale * factor


def _resize_factors(node: _Node, tensors) -> list[float] | None:
    """A Resize's (H, W) factors from its `scales` input or attribute; None when unknown or given
    as `sizes` (then the factor depends on the input's size)."""
    factors = None
    for name in node.inputs[1:]:
        tensor = tensors.get(name)
        if tensor is not None and tensor.values and len(tensor.values) == 4 and tensor.dims == [4]:
            if name == node.inputs[-1] and len(node.inputs) == 4:
                return None  # `sizes`: the factor depends on the input's size
            factors = tensor.values[2:]
    if factors is None and node.attrs.get("scales"):
        factors = list(node.attrs["scales"])[2:]
    return factors


def _power_of_two(factor: float) -> bool:
    mantissa, _ = math.frexp(factor)
    return factor > 0 and mantissa == 0.5


def _shifts_exactly(node: _Node, scale: float) -> bool:
    """A Resize samples the same fp32 positions in a window as in the whole image only when its
    factor is a power of two (0.5, 2, 4: positions exact in binary)."""
    return node.op not in ("Resize", "Upsample") or _power_of_two(scale)


def _after(node: _Node, known: list, tensors):
    """((reach, scale, why) after `node`, whether it samples the same fp32 positions in a window
    as in the whole image); None when its reach is unknown."""
    reach, scale, why = max(known, key=lambda k: k[0])
    scale = known[0][1]
    if math.isinf(reach):
        return (reach, scale, why), True
    if node.op in _MIXING:
        return (GLOBAL, scale, node.op), True
    if node.op in _POINTWISE:
        return (reach, scale, why), True
    step = _reach_of(node, tensors, scale)
    if step is None:
        return None
    return (reach + step[0], step[1], why), _shifts_exactly(node, step[1] / scale)


def _walk(nodes, tensors, inputs, outputs) -> ReceptiveField:
    if not inputs or not outputs:
        return ReceptiveField(None, "graph", "no input or output")
    state: dict[str, tuple[float, float, str]] = {inputs[0]: (0.0, 1.0, "")}  # reach, scale, why
    bit_exact = True
    for node in nodes:  # ONNX graphs are topologically sorted
        known = [state[name] for name in node.inputs if name in state]
        if not known or node.op in _SHAPE_ONLY:
            continue  # works on constants and shapes only
        after = _after(node, known, tensors)
        if after is None:
            return ReceptiveField(None, "graph", node.op)
        result, exact = after
        bit_exact = bit_exact and exact
        for name in node.outputs:
            state[name] = result
    final = state.get(outputs[0])
    if final is None:
        return ReceptiveField(None, "graph", "the output does not depend on the image")
    if math.isinf(final[0]):
        return ReceptiveField(GLOBAL, "graph", final[2], proven=True)
    return ReceptiveField(math.ceil(final[0] - 1e-9), "graph", scale=final[1], proven=True, bit_exact=bit_exact)


@lru_cache(maxsize=32)
def _cached(path: str, size: int, mtime: int) -> ReceptiveField:
    data = memoryview(Path(path).read_bytes())  # slices share it: no copy of the weights
    try:
        graph = _graph(data)
    except (ValueError, IndexError, UnicodeDecodeError, struct.error) as exc:
        return ReceptiveField(None, "graph", f"unreadable graph ({exc})")
    return _walk(*graph)


def graph_receptive_field(model_path) -> ReceptiveField:
    """The receptive radius read from the model file's graph, cached per file (size and mtime)."""
    path = Path(model_path).resolve()
    stat = path.stat()
    return _cached(str(path), stat.st_size, stat.st_mtime_ns)
