"""The input shapes an ONNX file declares, read without loading it (bpy-free, no onnx package).

CoreML's `RequireStaticInputShapes` must be decided before the session exists: on for a model
whose inputs are all fixed (it is compiled once, for that shape), off for one with a free
dimension (on, CoreML would take none of its graph). The answer is in the file's graph inputs;
the weights around them can be gigabytes, so this walks the protobuf wire format and seeks past
every field but `ModelProto.graph` (7) and, inside it, `GraphProto.input` (11).
"""

from __future__ import annotations

import io
from pathlib import Path

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(stream) -> int | None:
    shift = result = 0
    while True:
        byte = stream.read(1)
        if not byte:
            return None if shift == 0 else _truncated()
        result |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return result
        shift += 7


def _truncated():
    raise ValueError("truncated protobuf")


def _fields(stream, end: int | None = None):
    """(field number, wire type, value) of a message: varints as ints, LEN fields as (offset,
    length) with the stream left past them; stops at ``end`` or the end of the stream."""
    while end is None or stream.tell() < end:
        tag = _varint(stream)
        if tag is None:
            return
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            yield number, wire, _varint(stream)
        elif wire == _LEN:
            length = _varint(stream)
            start = stream.tell()
            yield number, wire, (start, length)
            stream.seek(start + length)
        elif wire in (_I64, _I32):
            stream.seek(8 if wire == _I64 else 4, io.SEEK_CUR)
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _message(stream, span) -> io.BytesIO:
    stream.seek(span[0])
    return io.BytesIO(stream.read(span[1]))


def _dims(value_info: io.BytesIO) -> tuple | None:
    """ValueInfoProto -> its tensor shape (ints, or None for a free dimension); None without a shape."""
    type_proto = next((_message(value_info, v) for n, w, v in _fields(value_info) if n == 2 and w == _LEN), None)
    # TypeProto.tensor_type (1): sequences and maps have no fixed shape to speak of
    tensor = next((_message(type_proto, v) for n, w, v in _fields(type_proto) if n == 1 and w == _LEN), None)
    shape = next((_message(tensor, v) for n, w, v in _fields(tensor) if n == 2 and w == _LEN), None) if tensor else None
    if shape is None:
        return None
    dims = []
    for number, wire, span in _fields(shape):
        if number == 1 and wire == _LEN:  # Dimension: dim_value (1) or dim_param (2)
            values = {n: v for n, w, v in _fields(_message(shape, span)) if w == _VARINT}
            dims.append(values.get(1))
    return tuple(dims)


def declared_input_shapes(path) -> list[tuple | None]:
    """The graph inputs' shapes as the file declares them (ints, None for a free dimension);
    initializers listed as inputs by old exports are included (their shapes are fixed)."""
    with open(Path(path), "rb") as stream:
        for number, wire, span in _fields(stream):
            if number == 7 and wire == _LEN:  # ModelProto.graph; the stream stands at its start
                return [
                    _dims(_message(stream, g_span))
                    for g_number, g_wire, g_span in _fields(stream, end=span[0] + span[1])
                    if g_number == 11 and g_wire == _LEN  # GraphProto.input
                ]
    return []


def all_inputs_static(path) -> bool:
    """Every input declares every dimension as a number (False when unreadable)."""
    try:
        shapes = declared_input_shapes(path)
    except (OSError, ValueError):
        return False
    return bool(shapes) and all(s is not None and all(d is not None for d in s) for s in shapes)
