"""A baseline JPEG of straight float pixels, as Blender's writer saves an 8-bit image (bpy-free,
numpy only: Blender's Python has no Pillow), encoded a band of MCU rows at a time
(models/file_bytes/bands.py): a Process Sequence frame saved as .jpg took Blender's writer 0.4-0.5 s
of the main thread in one call at 3840x2160 (issue #37 item 3).

What Blender 5.0's writer (libjpeg-turbo, imbuf's jpeg.cc) gives an image saved from Python:
quality 90 whatever the scene's settings, JFIF YCbCr with 4:2:0 chroma (libjpeg's defaults), its
"NeoGeo" APP1 marker (which its reader takes the quality back from), the standard Huffman tables,
RGB only (alpha dropped, not composited; a grey image as three equal channels). Here as there:
pixels to bytes as Blender rounds them (x * 255 + 0.5), libjpeg's fixed-point colour conversion,
its 2x2 chroma averages (alternating rounding bias), edges repeated as it repeats them, and its
float DCT and quantisation (models/file_bytes/jpeg_dct.py): the file decodes to the very pixels of
Blender's. The bytes differ a little (0.04% more of them for bench/jpeg_frame.py's 3840x2160
frame): every MCU row is a restart interval (DRI + RSTn), so each band is coded on its own
(models/file_bytes/jpeg_scan.py), and the blocks past the right and bottom edges, which no decoder
shows, hold the repeated pixels where libjpeg writes flat ones."""

from __future__ import annotations

import struct

import numpy as np

from . import jpeg_dct
from .bands import BandedFile, Rows
from .jpeg_scan import HUFFMAN_TABLES, scan_rows

