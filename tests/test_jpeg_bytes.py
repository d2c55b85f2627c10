"""Issue 37 item 3: the add-on's own JPEG encoder (models/file_bytes/jpeg.py, numpy only: Blender's
Python has no Pillow) against Blender's writer (real bpy 5.0.1, results.save_product, as Process
Sequence saves a .jpg frame): Pillow decodes its file, with Blender's quantisation tables, Huffman
tables and 4:2:0 chroma, to the pixels Blender's file decodes to; odd sizes included; a band is
whole MCU rows and at most MAX_PIXELS_PER_CALL pixels, each its own restart interval."""

from __future__ import annotations

import io
import platform
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage
from PIL import JpegImagePlugin

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
bh.import_package()

from lean_image_ai.models.file_bytes import bands  # noqa: E402
from lean_image_ai.models.file_bytes.jpeg import JpegFile  # noqa: E402
from lean_image_ai.models.result_images import ImageProduct  # noqa: E402
from lean_image_ai.operators import image_io, results  # noqa: E402

# Blender's libjpeg-turbo rounds its float DCT's coefficients to even in its x86 SIMD code, which the
# encoder copies; elsewhere (its C code: half up) a block may decode a few levels apart.
SAME_ROUNDING = platform.machine().lower() in ("x86_64", "amd64")


def picture(height: int, width: int, kind: str) -> np.ndarray:
    """A smooth picture with grain (what a model gives), random straight alpha; noise; or grey values."""
    rng = np.random.default_rng(height * 1000 + width)
    if kind == "noise":
        return rng.random((height, width, 4)).astype(np.float32)
    y, x = np.mgrid[0:height, 0:width] / max(height, width, 1)
    rgb = np.stack([np.sin(6 * x) * 0.5 + 0.5, np.cos(5 * y) * 0.5 + 0.5, x * y], axis=-1) + rng.normal(0, 0.03, (height, width, 3))
    if kind == "values":
        return np.clip(rgb[..., 0], 0, 1).astype(np.float32)
    return np.concatenate([np.clip(rgb, 0, 1), rng.random((height, width, 1))], axis=-1).astype(np.float32)


def encoded(pixels: np.ndarray, budget: float = 1e-6) -> JpegFile:
    """The add-on's file of ``pixels`` (as file_bytes.product_file gives a product's rows), pumped with a
    tiny budget: a band of whole MCU rows a call."""
    made = JpegFile(*pixels.shape[:2], lambda start, stop: image_io.to_rgba(pixels[start:stop]))
    while not made.pump(budget):
        pass
    return made


def decoded(data: bytes) -> np.ndarray:
    return np.asarray(PILImage.open(io.BytesIO(data)).convert("RGB"), np.float64)


def segments(data: bytes) -> dict[int, list[bytes]]:
    """Each marker's payloads up to the scan."""
    found: dict[int, list[bytes]] = {}
    at = 2
    while data[at + 1] != 0xDA:
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        found.setdefault(data[at + 1], []).append(data[at + 4 : at + 2 + length])
        at += 2 + length
    return found


@pytest.mark.parametrize(("height", "width", "kind"), [
    (37, 53, "colour"), (100, 131, "noise"), (300, 517, "colour"), (61, 16, "values"), (16, 16, "colour"), (1, 1, "colour"),
])
def test_pillow_decodes_it_to_the_pixels_of_blenders_writer(tmp_path, height, width, kind):
    pixels = picture(height, width, kind)
    product = ImageProduct(pixels, is_data=kind == "values")
    results.save_product(tmp_path / "blender.jpg", product)
    blenders_file = (tmp_path / "blender.jpg").read_bytes()
    ours_file = encoded(pixels).data
    ours, blenders = decoded(ours_file), decoded(blenders_file)
    assert ours.shape == blenders.shape == (height, width, 3)
    # against the pixels given (alpha dropped, not composited, as Blender does): no worse than Blender's
    source = np.floor(np.clip(image_io.to_rgba(pixels)[..., :3] * 255 + 0.5, 0, 255))
    error_ours, error_blenders = np.abs(ours - source).mean(), np.abs(blenders - source).mean()
    assert error_ours <= error_blenders * 1.01 + 0.01, (error_ours, error_blenders)
    mse_ours, mse_blenders = np.mean((ours - source) ** 2), np.mean((blenders - source) ** 2)
    assert 10 * np.log10(max(mse_blenders, 1e-9) / max(mse_ours, 1e-9)) > -0.05  # PSNR at most 0.05 dB lower
    if SAME_ROUNDING:
        assert np.array_equal(ours, blenders)
    else:
        assert np.abs(ours - blenders).mean() < 0.5
    # the same tables and sampling as Blender's file (quality 90, whatever the scene says)
    ours_segments, blenders_segments = segments(ours_file), segments(blenders_file)
    for marker in (0xE0, 0xE1, 0xDB, 0xC4, 0xC0):  # JFIF, Blender's NeoGeo quality, DQT, DHT, SOF0
        assert ours_segments[marker] == blenders_segments[marker], hex(marker)
    assert JpegImagePlugin.get_sampling(PILImage.open(io.BytesIO(ours_file))) == 2  # 4:2:0


def test_a_band_is_whole_mcu_rows_at_most_max_pixels_per_call_each_its_own_restart_interval(monkeypatch):
    monkeypatch.setattr(bands, "MAX_PIXELS_PER_CALL", 64 * 48)
    pixels = picture(150, 64, "colour")
    made = JpegFile(150, 64, lambda start, stop: image_io.to_rgba(pixels[start:stop]))
    starts = []
    real = made._write

    def write(band, start):
        starts.append((start, len(band)))
        real(band, start)

    monkeypatch.setattr(made, "_write", write)
    while not made.pump(1e9):  # a budget that never stops it: the cap does
        pass
    assert max(made.calls) <= 64 * 48 and sum(made.calls) == 150 * 64 and len(made.calls) == 4
    assert all(start % 16 == 0 for start, _ in starts) and all(rows % 16 == 0 for _, rows in starts[:-1])
    data = made.data
    scan = data[data.index(b"\xff\xda") :]
    markers = [scan[i + 1] for i in range(len(scan) - 1) if scan[i] == 0xFF and 0xD0 <= scan[i + 1] <= 0xD7]
    assert markers == [0xD0 + n % 8 for n in range(9)]  # ten MCU rows: nine RSTn, numbered on across the bands
    assert int.from_bytes(segments(data)[0xDD][0], "big") == 4  # DRI: an MCU row of 64 pixels
    assert np.array_equal(decoded(data), decoded(encoded(pixels, budget=1e9).data))  # one band or four: the same picture


def test_a_frame_of_3840_pixels_is_encoded_in_bands_of_at_most_max_pixels_per_call():
    pixels = np.random.default_rng(0).random((64, 3840, 3)).astype(np.float32)
    made = JpegFile(64, 3840, lambda start, stop: pixels[start:stop])
    made.finish_now()
    assert sum(made.calls) == 64 * 3840 and max(made.calls) <= bands.MAX_PIXELS_PER_CALL
    assert PILImage.open(io.BytesIO(made.data)).size == (3840, 64)
