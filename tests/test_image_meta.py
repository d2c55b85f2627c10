"""models/image_meta.py: EXIF orientation and TIFF pages read from headers without Pillow
(Blender has none), checked against Pillow on files Pillow writes."""

from __future__ import annotations

import numpy as np
import pytest
from lean_image_ai.models import image_meta
from PIL import Image, ImageOps


def _with_orientation(path, orientation, array):
    image = Image.fromarray(array)
    exif = image.getexif()
    exif[image_meta.ORIENTATION_TAG] = orientation
    image.save(path, exif=exif.tobytes())


@pytest.mark.parametrize("suffix", [".jpg", ".png", ".webp"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_is_read_and_applied_as_pillow_does(tmp_path, suffix, orientation):
    array = (np.arange(5 * 7 * 3) % 251).astype(np.uint8).reshape(5, 7, 3)
    path = tmp_path / f"photo{suffix}"
    _with_orientation(path, orientation, array)
    assert image_meta.exif_orientation(path) == orientation
    with Image.open(path) as stored:
        expected = np.asarray(ImageOps.exif_transpose(stored))
        decoded = np.asarray(stored)
    assert np.array_equal(image_meta.upright(decoded, orientation), expected)


def test_files_without_exif_or_unreadable_are_upright(tmp_path):
    Image.new("RGB", (4, 3)).save(tmp_path / "plain.png")
    (tmp_path / "junk.jpg").write_bytes(b"\xff\xd8\xff\xe1\x00")
    assert image_meta.exif_orientation(tmp_path / "plain.png") == 1
    assert image_meta.exif_orientation(tmp_path / "junk.jpg") == 1
    assert image_meta.exif_orientation(tmp_path / "missing.png") == 1


def test_tiff_pages_are_counted(tmp_path):
    pages = [Image.new("RGB", (8, 6), colour) for colour in ("red", "green", "blue")]
    pages[0].save(tmp_path / "three.tif", save_all=True, append_images=pages[1:])
    pages[0].save(tmp_path / "one.tif")
    assert image_meta.tiff_pages(tmp_path / "three.tif") == 3
    assert image_meta.tiff_pages(tmp_path / "one.tif") == 1
    (tmp_path / "loop.tif").write_bytes(b"II*\x00\x08\x00\x00\x00" + b"\x00\x00" + b"\x08\x00\x00\x00")
    assert image_meta.tiff_pages(tmp_path / "loop.tif") == 1  # an IFD chain pointing at itself ends
