"""models/file_bytes/: a result's PNG or float EXR written a band of rows per call (issue #37 item 3).

Read back by independent readers (Pillow, the OpenEXR package): every pixel as given, whatever
the height (EXR blocks of 16 lines with a short last one, a one-line image). The stepping: a call
writes at most MAX_PIXELS_PER_CALL pixels, a tiny budget still writes a band per call (so a job
always moves on), every row is written once, and the bytes are put together in a call that writes
no row.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from lean_image_ai.models.file_bytes import MAX_PIXELS_PER_CALL, ExrFile, PngFile
from PIL import Image

OpenEXR = pytest.importorskip("OpenEXR")


def exr_pixels(data: bytes, tmp_path) -> np.ndarray:
    path = tmp_path / "read.exr"
    path.write_bytes(data)
    with OpenEXR.File(str(path)) as file:
        header = file.header()
        assert header["compression"] == OpenEXR.ZIP_COMPRESSION
        return file.channels()["RGBA"].pixels


@pytest.mark.parametrize("height", [1, 15, 16, 17, 53])
def test_the_exr_holds_every_float_exactly(tmp_path, height):
    rng = np.random.default_rng(height)
    pixels = rng.normal(0, 100, (height, 29, 4)).astype(np.float32)
    pixels[0, 0] = [np.inf, -0.0, 1e-40, 65504.0]  # what a half or a clip would lose
    made = ExrFile(height, 29, lambda start, stop: pixels[start:stop])
    np.testing.assert_array_equal(exr_pixels(made.finish_now(), tmp_path), pixels)


def test_a_smooth_exr_block_is_deflated_and_a_noisy_one_stored(tmp_path):
    y, x = np.mgrid[0:64, 0:64].astype(np.float32) / 64
    smooth = np.stack([x, y, x * y, np.ones_like(x)], axis=-1)
    data = ExrFile(64, 64, lambda start, stop: smooth[start:stop]).finish_now()
    assert len(data) < smooth.nbytes / 2
    np.testing.assert_array_equal(exr_pixels(data, tmp_path), smooth)
    bits = np.random.default_rng(0).integers(0, 2**32, (32, 64, 4), dtype=np.uint32) & 0xBFFFFFFF  # finite floats
    noise = bits.view(np.float32)  # random bits: deflate cannot shrink them, the blocks are stored as they are
    data = ExrFile(32, 64, lambda start, stop: noise[start:stop]).finish_now()
    assert len(data) > noise.nbytes
    np.testing.assert_array_equal(exr_pixels(data, tmp_path), noise)


def test_the_png_is_written_in_bands_with_blenders_rounding():
    rng = np.random.default_rng(1)
    straight = rng.uniform(-0.2, 1.2, (300, 41, 4)).astype(np.float32)
    straight[0, 0] = [0.5 / 255, 1.5 / 255 - 1e-4, 254.5 / 255, 1.0]  # x * 255 + 0.5, truncated
    made = PngFile(300, 41, lambda start, stop: straight[start:stop])
    while not made.pump(1e-9):  # the smallest budget: one band a call
        pass
    assert len(made.calls) > 2
    decoded = np.asarray(Image.open(io.BytesIO(made.data)))
    np.testing.assert_array_equal(decoded, np.floor(np.clip(straight * 255.0 + 0.5, 0, 255)).astype(np.uint8))
    assert list(decoded[0, 0]) == [1, 1, 255, 255]  # top row first, as given


@pytest.mark.parametrize("kind", [PngFile, ExrFile])
def test_each_call_writes_at_most_its_pixels_and_every_row_once(kind):
    width, height = 2048, 1500
    asked = []
    band = np.zeros((height, width, 4), np.float32)

    def rows(start, stop):
        asked.append((start, stop))
        return band[start:stop]

    made = kind(height, width, rows)
    pumps = 0
    while not made.pump(10.0):  # a budget that never runs out: the pixel bound alone splits it
        pumps += 1
    assert max(made.calls) <= MAX_PIXELS_PER_CALL and sum(made.calls) == width * height
    assert len(made.calls) >= width * height / MAX_PIXELS_PER_CALL
    assert pumps == len(made.calls)  # then one more call that writes no row: the bytes put together
    flat = [row for start, stop in asked for row in range(start, stop)]
    assert flat == list(range(height))
    if kind is ExrFile:  # every band but the last starts and ends on a 16-line block
        assert all(start % 16 == 0 for start, _ in asked) and all(stop % 16 == 0 for _, stop in asked[:-1])
