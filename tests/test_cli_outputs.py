"""Where a job's results go by default and what type they are (#22 items 1 and 4, #21 images):
real processes on real files, the embedded bicubic x2 model or small built family models."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import OpenEXR
import pytest
from lean_image_ai.models.batch import image_files
from PIL import Image
from test_cli import cli, model_args, summary


def frames_named(folder, numbers, size=(20, 30)):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(7)
    for n in numbers:
        Image.fromarray((rng.random((*size, 3)) * 255).astype(np.uint8)).save(folder / f"plate_{n}.png")
    return folder


def listing(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("command, written", [("upscale", "plate_upscaled_{}.png"), ("depth", "plate_depth_{}.exr")])
def test_a_folder_job_run_three_times_leaves_one_output_per_frame(tmp_path, family_models, command, written):
    frames = frames_named(tmp_path / "plates", [1001, 1002, 1003])
    args = [command, str(frames), "--device", "cpu", *model_args(family_models, command)]
    expected = [written.format(n) for n in (1001, 1002, 1003)]
    for flag, counts in (([], (3, 0)), (["--skip-existing"], (0, 3)), (["--overwrite"], (3, 0))):
        done = cli(*args, *flag, cwd=tmp_path)
        assert done.returncode == 0, (flag, done.stderr)
        report = summary(done)
        assert (report["frames"], report["written"], report["skipped"]) == (3, *counts), flag
        # beside the input folder, each frame under its own number; the inputs untouched
        assert listing(tmp_path / f"plates_{written.split('_')[1]}") == expected, flag
        assert listing(frames) == ["plate_1001.png", "plate_1002.png", "plate_1003.png"], flag
    assert listing(tmp_path) == ["plates", f"plates_{written.split('_')[1]}"]


def test_output_in_the_input_folder_never_feeds_results_back_as_frames(tmp_path):
    frames = frames_named(tmp_path / "in", [1, 2])
    for flag in ([], ["--skip-existing"], ["--overwrite"]):
        done = cli("upscale", str(frames), str(frames), "--device", "cpu", *flag, cwd=tmp_path)
        assert done.returncode == 0, (flag, done.stderr)
        assert summary(done)["frames"] == 2, flag
    assert listing(frames) == ["plate_1.png", "plate_2.png", "plate_upscaled_0001.png", "plate_upscaled_0002.png"]
    # the same with a pattern that writes into the input folder
    frames = frames_named(tmp_path / "in2", [1, 2])
    for flag in ([], ["--skip-existing"], ["--overwrite"]):
        done = cli("upscale", str(frames), str(frames / "up_####.png"), "--device", "cpu", *flag, cwd=tmp_path)
        assert done.returncode == 0, (flag, done.stderr)
        assert summary(done)["frames"] == 2, flag
    assert [n for n in listing(frames) if n.startswith("up_")] == ["up_0001.png", "up_0002.png"]


def test_a_pattern_input_defaults_to_the_folder_beside_its_folder(tmp_path):
    frames = frames_named(tmp_path / "shot", [7, 8])
    (frames / "notes.png").write_bytes((frames / "plate_7.png").read_bytes())  # not a frame of the pattern
    done = cli("upscale", str(frames / "plate_#.png"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert listing(tmp_path / "shot_upscaled") == ["plate_upscaled_0007.png", "plate_upscaled_0008.png"]


def _write_exr(path, pixels):
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    with OpenEXR.File(header, {"RGBA" if pixels.shape[2] == 4 else "RGB": pixels}) as exr:
        exr.write(str(path))


def test_float_exr_input_gives_float_exr_output_by_default(tmp_path, family_models):
    pixels = np.full((12, 16, 3), 0.3, np.float32)
    pixels[:, 8:] = 0.7
    _write_exr(tmp_path / "plate.exr", pixels)
    done = cli("upscale", str(tmp_path / "plate.exr"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert summary(done)["output_type"] == "float EXR (follows the float input)"
    assert "float EXR" in done.stdout.split("wrote: ", 1)[1].splitlines()[0]
    with OpenEXR.File(str(tmp_path / "plate_upscaled.exr")) as exr:
        result = exr.channels()["RGB"].pixels
    assert result.dtype == np.float32 and result.shape == (24, 32, 3)
    np.testing.assert_allclose(result[:, :10], 0.3, atol=1e-5)  # not quantised to 8 bits (0.3 -> 0.3020)
    # a cut-out of a float plate: EXR with alpha
    cut = cli(
        "remove-background", str(tmp_path / "plate.exr"), "--device", "cpu",
        *model_args(family_models, "remove-background"), cwd=tmp_path,
    )
    assert cut.returncode == 0, cut.stderr
    with OpenEXR.File(str(tmp_path / "plate_cutout.exr")) as exr:
        assert "RGBA" in exr.channels() and exr.channels()["RGBA"].pixels.dtype == np.float32
    # a folder of EXR frames: the same
    folder = tmp_path / "seq"
    folder.mkdir()
    for n in (1, 2):
        _write_exr(folder / f"s_{n:04d}.exr", pixels)
    done = cli("upscale", str(folder), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert listing(tmp_path / "seq_upscaled") == ["s_upscaled_0001.exr", "s_upscaled_0002.exr"]


def _png16_with_every_filter(array):
    """A 16-bit PNG whose rows use PNG's five filters in turn (as libpng's adaptive filtering
    does), written here independently of image_files' own writer."""
    height, width, channels = array.shape
    rows = [np.frombuffer(array[y].astype(">u2").tobytes(), np.uint8).astype(int) for y in range(height)]
    bpp = 2 * channels
    out, prior = [], np.zeros_like(rows[0])
    for y, row in enumerate(rows):
        kind = y % 5
        left = np.concatenate([np.zeros(bpp, int), row[:-bpp]])
        upper_left = np.concatenate([np.zeros(bpp, int), prior[:-bpp]])
        if kind == 0:
            predicted = np.zeros_like(row)
        elif kind == 1:
            predicted = left
        elif kind == 2:
            predicted = prior
        elif kind == 3:
            predicted = (left + prior) // 2
        else:
            p = left + prior - upper_left
            pa, pb, pc = abs(p - left), abs(p - prior), abs(p - upper_left)
            predicted = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prior, upper_left))
        out.append(bytes([kind]) + ((row - predicted) % 256).astype(np.uint8).tobytes())
        prior = row

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 16, {3: 2, 4: 6}[channels], 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(out))) + chunk(b"IEND", b"")


