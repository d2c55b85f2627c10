"""The protobuf wire format an ONNX file is written in, read without the onnx package (bpy-free).

Blender ships no onnx package, and a model file can be gigabytes of weights around a small graph:
readers walk the wire format over a buffer (bytes, a memoryview or an mmap) and skip the payloads
they do not need. One reader for the three uses: the graph inputs' declared shapes
(runtime/onnx_inputs.py), each output's producing op (models/store/family_check.py) and the receptive
radius walk (models/tiles/receptive.py).
"""

from __future__ import annotations

VARINT, I64, LEN, I32 = 0, 1, 2, 5


def varint(data, pos: int) -> tuple[int, int]:
    """(value, position after it); IndexError when the data ends inside it."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(data, start: int = 0, end: int | None = None):
    """(field number, wire type, value) of the message in ``data[start:end]``: varints as ints,
    every other field as its (start, end) span in ``data`` (nothing is copied or read past)."""
    pos, end = start, len(data) if end is None else end
    while pos < end:
        key, pos = varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = varint(data, pos)
            yield number, wire, value
            continue
        if wire == LEN:
            length, pos = varint(data, pos)
        elif wire in (I64, I32):
            length = 8 if wire == I64 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos + length > end:
            raise ValueError("truncated protobuf")
        yield number, wire, (pos, pos + length)
        pos += length


def first(data, number: int, start: int = 0, end: int | None = None) -> tuple[int, int] | None:
    """The span of the first LEN field ``number`` of the message in ``data[start:end]``; None
    without one (a submessage such as ``ModelProto.graph``, 7)."""
    return next((v for n, w, v in fields(data, start, end) if n == number and w == LEN), None)
