"""How a front-end reads frames and writes results for the one runner (bpy-free): the interface,
declared once, and its implementation over image files.

A front-end gives the runner (models/batch/runner.py) only what only it can do: read a frame,
write an image product, refuse a format it cannot write, say what a frame's samples are, and its
format ``writer`` row (models/file_formats.py). Two implementations: :class:`ImageFileFrames`
here (Pillow and OpenEXR, models/batch/image_files.py: the command line, the farm, any front-end
without Blender) and Blender's (operators/batch_ops.py ``BlenderFrames``, Blender's own image IO
on the main thread).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from .. import file_formats
from ..result_images import ImageProduct
from . import image_files
from .frame_lists import FrameRef


class FrameIO(Protocol):
    writer: file_formats.Writer  # which formats it writes, and where its files keep floats and text

    def read(self, ref: FrameRef, warn: Callable[[str], None] | None = None) -> np.ndarray:
        """The frame's pixels as stored (HxWxC uint8/uint16/float32), turned upright."""

    def write_image(self, path: Path, product: ImageProduct) -> list[str]:
        """Write ``product`` to ``path`` whole or not at all; returns notes for the user."""

    def check_format(self, path: Path) -> None:
        """Raise a readable error, before any model runs, when ``path``'s format cannot be written."""

    def input_kind(self, ref: FrameRef) -> str:
        """"float", "16-bit" or "8-bit": the output type follows it."""


class ImageFileFrames:
    """Frames in image files, read and written with Pillow and OpenEXR; or the generated demo
    image when there is no input (the command line's demo)."""

    writer = file_formats.COMMAND_LINE

    def __init__(self, demo: Callable[[], np.ndarray] | None = None):
        self._demo = demo
        self.say_size = False  # one frame: its size is said once read

    def read(self, ref, warn=None) -> np.ndarray:
        image = self._demo() if self._demo is not None else image_files.read_image(ref.path)
        if self.say_size:
            print(f"input: {image.shape[1]}x{image.shape[0]} ({image.dtype})")
        return image

    def write_image(self, path: Path, product: ImageProduct) -> list[str]:
        return image_files.write_image(path, product)

    def check_format(self, path: Path) -> None:
        image_files.check_writable_format(path)

    def input_kind(self, ref) -> str:
        return image_files.input_kind(ref.path)
