"""operators/image_io.py against real Blender (bpy 5.0.1)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
io = bh.import_submodule("operators.image_io")
from lean_image_ai.models import colour, files  # noqa: E402
from lean_image_ai.runtime.errors import InvalidImageError  # noqa: E402

W, H = 37, 23  # odd sizes: catch row/column mix-ups


@pytest.fixture(autouse=True)
def _clean_images():
    bh.remove_all_images()
    yield
    bh.remove_all_images()


def rng_image(h=H, w=W, seed=1):
    return np.random.default_rng(seed).random((h, w, 4), dtype=np.float32)


# --- round trips ------------------------------------------------------------------------------------


def test_byte_round_trip_within_one_step():
    src = rng_image()
    image = io.array_to_new_image("byte", src, float_buffer=False)
    assert tuple(image.size) == (W, H) and not image.is_float
    back = io.image_to_array(image)
    assert back.shape == (H, W, 4) and back.dtype == np.float32
    assert np.abs(back - src).max() <= 0.5 / 255 + 1e-6
    # Blender stores bytes: the values come back quantised to k/255.
    assert np.abs(back * 255 - np.round(back * 255)).max() < 1e-3


def test_float_round_trip_exact_including_hdr_and_negative():
    src = rng_image() * 8.0 - 2.0
    image = io.array_to_new_image("float", src, float_buffer=True)
    assert image.is_float
    back = io.image_to_array(image)
    assert np.array_equal(back, src)


def test_orientation_top_row_first():
    src = np.zeros((H, W, 4), np.float32)
    src[..., 3] = 1
    src[0, 0] = (1, 0, 0, 1)  # top-left red
    src[H - 1, W - 1] = (0, 0, 1, 1)  # bottom-right blue
    image = io.array_to_new_image("orient", src, float_buffer=False)
    raw = bh.read_pixels_bottom_up(image)  # Blender's own layout: row 0 at the bottom
    assert np.array_equal(raw[H - 1, 0], [1, 0, 0, 1])
    assert np.array_equal(raw[0, W - 1], [0, 0, 1, 1])
    back = io.image_to_array(image)
    assert np.array_equal(back[0, 0], [1, 0, 0, 1])
    assert np.array_equal(back[H - 1, W - 1], [0, 0, 1, 1])


def test_orientation_agrees_with_pillow(tmp_path):
    src = np.zeros((H, W, 4), np.float32)
    src[..., 3] = 1
    src[0, 0] = (1, 0, 0, 1)
    image = io.array_to_new_image("orient_png", src, float_buffer=False)
    out = io.save_image_atomically(image, tmp_path / "o.png", "PNG")
    pil = np.asarray(PILImage.open(out).convert("RGBA"))
    assert pil.shape == (H, W, 4)
    assert tuple(pil[0, 0]) == (255, 0, 0, 255)
    assert tuple(pil[H - 1, 0]) == (0, 0, 0, 255)


def test_alpha_preserved_and_alpha_false_writes_opaque():
    src = rng_image(seed=3)
    src[..., 3] = np.linspace(0, 1, W, dtype=np.float32)[None, :]
    for float_buffer in (False, True):
        back = io.image_to_array(io.array_to_new_image("a", src, float_buffer=float_buffer))
        assert np.abs(back[..., 3] - src[..., 3]).max() <= 0.5 / 255 + 1e-6
        # colour is not premultiplied on the way in or out
        assert np.abs(back[..., :3] - src[..., :3]).max() <= 0.5 / 255 + 1e-6
    keep = src.copy()
    opaque = io.image_to_array(io.array_to_new_image("o", src, float_buffer=True, alpha=False))
    assert np.all(opaque[..., 3] == 1.0)
    assert np.array_equal(opaque[..., :3], src[..., :3])
    assert np.array_equal(src, keep)  # the caller's array is not modified


def test_grey_and_rgb_arrays_expand_to_rgba():
    grey = np.random.default_rng(4).random((H, W), dtype=np.float32)
    back = io.image_to_array(io.array_to_new_image("g", grey, float_buffer=True))
    assert np.array_equal(back[..., 0], grey) and np.array_equal(back[..., 2], grey)
    assert np.all(back[..., 3] == 1)
    rgb = rng_image()[..., :3]
    back = io.image_to_array(io.array_to_new_image("rgb", rgb, float_buffer=True))
    assert np.array_equal(back[..., :3], rgb) and np.all(back[..., 3] == 1)
    ga = np.stack([grey, 1 - grey], axis=-1)
    back = io.image_to_array(io.array_to_new_image("ga", ga, float_buffer=True))
    assert np.array_equal(back[..., 1], grey) and np.allclose(back[..., 3], 1 - grey)


def test_to_rgba_rejects_bad_shapes():
    with pytest.raises(InvalidImageError):
        io.to_rgba(np.zeros((4, 4, 5), np.float32))
    with pytest.raises(InvalidImageError):
        io.to_rgba(np.zeros((0, 4, 4), np.float32))
    with pytest.raises(InvalidImageError):
        io.to_rgba(np.zeros(16, np.float32))


class _FakePixels:
    def __init__(self, flat):
        self.flat = flat

    def __len__(self):
        return self.flat.size

    def foreach_get(self, out):
        out[:] = self.flat

    def foreach_set(self, data):
        assert data.dtype == np.float32 and data.size == self.flat.size
        self.flat = data.copy()


class _FakeImage:
    """Blender 5.0 always reports 4 channels; this stands in for 1/2/3-channel buffers."""

    type = "IMAGE"
    source = "GENERATED"
    filepath = ""

    def __init__(self, channels, h=3, w=5):
        self.name = f"fake{channels}"
        self.size = (w, h)
        self.channels = channels
        self.pixels = _FakePixels(np.arange(w * h * channels, dtype=np.float32) / (w * h * channels))


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_fewer_channel_buffers(channels):
    fake = _FakeImage(channels)
    bottom_up = fake.pixels.flat.reshape(3, 5, channels)
    arr = io.image_to_array(fake)
    assert arr.shape == (3, 5, 4)
    top_down = bottom_up[::-1]
    if channels == 1:
        assert np.array_equal(arr[..., 0], top_down[..., 0]) and np.array_equal(arr[..., 1], top_down[..., 0])
        assert np.all(arr[..., 3] == 1)
    elif channels == 2:
        assert np.array_equal(arr[..., 2], top_down[..., 0]) and np.array_equal(arr[..., 3], top_down[..., 1])
    else:
        assert np.array_equal(arr[..., :3], top_down) and np.all(arr[..., 3] == 1)
    # writing a grey RGBA result back yields the same buffer (luma of grey is grey)
    grey = np.repeat(arr[..., :1], 3, axis=-1)
    rgba = np.concatenate([grey, arr[..., 3:]], axis=-1)
    before = fake.pixels.flat.copy()
    io.write_array_to_image(fake, rgba)
    if channels == 3:
        expect = np.repeat(bottom_up[..., :1], 3, axis=-1).reshape(-1)
    else:
        expect = before
    assert np.allclose(fake.pixels.flat, expect, atol=1e-6)


# --- colour spaces -----------------------------------------------------------------------------------


def test_colour_space_flags_of_new_images():
    src = rng_image()
    byte = io.array_to_new_image("b", src, float_buffer=False)
    assert byte.colorspace_settings.name == "sRGB"
    info = io.image_info(byte)
    assert (info.is_float, info.is_linear, info.is_data) == (False, False, False)

    flt = io.array_to_new_image("f", src, float_buffer=True)
    assert flt.colorspace_settings.name.startswith("Linear")
    info = io.image_info(flt)
    assert (info.is_float, info.is_linear, info.is_data) == (True, True, False)

    for float_buffer in (True, False):
        data = io.array_to_new_image("d", src, float_buffer=float_buffer, colorspace="Non-Color")
        assert data.colorspace_settings.name == "Non-Color" and data.colorspace_settings.is_data
        info = io.image_info(data)
        assert info.is_data and not info.is_linear
        # pixels survive: setting a colour space regenerates a generated buffer, so it must come first
        assert np.abs(io.image_to_array(data) - src).max() <= 0.5 / 255 + 1e-6


def test_explicit_colour_space_on_new_image_keeps_pixels():
    src = rng_image() * 3
    image = io.array_to_new_image("acescg", src, float_buffer=True, colorspace="ACEScg")
    assert image.colorspace_settings.name == "ACEScg"
    assert np.array_equal(io.image_to_array(image), src)


def test_unknown_colour_space_leaves_no_image_behind():
    before = len(bpy.data.images)
    with pytest.raises(TypeError):
        io.array_to_new_image("bad", rng_image(), float_buffer=True, colorspace="No Such Space")
    assert len(bpy.data.images) == before


KNOWN = [  # linear, sRGB (IEC 61966-2-1)
    (0.0, 0.0),
    (0.0031308, 0.04045),
    (0.0015, 0.01938),
    (0.18, 0.46135612),
    (0.21404114, 0.5),
    (0.5, 0.73535698),
    (1.0, 1.0),
]


def test_srgb_transfer_functions_known_values():
    lin = np.array([k[0] for k in KNOWN], np.float32)
    srgb = np.array([k[1] for k in KNOWN], np.float32)
    assert np.allclose(colour.linear_to_srgb(lin), srgb, atol=2e-5)
    assert np.allclose(colour.srgb_to_linear(srgb), lin, atol=2e-5)
    x = np.linspace(0, 1, 1001, dtype=np.float32)
    assert np.abs(colour.srgb_to_linear(colour.linear_to_srgb(x)) - x).max() < 1e-5
    assert colour.linear_to_srgb(x).dtype == np.float32
    assert np.all(np.diff(colour.linear_to_srgb(x)) > 0)


def test_to_model_rgb_converts_colour_only_for_linear_sources():
    arr = np.full((2, 3, 4), 0.5, np.float32)
    arr[..., 3] = 0.25
    out = colour.to_model_rgb(arr, is_linear=True)
    assert np.allclose(out[..., :3], 0.73535698, atol=2e-5)
    assert np.all(out[..., 3] == 0.25)  # alpha untouched
    assert np.all(arr[..., :3] == 0.5)  # input not modified
    assert np.array_equal(colour.to_model_rgb(arr, is_linear=False), arr)
    back = colour.from_model_rgb(out, is_linear=True)
    assert np.allclose(back, arr, atol=1e-5)
    assert np.array_equal(colour.from_model_rgb(out, is_linear=False), out)


def test_premultiplied_sources_are_unpremultiplied_for_models():
    straight = np.array([[[0.8, 0.4, 0.2, 0.5], [0.3, 0.2, 0.1, 0.0]]], np.float32)
    premul = colour.premultiply(straight)
    assert np.allclose(premul[0, 0], [0.4, 0.2, 0.1, 0.5]) and np.all(premul[0, 1] == 0)
    back = colour.unpremultiply(premul)
    assert np.allclose(back[0, 0], straight[0, 0]) and np.all(back[0, 1] == 0)  # alpha 0: no NaN
    linear_premul = colour.from_model_rgb(straight, is_linear=True, premultiplied=True)
    assert np.allclose(linear_premul[0, 0, :3], colour.srgb_to_linear(straight[0, 0, :3]) * 0.5)
    model = colour.to_model_rgb(linear_premul, is_linear=True, premultiplied=True)
    assert np.allclose(model[0, 0], straight[0, 0], atol=1e-5)


def test_image_info_reports_premultiplied_float_buffers():
    src = rng_image()
    assert io.image_info(io.array_to_new_image("f", src, float_buffer=True)).premultiplied
    assert not io.image_info(io.array_to_new_image("b", src, float_buffer=False)).premultiplied
    packed = io.array_to_new_image("p", src, float_buffer=True)
    packed.alpha_mode = "CHANNEL_PACKED"
    assert not io.image_info(packed).premultiplied


def test_srgb_decode_matches_blenders_own_colour_management(tmp_path):
    # Blender loads 16-bit PNGs into a float buffer, linearised by OpenColorIO: our EOTF must agree.
    values = np.linspace(0, 65535, W * H).reshape(H, W).astype(np.uint16)
    path = tmp_path / "grey16.png"
    PILImage.fromarray(values).save(path)
    image = io.load_image_file(path)
    arr, info = io.read_image(image)
    assert info.is_float and info.is_linear
    expected = colour.srgb_to_linear(values.astype(np.float32) / 65535)
    assert np.abs(arr[..., 0] - expected).max() < 2e-4
    assert np.abs(colour.to_model_rgb(arr, info.is_linear)[..., 0] - values / 65535).max() < 2e-4


def test_byte_pixels_are_stored_srgb_values(tmp_path):
    # An 8-bit PNG comes back as byte/255 exactly (no linearisation), top row first.
    src = np.random.default_rng(5).integers(0, 256, (H, W, 4), dtype=np.uint8)
    path = tmp_path / "rgba8.png"
    PILImage.fromarray(src, "RGBA").save(path)
    image = io.load_image_file(path)
    arr, info = io.read_image(image)
    assert (info.width, info.height) == (W, H)
    assert not info.is_float and not info.is_linear and info.colorspace == "sRGB"
    assert np.array_equal(np.round(arr * 255).astype(np.uint8), src)


def test_pillow_greyscale_and_rgb_pngs_load(tmp_path):
    grey = np.random.default_rng(6).integers(0, 256, (H, W), dtype=np.uint8)
    PILImage.fromarray(grey, "L").save(tmp_path / "l.png")
    arr = io.image_to_array(io.load_image_file(tmp_path / "l.png"))
    for c in range(3):
        assert np.array_equal(np.round(arr[..., c] * 255).astype(np.uint8), grey)
    assert np.all(arr[..., 3] == 1)
    rgb = np.random.default_rng(7).integers(0, 256, (H, W, 3), dtype=np.uint8)
    PILImage.fromarray(rgb, "RGB").save(tmp_path / "rgb.png")
    arr = io.image_to_array(io.load_image_file(tmp_path / "rgb.png"))
    assert np.array_equal(np.round(arr[..., :3] * 255).astype(np.uint8), rgb)


# --- in-place writes ----------------------------------------------------------------------------------


def test_write_array_to_image_in_place_and_size_check():
    image = io.array_to_new_image("target", rng_image(), float_buffer=True)
    new = rng_image(seed=9)
    io.write_array_to_image(image, new)
    assert np.array_equal(io.image_to_array(image), new)
    with pytest.raises(InvalidImageError, match="37 x 23"):
        io.write_array_to_image(image, rng_image(h=H + 1))
    assert np.array_equal(io.image_to_array(image), new)  # untouched by the failed write


# --- empty / unreadable images ------------------------------------------------------------------------


def test_empty_image_raises_with_advice(tmp_path):
    image = bpy.data.images.new("missing", 4, 4)
    image.source = "FILE"
    image.filepath = str(tmp_path / "gone.png")
    assert tuple(image.size) == (0, 0)
    with pytest.raises(InvalidImageError) as err:
        io.image_to_array(image)
    message = str(err.value)
    assert "'missing'" in message and "0 x 0" in message and "Reload" in message
    with pytest.raises(InvalidImageError):
        io.image_info(image)
    with pytest.raises(InvalidImageError):
        io.write_array_to_image(image, rng_image(4, 4))


@pytest.mark.parametrize("kind", ["garbage", "truncated", "missing", "folder"])
def test_unreadable_file_raises_invalid_image_error_naming_path(tmp_path, kind):
    if kind == "garbage":
        path = tmp_path / "garbage.png"
        path.write_bytes(b"this is not an image")
    elif kind == "truncated":
        PILImage.fromarray(np.zeros((64, 64, 3), np.uint8) + 7).save(tmp_path / "ok.png")
        data = (tmp_path / "ok.png").read_bytes()
        path = tmp_path / "truncated.png"
        path.write_bytes(data[: len(data) // 2])
    elif kind == "missing":
        path = tmp_path / "missing.png"
    else:
        path = tmp_path / "folder.png"
        path.mkdir()
    before = len(bpy.data.images)
    with pytest.raises(InvalidImageError) as err:
        io.load_image_file(path)
    assert str(path) in str(err.value)
    assert len(bpy.data.images) == before  # no empty datablock left behind


# --- atomic save --------------------------------------------------------------------------------------


def _listing(folder):
    return sorted(os.listdir(folder))


def test_save_atomically_writes_file_and_keeps_image_untouched(tmp_path):
    src = rng_image()
    image = io.array_to_new_image("save_me", src, float_buffer=False)
    target = tmp_path / "result.png"
    target.write_bytes(b"old content")
    out = io.save_image_atomically(image, target, "PNG")
    assert out == target
    assert _listing(tmp_path) == ["result.png"]
    pil = np.asarray(PILImage.open(target).convert("RGBA")).astype(np.float32) / 255
    assert np.abs(pil - src).max() <= 0.5 / 255 + 1e-6
    # save_copy: the datablock still is the same generated image with the same format
    assert image.source == "GENERATED" and image.filepath == "" and image.file_format == "PNG"


def _exr_colour_tag(path):
    data = Path(path).read_bytes()
    i = data.find(b"colorInteropID")
    assert i >= 0, "no colour space attribute in the EXR header"
    return data[i : i + 60]


def test_save_exr_float_colour_image_is_linear_and_exact(tmp_path):
    src = rng_image()
    src[..., :3] *= 4  # HDR colour; alpha stays in [0, 1]
    image = io.array_to_new_image("exr", src, float_buffer=True)
    image.use_half_precision = False
    io.save_image_atomically(image, tmp_path / "r.exr", "OPEN_EXR")
    assert _listing(tmp_path) == ["r.exr"]
    assert b"lin_rec709_scene" in _exr_colour_tag(tmp_path / "r.exr")
    loaded = io.load_image_file(tmp_path / "r.exr")
    assert loaded.colorspace_settings.name.startswith("Linear")
    assert np.array_equal(io.image_to_array(loaded), src)  # float pixels are stored premultiplied as-is
    assert image.source == "GENERATED" and len(bpy.data.scenes) == 1  # scratch scene removed


def test_save_exr_from_byte_image_is_linear_premultiplied(tmp_path):
    src = rng_image(seed=11)
    image = io.array_to_new_image("b2exr", src, float_buffer=False)
    io.save_image_atomically(image, tmp_path / "b.exr", "OPEN_EXR")
    loaded = io.load_image_file(tmp_path / "b.exr")
    arr, info = io.read_image(loaded)
    assert info.is_linear and info.premultiplied
    expected = colour.premultiply(io.to_rgba(colour.from_model_rgb(io.image_to_array(image), is_linear=True)))
    assert np.abs(arr - expected).max() < 2e-3  # half floats
    straight_srgb = colour.to_model_rgb(arr, info.is_linear, premultiplied=info.premultiplied)
    visible = src[..., 3] > 0.1
    assert np.abs(straight_srgb - src)[visible].max() < 1e-2


def test_save_exr_data_image_is_raw(tmp_path):
    src = rng_image() * 100 - 50  # e.g. depth / positions
    image = io.array_to_new_image("depth", src, float_buffer=True, colorspace="Non-Color")
    image.use_half_precision = False
    io.save_image_atomically(image, tmp_path / "d.exr", "OPEN_EXR")
    loaded = io.load_image_file(tmp_path / "d.exr")
    assert loaded.colorspace_settings.is_data
    assert np.array_equal(io.image_to_array(loaded)[..., :3], src[..., :3])


def test_save_restores_image_file_format(tmp_path):
    image = io.array_to_new_image("fmt", rng_image(), float_buffer=False)
    image.file_format = "TIFF"
    io.save_image_atomically(image, tmp_path / "x.png", "PNG")
    assert image.file_format == "TIFF"
    assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_save_onto_a_folder_fails_cleanly(tmp_path):
    image = io.array_to_new_image("s", rng_image(), float_buffer=False)
    target = tmp_path / "taken.png"
    target.mkdir()
    with pytest.raises(io.ImageSaveError, match="taken.png"):
        io.save_image_atomically(image, target, "PNG")
    assert target.is_dir() and _listing(tmp_path) == ["taken.png"]


def test_save_into_missing_folder_fails_cleanly(tmp_path):
    image = io.array_to_new_image("s", rng_image(), float_buffer=False)
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("file")
    with pytest.raises(io.ImageSaveError) as err:
        io.save_image_atomically(image, blocker / "x.png", "PNG")
    assert isinstance(err.value, OSError)
    assert _listing(tmp_path) == ["not_a_dir"]


def test_failed_blender_write_keeps_original_and_leaves_no_temp(tmp_path, monkeypatch):
    image = io.array_to_new_image("s", rng_image(), float_buffer=False)
    target = tmp_path / "keep.png"
    target.write_bytes(b"original")
    # Make Blender's own write fail: the temporary name it is given is already a folder.
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: "fixed")
    blocker = tmp_path / ".keep.png.fixed.tmp.png"
    blocker.mkdir()
    with pytest.raises(io.ImageSaveError, match="keep.png"):
        io.save_image_atomically(image, target, "PNG")
    assert target.read_bytes() == b"original"
    assert _listing(tmp_path) == [".keep.png.fixed.tmp.png", "keep.png"]


def test_failed_replace_keeps_original_and_removes_temp(tmp_path, monkeypatch):
    image = io.array_to_new_image("s", rng_image(), float_buffer=False)
    target = tmp_path / "keep.png"
    target.write_bytes(b"original")
    seen = []

    def failing_replace(src, dst):
        seen.append(Path(src))
        assert Path(src).stat().st_size > 0  # the temp file was fully written...
        raise OSError(28, "No space left on device")  # ...but the final step fails

    monkeypatch.setattr(io.os, "replace", failing_replace)
    with pytest.raises(io.ImageSaveError, match="No space left"):
        io.save_image_atomically(image, target, "PNG")
    assert seen and seen[0].parent == tmp_path
    assert target.read_bytes() == b"original"
    assert _listing(tmp_path) == ["keep.png"]


def test_bad_file_format_fails_cleanly(tmp_path):
    image = io.array_to_new_image("s", rng_image(), float_buffer=False)
    with pytest.raises(io.ImageSaveError):
        io.save_image_atomically(image, tmp_path / "x.png", "NOT_A_FORMAT")
    assert _listing(tmp_path) == []
    assert image.file_format == "PNG"


def test_bench_script_runs_and_ends_with_one_json_line():
    import json
    import subprocess

    proc = subprocess.run(
        [
            sys.executable,
            str(bh.REPO_ROOT / "bench" / "blender_io.py"),
            "--size",
            "64",
            "--repeats",
            "1",
            "--naive-repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) >= {
        "image_to_array_speedup_vs_pixels_slice",
        "array_to_image_speedup_vs_pixels_assign",
        "megapixels",
    }
    assert result["megapixels"] == round(64 * 64 / 1e6, 2)
    assert (
        result["image_to_array_speedup_vs_pixels_slice"] > 0
        and result["array_to_image_speedup_vs_pixels_assign"] > 0
    )
