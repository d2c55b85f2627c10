"""A float RGBA OpenEXR file (32-bit samples, ZIP compression in blocks of 16 lines), written a band
of rows at a time (models/file_bytes/bands.py): what a float result is packed from. Lossless, so the
image reads back the very floats given (premultiplied, as Blender's float buffers and EXR hold them).

The layout follows the OpenEXR file format ("The OpenEXR File Layout" and ImfZip.cpp): header
attributes, a table of chunk offsets, then per chunk its first line, its size and the block: each
line's channels in name order (A, B, G, R), the bytes split into even and odd halves, each byte
stored as its difference to the one before (+128), deflated; a block that deflate does not shrink
is stored as it is."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from .bands import BandedFile, Rows

MAGIC = 20000630
LINES_PER_BLOCK = 16  # ZIP_COMPRESSION
ZIP_COMPRESSION = 3
HALF_SAMPLES = 1
FLOAT_SAMPLES = 2
CHANNELS = (("A", 3), ("B", 2), ("G", 1), ("R", 0))  # (name, index in RGBA), in the file's name order
DEFLATE_LEVEL = 1


class ExrFile(BandedFile):
    """``half``: 16-bit half samples, as Blender's writer saves a new float image (a Process
    Sequence frame's file must hold what Blender's writer gave); else 32-bit floats."""

    row_multiple = LINES_PER_BLOCK
    suffix = ".exr"

    def __init__(self, height: int, width: int, rows: Rows, *, half: bool = False):
        super().__init__(height, width, rows)
        self._sample_type, pixel_type = ("<f2", HALF_SAMPLES) if half else ("<f4", FLOAT_SAMPLES)
        self._out.write(_header(width, height, pixel_type))
        # the table of chunk offsets, filled in at the end: one chunk a block, their count known now
        self._table_at, self._offsets = self._out.tell(), []
        self._out.write(bytes(8 * -(-height // LINES_PER_BLOCK)))

    @property
    def is_float(self) -> bool:
        return True

    def _write(self, band: np.ndarray, start: int) -> None:
        planar = np.ascontiguousarray(band[..., [index for _, index in CHANNELS]].transpose(0, 2, 1), self._sample_type)
        for top in range(0, band.shape[0], LINES_PER_BLOCK):
            raw = planar[top : top + LINES_PER_BLOCK].view(np.uint8).reshape(-1)
            data = _zip_block(raw)
            self._offsets.append(self._out.tell())
            self._out.write(struct.pack("<ii", start + top, len(data)))
            self._out.write(data)

    def _end(self) -> None:
        self._fill(self._table_at, struct.pack(f"<{len(self._offsets)}Q", *self._offsets))


def _zip_block(raw: np.ndarray) -> bytes:
    reordered = np.concatenate((raw[0::2], raw[1::2]))
    predicted = np.empty_like(reordered)
    predicted[0] = reordered[0]
    np.subtract(reordered[1:], reordered[:-1], out=predicted[1:])  # wraps modulo 256 as uint8
    predicted[1:] += 128
    data = zlib.compress(predicted, DEFLATE_LEVEL)
    return data if len(data) < raw.size else raw.tobytes()


def _attribute(name: str, kind: str, value: bytes) -> bytes:
    return name.encode() + b"\0" + kind.encode() + b"\0" + struct.pack("<i", len(value)) + value


def _header(width: int, height: int, pixel_type: int) -> bytes:
    channels = b"".join(name.encode() + b"\0" + struct.pack("<iB3xii", pixel_type, 0, 1, 1) for name, _ in CHANNELS)
    window = struct.pack("<iiii", 0, 0, width - 1, height - 1)
    return b"".join((
        struct.pack("<ii", MAGIC, 2),
        _attribute("channels", "chlist", channels + b"\0"),
        _attribute("compression", "compression", bytes([ZIP_COMPRESSION])),
        _attribute("dataWindow", "box2i", window),
        _attribute("displayWindow", "box2i", window),
        _attribute("lineOrder", "lineOrder", b"\0"),  # INCREASING_Y: the top line first
        _attribute("pixelAspectRatio", "float", struct.pack("<f", 1.0)),
        _attribute("screenWindowCenter", "v2f", struct.pack("<ff", 0.0, 0.0)),
        _attribute("screenWindowWidth", "float", struct.pack("<f", 1.0)),
        b"\0",
    ))
