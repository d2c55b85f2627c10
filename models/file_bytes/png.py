"""An 8-bit RGBA PNG of straight float pixels, deflated a band of rows at a time (models/file_bytes/bands.py).

Deflate level 1: Blender's own pack() compresses the whole image in one call (about 0.7 s for
2048x2048); level 1 takes a tenth of that on a smooth image, and the packed copy stays far smaller
than the pixels (level 0, stored, would double what a kept result holds in memory). Rounds as
Blender does when float pixels go into a byte image (x * 255 + 0.5)."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from .bands import BandedFile, Rows

SIGNATURE = b"\x89PNG\r\n\x1a\n"
DEFLATE_LEVEL = 1


class PngFile(BandedFile):
    suffix = ".png"

    def __init__(self, height: int, width: int, rows: Rows):
        super().__init__(height, width, rows)
        self._deflate = zlib.compressobj(DEFLATE_LEVEL)
        header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)  # 8 bits, RGBA, no interlace
        self._out.write(SIGNATURE + _chunk(b"IHDR", header))
        # one IDAT chunk, its length filled in at the end and its CRC kept as its data comes
        self._idat_at, self._idat_size, self._idat_crc = self._out.tell(), 0, zlib.crc32(b"IDAT")
        self._out.write(b"\0\0\0\0IDAT")

    def _write(self, band: np.ndarray, start: int) -> None:
        count = band.shape[0]
        rows = np.empty((count, 1 + 4 * self.width), np.uint8)
        rows[:, 0] = 0  # filter "None" on every row
        scaled = np.multiply(band, 255.0, dtype=np.float32)
        scaled += 0.5
        np.clip(scaled, 0.0, 255.0, out=scaled)
        rows[:, 1:] = scaled.reshape(count, -1)  # truncation after +0.5: round half up
        self._idat(self._deflate.compress(rows))

    def _idat(self, data: bytes) -> None:
        self._out.write(data)
        self._idat_size += len(data)
        self._idat_crc = zlib.crc32(data, self._idat_crc)

    def _end(self) -> None:
        self._idat(self._deflate.flush())
        self._out.write(struct.pack(">I", self._idat_crc) + _chunk(b"IEND", b""))
        self._fill(self._idat_at, struct.pack(">I", self._idat_size))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))
