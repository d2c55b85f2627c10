"""Result names of a SEQUENCE image's frames (real bpy 5.0.1): every frame is named after its own
file, whether or not Blender had to number the loaded datablock (frame 1 shares the sequence
image's name and loads as ``frame_0001.png.001``)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
bh.import_package()

from lean_image_ai.operators import sources  # noqa: E402


def test_every_frame_of_a_sequence_image_gets_its_own_stem(tmp_path):
    bh.reset_blender()
    for n in (1, 5):
        PILImage.fromarray(np.full((4, 6, 3), 40 * n, np.uint8)).save(tmp_path / f"frame_{n:04d}.png")
    image = bpy.data.images.load(str(tmp_path / "frame_0001.png"))
    image.source = "SEQUENCE"
    stems = []
    try:
        for frame in (1, 5):
            bpy.context.scene.frame_current = frame
            source = sources._sequence_frame(bpy.context, image)
            stems.append((source.image.name, source.stem))
            bpy.data.images.remove(source.image)
    finally:
        bh.reset_blender()
    assert stems == [("frame_0001.png.001", "frame_0001"), ("frame_0005.png", "frame_0005")]