@pytest.mark.parametrize("channels", [3, 4])
def test_sixteen_bit_colour_png_is_read_with_all_its_bits(tmp_path, channels):
    values = np.random.default_rng(3).integers(0, 65536, (9, 11, channels)).astype(np.uint16)
    (tmp_path / "deep.png").write_bytes(_png16_with_every_filter(values))
    read = image_files.read_image(tmp_path / "deep.png")
    assert read.dtype == np.uint16 and np.array_equal(read, values)
    assert image_files.input_kind(tmp_path / "deep.png") == "16-bit"
    # and the writer's own 16-bit PNG reads back the same
    (tmp_path / "again.png").write_bytes(image_files.png16_bytes(values))
    assert np.array_equal(image_files.read_image(tmp_path / "again.png"), values)


def test_sixteen_bit_png_input_gives_sixteen_bit_png_output(tmp_path):
    flat = np.full((10, 14, 3), 12345, np.uint16)  # 8 bits would make it 48 * 257 = 12336
    (tmp_path / "deep.png").write_bytes(_png16_with_every_filter(flat))
    done = cli("upscale", str(tmp_path / "deep.png"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert summary(done)["output_type"] == "16-bit PNG (follows the 16-bit input)"
    result = image_files.read_image(tmp_path / "deep_upscaled.png")
    assert result.dtype == np.uint16 and result.shape == (20, 28, 3)
    assert np.abs(result.astype(int) - 12345).max() <= 1
    # a format that cannot hold 16 bits says so
    done = cli("upscale", str(tmp_path / "deep.png"), str(tmp_path / "deep.jpg"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0 and "the input has 16-bit samples but JPG holds 8 bits" in done.stdout


def test_exif_orientation_is_applied_on_read(tmp_path):
    stored = np.zeros((20, 40, 3), np.uint8)
    stored[:5] = 255  # a white band along the stored top edge
    image = Image.fromarray(stored)
    exif = image.getexif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display", as a phone's portrait photo
    image.save(tmp_path / "phone.png", exif=exif.tobytes())
    upright = image_files.read_image(tmp_path / "phone.png")
    assert upright.shape == (40, 20, 3) and upright[:, -5:].min() == 255 and upright[:, :-5].max() == 0
    done = cli("upscale", str(tmp_path / "phone.png"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with Image.open(tmp_path / "phone_upscaled.png") as result:
        assert result.size == (40, 80)  # width x height: upright, as viewers show the photo


def test_an_animation_is_refused_and_a_multi_page_tiff_warns(tmp_path):
    def fresh():  # a new set per file: Pillow keeps state on an image it saved
        return [Image.new("RGB", (16, 12), colour) for colour in ("red", "green", "blue")]

    frames = fresh()
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:], duration=100)
    done = cli("upscale", str(tmp_path / "anim.gif"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 2 and "is an animation of 3 frames (GIF)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "anim_upscaled.png").exists()
    frames = fresh()
    frames[0].save(tmp_path / "anim.png", save_all=True, append_images=frames[1:])  # APNG
    done = cli("upscale", str(tmp_path / "anim.png"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 2 and "is an animation of 3 frames (PNG)" in done.stderr, done.stderr
    # a phone's multi-picture JPEG (the photo, then depth or gain maps) is a photo, not an animation
    frames = fresh()
    frames[0].save(tmp_path / "phone.jpg", format="MPO", save_all=True, append_images=frames[1:])
    done = cli("upscale", str(tmp_path / "phone.jpg"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0 and "phone.jpg holds 3 images (MPO); the first" in done.stdout, done.stderr
    frames = fresh()
    frames[0].save(tmp_path / "pages.tif", save_all=True, append_images=frames[1:])
    done = cli("upscale", str(tmp_path / "pages.tif"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "pages.tif has 3 pages; the first" in done.stdout
    with Image.open(tmp_path / "pages_upscaled.png") as result:
        assert result.getpixel((5, 5)) == (255, 0, 0)


def test_geometry_wrote_line_names_every_file(tmp_path, family_models):
    frames = frames_named(tmp_path / "g", [1])
    done = cli(
        "geometry", str(frames / "plate_1.png"), "--device", "cpu", *model_args(family_models, "geometry"), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("wrote: "))
    assert "plate_1_geometry.ply" in line and line.endswith("(+ plate_1_geometry.json, plate_1_geometry_normal.exr)")
    assert json.loads(done.stdout.strip().splitlines()[-1])["output_type"].startswith("PLY mesh")
