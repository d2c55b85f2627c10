"""models/result_images.stored_png: the PNG a byte result is packed from (issue #37 item 10) reads
back, in Pillow, as the 8-bit pixels Blender makes of the same float values (x * 255 + 0.5, clipped)."""

from __future__ import annotations

import io

import numpy as np
from lean_image_ai.models.result_images import stored_png
from PIL import Image


def test_the_png_holds_the_pixels_rounded_and_clipped_as_blender_does():
    rng = np.random.default_rng(3)
    straight = rng.uniform(-0.2, 1.2, (5, 7, 4)).astype(np.float32)
    straight[0, 0] = [0.5 / 255, 1.5 / 255 - 1e-4, 254.5 / 255, 1.0]
    decoded = np.asarray(Image.open(io.BytesIO(stored_png(straight))))
    assert decoded.shape == (5, 7, 4) and decoded.dtype == np.uint8
    expected = np.floor(np.clip(straight * 255.0 + 0.5, 0, 255)).astype(np.uint8)
    np.testing.assert_array_equal(decoded, expected)  # top row first, as given
    assert list(decoded[0, 0]) == [1, 1, 255, 255]
