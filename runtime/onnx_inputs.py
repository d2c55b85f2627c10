"""The input shapes an ONNX file declares, read without loading it (bpy-free, no onnx package).

CoreML's `RequireStaticInputShapes` must be decided before the session exists: on for a model
whose inputs are all fixed (it is compiled once, for that shape), off for one with a free
dimension (on, CoreML would take none of its graph). The answer is in the file's graph inputs;
the weights around them can be gigabytes, so this walks the protobuf wire format (runtime/onnx_wire.py)
over a memory map, skipping every field but `ModelProto.graph` (7) and, inside it, `GraphProto.input` (11).
"""

from __future__ import annotations

import mmap
from pathlib import Path

from .onnx_wire import LEN, VARINT, fields, first


def _dims(buf, value_info) -> tuple | None:
    """ValueInfoProto -> its tensor shape (ints, or None for a free dimension); None without a shape."""
    type_proto = first(buf, 2, *value_info)
    # TypeProto.tensor_type (1): sequences and maps have no fixed shape to speak of
    tensor = first(buf, 1, *type_proto) if type_proto else None
    shape = first(buf, 2, *tensor) if tensor else None
    if shape is None:
        return None
    dims = []
    for number, wire, span in fields(buf, *shape):
        if number == 1 and wire == LEN:  # Dimension: dim_value (1) or dim_param (2)
            values = {n: v for n, w, v in fields(buf, *span) if w == VARINT}
            dims.append(values.get(1))
    return tuple(dims)


def declared_input_shapes(path) -> list[tuple | None]:
    """The graph inputs' shapes as the file declares them (ints, None for a free dimension);
    initializers listed as inputs by old exports are included (their shapes are fixed)."""
    with open(Path(path), "rb") as fh:
        if not fh.seek(0, 2):
            return []
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:  # pages read only where walked
            graph = first(buf, 7)  # ModelProto.graph
            if graph is None:
                return []
            # GraphProto.input (11)
            return [_dims(buf, span) for number, wire, span in fields(buf, *graph) if number == 11 and wire == LEN]


def all_inputs_static(path) -> bool:
    """Every input declares every dimension as a number (False when unreadable)."""
    try:
        shapes = declared_input_shapes(path)
    except (OSError, ValueError, IndexError):
        return False
    return bool(shapes) and all(s is not None and all(d is not None for d in s) for s in shapes)


def _external_length(buf, tensor) -> int:
    """The ``length`` an external-data tensor names (TensorProto.external_data, 13); 0 without."""
    for number, wire, span in fields(buf, *tensor):
        if number == 13 and wire == LEN:
            entry = {n: bytes(buf[v[0] : v[1]]) for n, w, v in fields(buf, *span) if w == LEN}
            if entry.get(1) == b"length" and entry.get(2, b"").isdigit():
                return int(entry[2])
    return 0


def _tensor_bytes(buf, tensor) -> int:
    return (tensor[1] - tensor[0]) + _external_length(buf, tensor)


def weights_bytes(path) -> int:
    """Bytes of the weights a model file holds: its initializers (in the file, or the length
    its external data names) and its Constant nodes' tensors. What the report calls the model's
    weights: a measured RSS growth on load is the session's whole cost, not its weights."""
    total = 0
    with open(Path(path), "rb") as fh:
        if not fh.seek(0, 2):
            return 0
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            graph = first(buf, 7)  # ModelProto.graph
            for number, wire, span in fields(buf, *graph) if graph else ():
                if number in (5, 15) and wire == LEN:  # GraphProto.initializer, sparse_initializer
                    total += _tensor_bytes(buf, span)
                elif number == 1 and wire == LEN:  # a NodeProto: a Constant's value is a weight too
                    node = list(fields(buf, *span))
                    op = next((bytes(buf[v[0] : v[1]]) for n, w, v in node if n == 4 and w == LEN), b"")
                    if op == b"Constant":
                        total += sum(v[1] - v[0] for n, w, v in node if n == 5 and w == LEN)
    return total