BLENDER_QUALITY = 90
MCU_SIDE = 16  # 4:2:0: 2x2 luminance blocks, one block of each chroma
# ITU T.81 Annex K.1 (libjpeg's std_luminance_quant_tbl, std_chrominance_quant_tbl), natural order
_LUMINANCE_QUANT = (
    16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57, 69, 56,
    14, 17, 22, 29, 51, 87, 80, 62, 18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99,
)
_CHROMINANCE_QUANT = (
    17, 18, 24, 47, 99, 99, 99, 99, 18, 21, 26, 66, 99, 99, 99, 99, 24, 26, 56, 99, 99, 99, 99, 99,
    47, 66, 99, 99, 99, 99, 99, 99, *(99,) * 32,
)
# natural index of each zigzag position: along the anti-diagonals, alternating direction
ZIGZAG = np.array(sorted(range(64), key=lambda n: (n // 8 + n % 8, n // 8 if (n // 8 + n % 8) % 2 else n % 8)))
# libjpeg's jccolor.c: coefficients scaled by 2**16 (exact in float32 products and sums)
_TO_YCC = (np.array([[19595, 38470, 7471], [-11059, -21709, 32768], [32768, -27439, -5329]]) / 65536).astype(np.float32)
_YCC_OFFSET = (np.array([32768, (128 << 16) + 32767, (128 << 16) + 32767]) / 65536).astype(np.float32)
_CHROMA_BIAS = np.array([1, 2], np.float32)  # h2v2_downsample: 1, 2, 1, 2... across a row
_TABLE_OF_BLOCK = np.array([0, 0, 0, 0, 1, 1])  # an MCU's Y, Y, Y, Y, Cb, Cr


def quality_table(base: tuple[int, ...], quality: int) -> np.ndarray:
    """libjpeg's jpeg_quality_scaling and jpeg_add_quant_table (baseline: at most 255)."""
    quality = min(max(quality, 1), 100)
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return np.clip((np.array(base, np.int64) * scale + 50) // 100, 1, 255)


class JpegFile(BandedFile):
    """``rows`` gives straight float RGBA rows (alpha not written); a band is whole MCU rows."""

    row_multiple = MCU_SIDE
    suffix = ".jpg"

    def __init__(self, height: int, width: int, rows: Rows, *, quality: int = BLENDER_QUALITY):
        super().__init__(height, width, rows)
        self.quality = quality
        self._tables = (quality_table(_LUMINANCE_QUANT, quality), quality_table(_CHROMINANCE_QUANT, quality))
        self._luminance, self._chrominance = (jpeg_dct.divisors(table) for table in self._tables)
        self._mcu_columns = -(-width // MCU_SIDE)
        self._last_mcu_row = -(-height // MCU_SIDE) - 1
        self._row_tables = np.tile(_TABLE_OF_BLOCK, self._mcu_columns)
        self._chroma_bias = np.resize(_CHROMA_BIAS, self._mcu_columns * 8)
        self._samples = np.empty(0, np.float32)  # reused by every band: fresh pages cost as much as the arithmetic
        self._out.write(_header(width, height, self._tables, self._mcu_columns, quality))

    def _write(self, band: np.ndarray, start: int) -> None:
        luminance, *chroma = self._levels(band)
        mcu_rows, columns = luminance.shape[0] // MCU_SIDE, self._mcu_columns
        blocks = np.empty((mcu_rows, columns, 6, 64), np.int32)
        luminance -= 128
        samples = luminance.reshape(mcu_rows, 2, 8, columns, 2, 8).transpose(2, 5, 0, 3, 1, 4).reshape(8, 8, -1)
        blocks[:, :, :4] = jpeg_dct.quantised(samples, self._luminance, ZIGZAG).reshape(mcu_rows, columns, 4, 64)
        chroma_rows = -(-band.shape[0] // 2)  # below them, libjpeg repeats the last chroma row, not the pixels
        for index, plane in enumerate(chroma, start=4):
            plane = _subsampled(plane, self._chroma_bias)
            plane[chroma_rows:] = plane[chroma_rows - 1 : chroma_rows]
            plane -= 128
            samples = plane.reshape(mcu_rows, 8, columns, 8).transpose(1, 3, 0, 2).reshape(8, 8, -1)
            blocks[:, :, index] = jpeg_dct.quantised(samples, self._chrominance, ZIGZAG).reshape(mcu_rows, columns, 64)
        _dc_differences(blocks)
        self._out.write(scan_rows(blocks.reshape(mcu_rows, columns * 6, 64), self._row_tables,
                                     start // MCU_SIDE, self._last_mcu_row))

    def _levels(self, band: np.ndarray) -> np.ndarray:
        """The band's Y, Cb and Cr planes of levels (0..255, as float32), the pixels repeated at
        the right and at the bottom to whole MCUs. Every channel given is scaled (alpha too: a
        contiguous pass is ten times faster than one over RGB of RGBA); alpha is not read after."""
        rows, width, channels = band.shape
        shape = (-(-rows // MCU_SIDE) * MCU_SIDE, self._mcu_columns * MCU_SIDE, channels)
        if self._samples.size < np.prod(shape):
            self._samples = np.empty(np.prod(shape), np.float32)
        samples = self._samples[: np.prod(shape)].reshape(shape)
        inside = samples[:rows, :width]
        np.multiply(band, 255.0, out=inside)
        inside += 0.5
        np.clip(inside, 0.0, 255.0, out=inside)
        np.floor(inside, out=inside)  # Blender's bytes: truncated after + 0.5
        samples[:rows, width:] = samples[:rows, width - 1 : width]
        samples[rows:] = samples[rows - 1 : rows]
        # exact: integer products and sums under 2**24, over 2**16; no matrix product, whose BLAS
        # threads would spin on the cores the model worker computes on
        red, green, blue = (samples[..., channel] for channel in range(3))
        planes = np.empty((3, *samples.shape[:2]), np.float32)
        for plane, (to_red, to_green, to_blue), offset in zip(planes, _TO_YCC, _YCC_OFFSET, strict=True):
            np.multiply(red, to_red, out=plane)
            plane += green * to_green
            plane += blue * to_blue
            plane += offset
            np.floor(plane, out=plane)
        return planes

    def _end(self) -> None:
        self._samples = np.empty(0, np.float32)
        self._out.write(b"\xff\xd9")  # EOI


def _subsampled(plane: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """2x2 averages as libjpeg's h2v2_downsample: (sum + bias) >> 2, bias 1 and 2 by turns."""
    pairs = plane[0::2] + plane[1::2]
    sums = pairs[:, 0::2] + pairs[:, 1::2]
    sums += bias
    sums *= 0.25
    return np.floor(sums, out=sums)


def _dc_differences(blocks: np.ndarray) -> None:
    """Each DC minus the one before of its component in the MCU row (restart intervals: none
    before the first)."""
    rows, columns = blocks.shape[:2]
    luminance = blocks[:, :, :4, 0].reshape(rows, columns * 4)
    blocks[:, :, :4, 0] = np.diff(luminance, axis=1, prepend=0).reshape(rows, columns, 4)
    for index in (4, 5):
        blocks[:, :, index, 0] = np.diff(blocks[:, :, index, 0], axis=1, prepend=0)


def _segment(marker: int, payload: bytes) -> bytes:
    return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload


def _header(width: int, height: int, tables, restart_interval: int, quality: int) -> bytes:
    """SOI to SOS, as libjpeg writes them for Blender (with DRI: one restart interval a row)."""
    parts = [b"\xff\xd8", _segment(0xE0, b"JFIF\0" + struct.pack(">BBBHHBB", 1, 1, 0, 1, 1, 0, 0)),
             _segment(0xE1, b"NeoGeo\0\0\0" + bytes([quality]))]
    for number, table in enumerate(tables):
        parts.append(_segment(0xDB, bytes([number]) + table[ZIGZAG].astype(np.uint8).tobytes()))
    components = b"".join(struct.pack(">BBB", *component) for component in ((1, 0x22, 0), (2, 0x11, 1), (3, 0x11, 1)))
    parts.append(_segment(0xC0, struct.pack(">BHHB", 8, height, width, 3) + components))
    for kind, (counts, symbols) in HUFFMAN_TABLES:
        parts.append(_segment(0xC4, bytes([kind, *counts, *symbols])))
    parts.append(_segment(0xDD, struct.pack(">H", restart_interval)))
    parts.append(_segment(0xDA, bytes([3, 1, 0x00, 2, 0x11, 3, 0x11, 0, 63, 0])))
    return b"".join(parts)
