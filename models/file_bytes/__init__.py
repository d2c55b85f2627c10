"""A result image's file (PNG, EXR, TIFF, JPEG) written by numpy and zlib a band of rows at a time
(bpy-free), so Blender's main thread makes a result over several short timer calls (issue #37 item 3); the same
stepping converts a picture for a model (:class:`BandedArray`), the last of a frame's read in steps (:class:`ReadSteps`)."""

from . import blender_samples
from .bands import MAX_PIXELS_PER_CALL, BandedArray, BandedFile, BandedSteps
from .exr import ExrFile
from .jpeg import JpegFile
from .png import PngFile
from .products import product_file
from .read_steps import ReadSteps
from .tiff import TiffFile

__all__ = [
    "MAX_PIXELS_PER_CALL", "BandedArray", "BandedFile", "BandedSteps", "ExrFile", "JpegFile", "PngFile", "ReadSteps",
    "TiffFile", "blender_samples", "product_file",
]
