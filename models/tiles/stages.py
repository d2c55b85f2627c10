"""Staged tiling: a fully convolutional upscaler cut into a body and a head at one tensor.

A deep super-resolution net (RRDBNet: 23 blocks at 1x resolution, 349 px of receptive radius) is
two nets in one: a *body* that runs at the input's resolution and holds nearly all the compute and
nearly all the reach, and a *head* (upsample, a few convs at 2x and 4x) that reaches two or three
pixels and holds most of the memory (64 channels at 16x the pixels). Tiled as one net, every
window pays the body's reach in overlap (3.6x the compute at 352 px windows). Cut apart, the body
runs over the whole image (or large windows: ~1-2 KB per pixel, not ~16 KB) and the head runs in
small windows whose overlap covers its own, proven radius: the output is exact when the body ran
whole, at about 1.0x the compute.

The cut is the last tensor that alone carries everything forward (every later node depends on the
input only through it) before the first node that changes the resolution; the sub-graphs are cut
with onnx's Extractor and kept per model content in the models folder's cache folder, and run
through the shared runtime like any model file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ...runtime import onnx_wire
from ..files import write_bytes
from .reach_cache import content_hash
from .receptive import _constant, _node, _resize_factors, _tensor, graph_receptive_field

UPSAMPLING_OPS = {"Resize", "Upsample", "DepthToSpace", "ConvTranspose"}
SHRINKING_OPS = {"SpaceToDepth", "MaxPool", "AveragePool"}
POINTWISE_OPS = {
    "LeakyRelu",
    "Relu",
    "PRelu",
    "Mul",
    "Add",
    "Sum",
    "Sub",
    "Div",
    "Sigmoid",
    "Clip",
    "Identity",
}
STAGE_VERSION = 1  # bump when the cut or the files change: old stage files are then not reused
MEMORY_MARGIN = 1.25
"""On top of the largest sum of tensors alive at once: ORT's own buffers (a conv's workspace, the
arena's rounding) came to 1.1x it for x4plus's head, measured here; its body needs less than it."""
FLOAT_TYPES = {1: 4, 10: 2}  # ONNX elem_type -> bytes (float32, float16)


@dataclass(frozen=True)
class Stages:
    body: Path  # input -> the cut tensor (scale 1)
    head: Path  # the cut tensor -> output
    cut: str  # the tensor's name
    channels: int  # the cut tensor's channels
    body_share: float  # the body's part of one whole-image run's multiply-adds
    body_bytes_per_pixel: float  # working memory per input pixel, from the graph (MEMORY_MARGIN included)
    head_bytes_per_pixel: float
    head_radius: int  # the head's receptive radius (input pixels), proven by the graph walk


_found: dict[str, Stages | None] = {}


def stages_for(model_path, folder: Path) -> Stages | None:
    """The model's stages (cut once per model content, files kept in `folder`), or None when it has
    no single-tensor cut at its input's resolution before it upsamples, or its head's radius is not
    proven from the graph."""
    digest = content_hash(model_path)
    if digest not in _found:
        try:
            _found[digest] = _cut(Path(model_path), digest, folder)
        except (ValueError, IndexError, UnicodeDecodeError, KeyError):
            _found[digest] = None  # a graph this reader does not follow: tiled as one net
    return _found[digest]


@dataclass
class _Parsed:
    data: bytes
    graph_span: tuple[int, int]
    nodes: list  # (node, raw bytes)
    initializers: dict  # name -> (tensor, raw bytes)
    inputs: list  # raw ValueInfo bytes
    outputs: list
    input_names: list
    output_names: list
    elem_type: int


def _parse(data: bytes) -> _Parsed:
    span = onnx_wire.first(data, 7)
    if span is None:
        raise ValueError("no graph")
    nodes, inits, inputs, outputs, in_names, out_names = [], {}, [], [], [], []
    for number, _wire, value in onnx_wire.fields(data, *span):
        if not isinstance(value, tuple):
            continue
        raw = data[value[0] : value[1]]
        if number == 1:
            nodes.append((_node(memoryview(raw)), raw))
        elif number == 5:
            tensor = _tensor(memoryview(raw))
            inits[tensor.name] = (tensor, raw)
        elif number in (11, 12):
            name = next(bytes(raw[v[0] : v[1]]).decode() for n, _w, v in onnx_wire.fields(raw) if n == 1)
            if number == 11 and name not in inits:
                inputs.append(raw)
                in_names.append(name)
            elif number == 12:
                outputs.append(raw)
                out_names.append(name)
    if len(in_names) != 1 or not out_names:
        raise ValueError("not one image input")
    return _Parsed(data, span, nodes, inits, inputs, outputs, in_names, out_names, _elem_type(inputs[0]))


def _elem_type(value_info: bytes) -> int:
    type_span = onnx_wire.first(value_info, 2)
    tensor_span = onnx_wire.first(value_info, 1, *type_span) if type_span else None
    if tensor_span is None:
        raise ValueError("the input is not a tensor")
    return next(
        v for n, w, v in onnx_wire.fields(value_info, *tensor_span) if n == 1 and w == onnx_wire.VARINT
    )


def _cut(model_path: Path, digest: str, folder: Path) -> Stages | None:
    parsed = _parse(model_path.read_bytes())
    found = find_cut(parsed)
    if found is None or parsed.elem_type not in FLOAT_TYPES:
        return None
    index, cut = found
    flow = _flow(parsed)
    if flow is None or cut not in flow:
        return None
    work = _work(parsed, flow, index)
    memory = _peak_bytes(parsed, flow, index, FLOAT_TYPES[parsed.elem_type])
    channels = flow[cut][0]
    body, head = (folder / f"{digest}.v{STAGE_VERSION}.{part}.onnx" for part in ("body", "head"))
    cut_info = _value_info(cut, parsed.elem_type, channels)
    for path, nodes, inputs, outputs in (
        (body, range(index + 1), parsed.inputs, [cut_info]),
        (head, range(index + 1, len(parsed.nodes)), [cut_info], parsed.outputs),
    ):
        if not path.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            write_bytes(path, _sub_model(parsed, list(nodes), inputs, outputs))
    radius = graph_receptive_field(head)
    if radius.radius is None or radius.is_global or not radius.proven:
        return None
    total = sum(work)
    return Stages(
        body, head, cut, int(channels), work[0] / total if total else 1.0,
        MEMORY_MARGIN * memory[0], MEMORY_MARGIN * memory[1], math.ceil(radius.radius),
    )  # fmt: skip


def _static(parsed: _Parsed) -> set[str]:
    constants = {o for node, _ in parsed.nodes if node.op == "Constant" for o in node.outputs}
    return set(parsed.initializers) | constants


def _last_use(parsed: _Parsed, static: set[str]) -> dict[str, int]:
    last = {}
    for i, (node, _) in enumerate(parsed.nodes):
        for name in node.inputs:
            if name and name not in static:
                last[name] = i
    for name in parsed.output_names:
        last[name] = len(parsed.nodes)
    return last


def find_cut(parsed: _Parsed) -> tuple[int, str] | None:
    """(node index, tensor): the last point before the first upsampling node where exactly one
    computed tensor is alive (needed later), not the graph's input; None when there is none, or
    when anything before it changes the resolution (a strided conv, a pooling)."""
    static = _static(parsed)
    last_use = _last_use(parsed, static)
    source = parsed.input_names[0]
    live, found = {source}, None
    for i, (node, _) in enumerate(parsed.nodes):
        if node.op in UPSAMPLING_OPS:
            return found
        if node.op in SHRINKING_OPS or any(s != 1 for s in node.attrs.get("strides") or [1]):
            return None
        live = {
            t for t in live | {o for o in node.outputs if o and o not in static} if last_use.get(t, -1) > i
        }
        if len(live) == 1 and source not in live:
            found = (i, next(iter(live)))
    return None


def _flow(parsed: _Parsed) -> dict[str, tuple[int, float]] | None:
    """Each computed tensor's (channels, resolution over the input's); None at an op not followed."""
    tensors = {name: tensor for name, (tensor, _) in parsed.initializers.items()}
    for node, _ in parsed.nodes:
        constant = _constant(node)
        if constant is not None:
            tensors[constant.name] = constant
    flow = {parsed.input_names[0]: (3, 1.0)}
    for node, _ in parsed.nodes:
        known = [flow[name] for name in node.inputs if name in flow]
        if node.op == "Constant" or not known:
            continue
        after = _after(node, known, tensors)
        if after is None:
            return None
        for name in node.outputs:
            flow[name] = after
    return flow


def _after(node, known, tensors) -> tuple[int, float] | None:
    channels, scale = known[0]
    if node.op == "Conv":
        weight = tensors.get(node.inputs[1])
        return (weight.dims[0], scale) if weight is not None else None
    if node.op == "Concat" and node.attrs.get("axis") in (1, -3):
        return sum(c for c, _ in known), scale
    if node.op in POINTWISE_OPS:
        return max(c for c, _ in known), scale
    if node.op in ("Resize", "Upsample"):
        factors = _resize_factors(node, tensors)
        return (channels, scale * factors[0]) if factors and factors[0] == factors[1] else None
    if node.op == "DepthToSpace":
        block = int(node.attrs.get("blocksize", 1))
        return channels // (block * block), scale * block
    return None


def _work(parsed: _Parsed, flow, cut_index: int) -> tuple[float, float]:
    """Multiply-adds per input pixel of the convs up to and after the cut."""
    weights = {name: tensor.dims for name, (tensor, _) in parsed.initializers.items()}
    parts = [0.0, 0.0]
    for i, (node, _) in enumerate(parsed.nodes):
        if node.op == "Conv" and node.outputs[0] in flow and node.inputs[1] in weights:
            channels, scale = flow[node.outputs[0]]
            parts[i > cut_index] += channels * scale * scale * math.prod(weights[node.inputs[1]][1:])
    return parts[0], parts[1]


def _peak_bytes(parsed: _Parsed, flow, cut_index: int, element: int) -> tuple[float, float]:
    """The largest sum of tensors alive at once per input pixel, in the body and in the head."""
    static = _static(parsed)
    last_use = _last_use(parsed, static)
    live, peaks = {parsed.input_names[0]}, [0.0, 0.0]

    def size(name):
        channels, scale = flow.get(name, (0, 1.0))
        return element * channels * scale * scale

    for i, (node, _) in enumerate(parsed.nodes):
        outs = {o for o in node.outputs if o and o not in static}
        stage = int(i > cut_index)
        peaks[stage] = max(peaks[stage], sum(size(t) for t in live | outs))
        live = {t for t in live | outs if last_use.get(t, -1) > i}
    return peaks[0], peaks[1]


# ---- writing a sub-model ---------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | onnx_wire.LEN) + _varint(len(payload)) + payload


def _value_info(name: str, elem_type: int, channels: int) -> bytes:
    """A ValueInfoProto: a tensor [batch, channels, height, width] of `elem_type`."""
    dims = [
        _field(2, b"batch"),
        _varint(1 << 3) + _varint(channels),
        _field(2, b"height"),
        _field(2, b"width"),
    ]
    shape = b"".join(_field(1, dim) for dim in dims)
    tensor_type = _varint(1 << 3) + _varint(elem_type) + _field(2, shape)
    return _field(1, name.encode()) + _field(2, _field(1, tensor_type))


def _sub_model(parsed: _Parsed, indices: list[int], inputs: list[bytes], outputs: list[bytes]) -> bytes:
    """The model file with only the nodes at `indices` (plus the Constant nodes they read), the
    initializers they read, and the given inputs and outputs."""
    chosen = set(indices)
    used = {name for i in indices for name in parsed.nodes[i][0].inputs}
    constants = [
        i for i, (node, _) in enumerate(parsed.nodes) if node.op == "Constant" and set(node.outputs) & used
    ]
    order = sorted(chosen | set(constants), key=lambda i: (i not in constants, i))
    graph = b"".join(_field(1, parsed.nodes[i][1]) for i in order)
    graph += _field(2, b"stage")
    graph += b"".join(_field(5, raw) for name, (_, raw) in parsed.initializers.items() if name in used)
    graph += b"".join(_field(11, raw) for raw in inputs) + b"".join(_field(12, raw) for raw in outputs)
    data = parsed.data
    head = b""
    for number, wire, value in onnx_wire.fields(data):
        if number == 7:
            continue
        head += _varint(number << 3 | wire) + (
            _varint(value) if wire == onnx_wire.VARINT else _span(data, wire, value)
        )
    return head + _field(7, graph)


def _span(data: bytes, wire: int, value: tuple[int, int]) -> bytes:
    raw = data[value[0] : value[1]]
    return _varint(len(raw)) + raw if wire == onnx_wire.LEN else raw
