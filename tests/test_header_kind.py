"""Issue 37 item 3: Process Sequence's start tells the first frame's kind of samples ("float",
"16-bit", "8-bit": the results' type follows it) from the file's header, not from Blender's load and
decode of it (0.14 s for a 4K PNG, 1.0 s for a 4K EXR in the start's call). The header's answer must
be the one Blender's loaded image gives (operators/sources.py ``_kind``) for every format read here;
where the header cannot say it (a float TIFF), Blender's decode still tells. Real bpy 5.0.1."""

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

from lean_image_ai.models import image_meta  # noqa: E402
from lean_image_ai.models.batch.frame_lists import FrameRef  # noqa: E402
from lean_image_ai.operators import image_io, sources  # noqa: E402

HEIGHT, WIDTH = 24, 40


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    yield from bh.fresh_blender(tmp_path, monkeypatch)


def _values(channels: int) -> np.ndarray:
    return np.random.default_rng(channels).random((HEIGHT, WIDTH, channels))


def _pillow(path: Path, array: np.ndarray, palette: bool = False) -> Path:
    image = PILImage.fromarray(array)
    (image.convert("P") if palette else image).save(path)
    return path


def _blender(path: Path, file_format: str, depth: str = "", channels: str = "RGBA") -> Path:
    """``path`` written by Blender's own writer from a float image, at ``depth`` bits where the format has a choice."""
    image = bpy.data.images.new("w", WIDTH, HEIGHT, alpha=True, float_buffer=True)
    image.pixels.foreach_set(_values(4).astype(np.float32).ravel())
    settings = bpy.context.scene.render.image_settings
    settings.file_format, settings.color_mode = file_format, channels
    if depth:
        settings.color_depth = depth
    image.save_render(str(path), scene=bpy.context.scene)
    bpy.data.images.remove(image)
    return path


def _files(folder: Path) -> dict[str, Path]:
    folder.mkdir()
    byte, wide = (_values(4) * 255).astype(np.uint8), (_values(1)[..., 0] * 65535).astype(np.uint16)
    return {
        "png 8 grey": _pillow(folder / "g8.png", byte[..., 0]),
        "png 8 rgb": _pillow(folder / "rgb8.png", byte[..., :3]),
        "png 8 rgba": _pillow(folder / "rgba8.png", byte),
        "png palette": _pillow(folder / "pal.png", byte[..., :3], palette=True),
        "png 16 grey": _pillow(folder / "g16.png", wide),
        "png 16 rgb": _blender(folder / "rgb16.png", "PNG", "16", "RGB"),
        "png 16 rgba": _blender(folder / "rgba16.png", "PNG", "16"),
        "jpeg grey": _pillow(folder / "g.jpg", byte[..., 0]),
        "jpeg rgb": _pillow(folder / "rgb.jpg", byte[..., :3]),
        "exr float": _blender(folder / "f.exr", "OPEN_EXR", "32"),
        "exr half": _blender(folder / "h.exr", "OPEN_EXR", "16"),
        "hdr": _blender(folder / "f.hdr", "HDR", "", "RGB"),
        "tiff 8 grey": _pillow(folder / "g8.tif", byte[..., 0]),
        "tiff 8 rgb": _pillow(folder / "rgb8.tif", byte[..., :3]),
        "tiff 8 rgba": _blender(folder / "rgba8.tif", "TIFF", "8"),
        "tiff 16 grey": _pillow(folder / "g16.tif", wide),
        "tiff 16 rgba": _blender(folder / "rgba16.tif", "TIFF", "16"),
        "tiff float grey": _pillow(folder / "gf.tif", _values(1)[..., 0].astype(np.float32)),
    }


def _blenders_kind(path: Path) -> str:
    image = image_io.load_image_file(str(path), check_existing=False)
    try:
        return sources._kind(image)
    finally:
        bpy.data.images.remove(image)


def test_the_headers_kind_is_the_one_blenders_loaded_image_gives(tmp_path):
    files = _files(tmp_path / "in")
    told = {name: image_meta.header_kind(path) for name, path in files.items()}
    blender = {name: _blenders_kind(path) for name, path in files.items()}
    for name in files:
        if name == "tiff float grey":  # Blender's reader decides (SGILog ones come out as bytes): its decode tells
            assert told[name] is None
        else:
            assert told[name] == blender[name], (name, told[name], blender[name])
    # every kind is covered, so a reader answering one kind for all could not pass
    assert {blender[name] for name in files} == {"8-bit", "16-bit", "float"}, blender
    for name, path in files.items():  # the start's answer, header or decode
        assert sources.input_kind(FrameRef(1, path)) == blender[name], name


def test_unknown_or_damaged_headers_are_left_to_blender(tmp_path):
    cut_png = tmp_path / "cut.png"
    cut_png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    big_tiff = tmp_path / "big.tif"
    big_tiff.write_bytes(b"II+\x00" + bytes(12))
    cut_tiff = tmp_path / "cut.tif"
    cut_tiff.write_bytes(b"II*\x00\xff\x00\x00\x00")
    bmp = _pillow(tmp_path / "b.bmp", np.zeros((4, 4, 3), np.uint8))
    palette_tiff = _pillow(tmp_path / "p.tif", np.zeros((4, 4, 3), np.uint8), palette=True)
    bilevel_tiff = tmp_path / "bw.tif"
    PILImage.fromarray(np.zeros((4, 4), bool)).save(bilevel_tiff)
    for path in (cut_png, big_tiff, cut_tiff, bmp, palette_tiff, bilevel_tiff, tmp_path / "missing.png"):
        assert image_meta.header_kind(path) is None, path.name
