"""An RGBA TIFF of 8- or 16-bit samples, written a band of rows at a time (models/file_bytes/bands.py):
each band becomes strips of :data:`ROWS_PER_STRIP` rows, differenced (predictor 2) and deflated, as
Blender's own TIFFs are (libtiff's "Adobe deflate"). The samples are given as Blender's writer
stores them (blender_samples.py).

The layout follows the TIFF 6.0 specification: a little-endian header, the strips, then the one
image file directory (IFD) whose StripOffsets and StripByteCounts point at them (the header's offset
of the IFD is filled in once the strips are written)."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from .bands import BandedFile, Rows

ROWS_PER_STRIP = 16
DEFLATE_LEVEL = 1
SHORT, LONG = 3, 4  # field types
ADOBE_DEFLATE = 8
RGB = 2  # PhotometricInterpretation
HORIZONTAL_DIFFERENCING = 2  # Predictor
ASSOCIATED_ALPHA, UNASSOCIATED_ALPHA = 1, 2  # ExtraSamples
UNSIGNED_INTEGER = 1  # SampleFormat


class TiffFile(BandedFile):
    """``rows`` gives uint8 or uint16 RGBA samples (``sixteen_bit``); ``associated_alpha``: the
    colour is premultiplied (ExtraSamples 1, Pillow's "RGBa"), as Blender writes 16-bit TIFFs."""

    row_multiple = ROWS_PER_STRIP
    suffix = ".tif"

    def __init__(self, height: int, width: int, rows: Rows, *, sixteen_bit: bool, associated_alpha: bool):
        super().__init__(height, width, rows)
        self._dtype = np.dtype("<u2" if sixteen_bit else "u1")
        self._associated_alpha = associated_alpha
        # the header's IFD offset, filled in at the end: the IFD follows the strips
        self._out.write(b"II*\0\0\0\0\0")
        self._offsets: list[int] = []
        self._counts: list[int] = []

    def _write(self, band: np.ndarray, start: int) -> None:
        samples = np.ascontiguousarray(band, self._dtype)
        differenced = samples.copy()
        np.subtract(samples[:, 1:], samples[:, :-1], out=differenced[:, 1:])  # each sample minus its left neighbour's, wrapping
        for top in range(0, len(differenced), ROWS_PER_STRIP):
            strip = zlib.compress(differenced[top : top + ROWS_PER_STRIP], DEFLATE_LEVEL)
            self._offsets.append(self._out.tell())
            self._counts.append(len(strip))
            self._out.write(strip)

    def _end(self) -> None:
        position = self._out.tell()
        padding = b"\0" * (position % 2)  # the IFD starts on a word boundary
        position += len(padding)
        bits = 8 * self._dtype.itemsize
        # values of more than 4 bytes follow the IFD, each at the offset its entry gives
        entries = (
            (256, LONG, [self.width]),  # ImageWidth
            (257, LONG, [self.height]),  # ImageLength
            (258, SHORT, [bits] * 4),  # BitsPerSample
            (259, SHORT, [ADOBE_DEFLATE]),  # Compression
            (262, SHORT, [RGB]),  # PhotometricInterpretation
            (273, LONG, self._offsets),  # StripOffsets
            (277, SHORT, [4]),  # SamplesPerPixel
            (278, LONG, [ROWS_PER_STRIP]),  # RowsPerStrip
            (279, LONG, self._counts),  # StripByteCounts
            (284, SHORT, [1]),  # PlanarConfiguration: samples of a pixel together
            (317, SHORT, [HORIZONTAL_DIFFERENCING]),  # Predictor
            (338, SHORT, [ASSOCIATED_ALPHA if self._associated_alpha else UNASSOCIATED_ALPHA]),  # ExtraSamples
            (339, SHORT, [UNSIGNED_INTEGER] * 4),  # SampleFormat
        )
        ifd_size = 2 + 12 * len(entries) + 4
        fields, values, value_position = [], [], position + ifd_size
        for tag, kind, items in entries:
            data = struct.pack(f"<{len(items)}{'H' if kind == SHORT else 'I'}", *items)
            if len(data) <= 4:
                fields.append(struct.pack("<HHI", tag, kind, len(items)) + data.ljust(4, b"\0"))
                continue
            fields.append(struct.pack("<HHII", tag, kind, len(items), value_position))
            values.append(data)
            value_position += len(data)  # every array here has an even length
        ifd = struct.pack("<H", len(entries)) + b"".join(fields) + struct.pack("<I", 0)
        self._out.write(padding + ifd + b"".join(values))
        self._fill(4, struct.pack("<I", position))
