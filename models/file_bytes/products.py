"""Which result files the add-on encodes itself, and how (bpy-free): the file Blender's writer would
make of a result image's product, as one of this package's banded files, so the job's pump writes
it a band per timer call (a Process Sequence frame, a file at Save Result To; issue #37 item 3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..colour import from_model_rgb
from ..imaging import to_rgba
from ..result_images import ClippedCount, ImageProduct, record_clipped
from . import blender_samples
from .bands import BandedFile
from .exr import ExrFile
from .jpeg import JpegFile
from .png import PngFile
from .tiff import TiffFile


def product_file(path: Path, product: ImageProduct) -> BandedFile | None:
    """The file Blender's writer would make of ``product`` at ``path``, as one of these files
    the job's pump encodes a band at a time, where the add-on writes that format: an 8- or 16-bit
    PNG, an 8- or 16-bit TIFF, a float EXR, each with the samples Blender's writer stores
    (blender_samples.py), an 8-bit JPEG (RGB, alpha dropped, quality 90, as Blender
    writes it). A product whose clipped colours are uncounted (``clip_uncounted``) is counted in
    the bands pulled, and its note recorded once the last is. None: Blender's writer saves it."""
    suffix, pixels, bits = path.suffix.lower(), product.pixels, product.bits
    height, width = pixels.shape[:2]
    clipped = ClippedCount() if product.clip_uncounted else None

    def source(start: int, stop: int):
        band = pixels[start:stop]
        if clipped is not None:
            clipped.add(band)
            if stop >= height:
                record_clipped(product, path.suffix, clipped.over)
        return band

    def byte_rows(start: int, stop: int) -> np.ndarray:
        return to_rgba(source(start, stop))

    def buffer_rows(start: int, stop: int) -> np.ndarray:
        """save_product's float buffer: colour linear and premultiplied, values as they are."""
        band = to_rgba(source(start, stop))
        return band if product.is_data else from_model_rgb(band, True, premultiplied=True)

    def eight_bit_rows(start: int, stop: int) -> np.ndarray:
        return blender_samples.eight_bit(byte_rows(start, stop))

    def sixteen_bit_rows(associated_alpha: bool):
        return lambda start, stop: blender_samples.sixteen_bit(
            buffer_rows(start, stop), is_data=product.is_data, associated_alpha=associated_alpha)

    if suffix == ".png" and bits == "8-bit":
        return PngFile(height, width, byte_rows)
    if suffix in (".jpg", ".jpeg") and bits == "8-bit":
        return JpegFile(height, width, byte_rows)
    if suffix == ".png" and bits == "16-bit":
        return PngFile(height, width, sixteen_bit_rows(False), sixteen_bit=True)
    if suffix in (".tif", ".tiff") and bits == "8-bit":  # Blender: straight alpha
        return TiffFile(height, width, eight_bit_rows, sixteen_bit=False, associated_alpha=False)
    if suffix in (".tif", ".tiff") and bits == "16-bit":  # Blender: premultiplied colour
        return TiffFile(height, width, sixteen_bit_rows(True), sixteen_bit=True, associated_alpha=True)
    if suffix == ".exr" and bits == "float":
        # as Blender's writer saves save_product's image: colour through save_render in half floats, values in floats
        return ExrFile(height, width, buffer_rows, half=not product.is_data)
    return None
