"""`python -m lean_image_ai`: the headless main job, run as a real process."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from lean_image_ai.models import families
from lean_image_ai.ui.cli.main import build_parser, demo_image
from PIL import Image


def cli(*args, cwd, prelude=None, timeout=120):
    if prelude is None:
        command = [sys.executable, "-m", "lean_image_ai", *args]
    else:  # run main() after some setup in the same interpreter (e.g. hiding Pillow)
        code = f"{prelude}\nimport sys\nfrom lean_image_ai.ui.cli.main import main\nsys.exit(main({list(args)!r}))"
        command = [sys.executable, "-c", code]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_default_run_needs_no_input_and_no_download(tmp_path):
    out = tmp_path / "demo.png"
    done = cli("upscale", "--output", str(out), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with Image.open(out) as written:
        assert written.size == (1024, 768) and written.mode == "RGB"
    text = done.stdout
    assert "generated demo image 512x384" in text and "bicubic_x2.onnx" in text
    assert f"wrote: {out} 1024x768 (2x)" in text and "[100%]" in text
    # memory report in the runtime's wording: the load apart from the runs, what the release gave
    # back, what stays by floor; never one "before -> after" arrow across the model load
    assert "memory of upscale (success, CPU):" in text and "process RAM (RSS, what the OS sees):" in text
    assert "bicubic_x2.onnx took " in text and "the runs grew " in text and "the release gave back " in text
    assert "what stays (" in text and "model weights (1 cached session, as the model files hold them)" in text
    assert " -> " not in text.split("memory of upscale", 1)[1]
    assert not [p for p in tmp_path.iterdir() if p.name != "demo.png"]  # no temp files left


def test_demo_output_default_name_in_the_current_folder(tmp_path):
    done = cli("upscale", "--device", "cpu", "--tile", "64", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with Image.open(tmp_path / "demo_upscaled.png") as written:
        assert written.size == (1024, 768)
    # the window that ran: 512 columns in 9 balanced tiles of 56-57 px + 2 x 2 px overlap
    assert "tile 61 px, overlap 2 px, seams exact" in done.stdout
    (tiling,) = summary(done)["tiling"]
    assert {k: tiling[k] for k in ("tile", "overlap", "seams", "exact")} == {"tile": 61, "overlap": 2, "seams": "exact",
                                                                          "exact": True}
    # the plan (issue 38): 9 x 7 windows, each paying its 2 px of overlap inside the image
    assert (tiling["windows"], tiling["overlap"], tiling["staged"]) == (63, 2, False) and 1 < tiling["compute"] < 1.2


def test_rgba_file_in_rgba_file_out(tmp_path):
    rgba = np.zeros((30, 40, 4), np.uint8)
    rgba[..., :3] = 200
    rgba[5:20, 10:30, 3] = 255
    Image.fromarray(rgba, "RGBA").save(tmp_path / "in.png")
    done = cli("upscale", "--input", str(tmp_path / "in.png"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with Image.open(tmp_path / "in_upscaled.png") as written:
        assert written.size == (80, 60) and written.mode == "RGBA"
        alpha = np.asarray(written)[..., 3]
    assert alpha[20, 40] == 255 and alpha[2, 2] == 0


def test_missing_input_exits_2_with_a_message_and_writes_nothing(tmp_path):
    out = tmp_path / "never.png"
    done = cli("upscale", "--input", str(tmp_path / "missing.png"), "--output", str(out), cwd=tmp_path)
    assert done.returncode == 2
    assert "missing.png' not found" in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_bad_device_and_unknown_extension_fail_before_any_work(tmp_path):
    done = cli("upscale", "--device", "gpu7", "--output", str(tmp_path / "a.png"), cwd=tmp_path)
    assert done.returncode == 2 and "Unknown device" in done.stderr
    done = cli("upscale", "--output", str(tmp_path / "a.nope"), cwd=tmp_path)
    assert done.returncode == 2 and "extension" in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_no_half_written_file(tmp_path):
    # a real write failure: the file size limit stops the PNG after 1000 bytes (EFBIG)
    previous = tmp_path / "keep.png"
    previous.write_bytes(b"old result")
    prelude = (
        "import resource, signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))"
    )
    done = cli("upscale", "--device", "cpu", "--overwrite", "--output", str(previous), cwd=tmp_path, prelude=prelude)
    assert done.returncode == 2 and "Could not write" in done.stderr, done.stderr
    assert previous.read_bytes() == b"old result"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.png"]


def test_without_pillow_the_message_says_what_to_do(tmp_path):
    done = cli("upscale", "--device", "cpu", cwd=tmp_path, prelude="import sys\nsys.modules['PIL'] = None")
    assert done.returncode == 2
    assert "Pillow" in done.stderr and "Blender" in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_help_lists_the_upscale_command(tmp_path):
    done = cli("--help", cwd=tmp_path)
    assert done.returncode == 0 and "upscale" in done.stdout
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["upscale", "--tile", "-3"])
    assert exit_info.value.code == 2


def test_demo_image_is_deterministic_and_has_content():
    first, second = demo_image(), demo_image()
    assert first.shape == (384, 512, 3) and first.dtype == np.uint8
    np.testing.assert_array_equal(first, second)
    assert len(np.unique(first.reshape(-1, 3), axis=0)) > 1000


def test_ctrl_c_cancels_between_runs_and_exits_130(tmp_path):
    # a real SIGINT, sent by the process to itself when the first tile is reported
    prelude = (
        "import os, signal\n"
        "from lean_image_ai.ui.cli import main as _cli\n"
        "_report = _cli._Progress.__call__\n"
        "def _interrupting(self, fraction, stage):\n"
        "    _report(self, fraction, stage)\n"
        "    if stage.startswith('tile 1/'):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "_cli._Progress.__call__ = _interrupting"
    )
    out = tmp_path / "out.png"
    done = cli(
        "upscale", "--device", "cpu", "--tile", "64", "--output", str(out), cwd=tmp_path, prelude=prelude
    )
    assert done.returncode == 130, done.stderr
    assert "cancelling after the current model run" in done.stderr and "nothing was written" in done.stderr
    assert "wrote:" not in done.stdout and list(tmp_path.iterdir()) == []


# ---- every family, files and folders, output policy ------------------------------------------------


def write_frames(folder, count=3, size=(30, 40)):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for n in range(1, count + 1):
        Image.fromarray((rng.random((*size, 3)) * 255).astype(np.uint8)).save(folder / f"shot_{n:04d}.png")
    return folder


def summary(done) -> dict:
    import json

    return json.loads(done.stdout.strip().splitlines()[-1])


def model_args(family_models, command):
    model = family_models[command]
    return [] if model is None else ["--model", str(model)]


EXPECTED = {  # command -> (default name of frame 2 in a folder, files one frame writes)
    "remove-background": ("shot_cutout_0002.png", 1),
    "depth": ("shot_depth_0002.exr", 1),
    "geometry": ("shot_geometry_0002.ply", 3),
    "upscale": ("shot_upscaled_0002.png", 1),
}


def test_every_registered_command_is_expected_here():
    assert set(EXPECTED) == {f.command for f in families.ALL}


@pytest.mark.parametrize("command", list(EXPECTED))
def test_every_family_on_a_folder_and_on_one_file(tmp_path, family_models, command):
    frames = write_frames(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    done = cli(command, str(frames), str(out), "--device", "cpu", *model_args(family_models, command), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = summary(done)
    assert report["command"] == command and (report["frames"], report["written"], report["failed"]) == (3, 3, [])
    assert report["memory"]["process_rss_peak"] >= report["memory"]["rss_before"] > 0
    name, per_frame = EXPECTED[command]
    assert (out / name).is_file() and len(list(out.iterdir())) == 3 * per_frame
    # one file, default name beside it
    single = frames / "shot_0001.png"
    done = cli(command, str(single), "--device", "cpu", *model_args(family_models, command), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert summary(done)["written"] == 1
    assert (frames / name.replace("_0002", "").replace("shot_", "shot_0001_")).is_file()


def test_depth_keeps_floats_in_exr_and_records_the_range_in_png(tmp_path, family_models):
    import OpenEXR

    frames = write_frames(tmp_path / "in", count=1)
    model = ["--model", str(family_models["depth"]), "--device", "cpu"]
    assert cli("depth", str(frames / "shot_0001.png"), str(tmp_path / "d.exr"), *model, cwd=tmp_path).returncode == 0
    with OpenEXR.File(str(tmp_path / "d.exr")) as exr:
        depth = exr.channels()["Y"].pixels
    assert depth.dtype == np.float32 and depth.shape == (30, 40) and depth.max() > 1.0  # not clipped
    done = cli("depth", str(frames / "shot_0001.png"), str(tmp_path / "d.png"), *model, cwd=tmp_path)
    assert done.returncode == 0 and "were mapped to 0..1" in done.stdout
    with Image.open(tmp_path / "d.png") as png:
        low, high = map(float, png.text["lean_image_ai:value_range"].split())
        grey = np.asarray(png).astype(np.float64) / 65535
    assert (low, high) == pytest.approx((float(depth.min()), float(depth.max())), rel=1e-6)
    np.testing.assert_allclose(low + grey * (high - low), depth, atol=(high - low) / 65535 * 1.01)


def test_output_checks_happen_before_the_model_runs(tmp_path, family_models):
    frames = write_frames(tmp_path / "in", count=2)
    ben2 = ["--model", str(family_models["remove-background"]), "--device", "cpu"]
    cases = [
        (("remove-background", str(frames), str(tmp_path / "c_####.jpg"), *ben2), "no alpha channel"),
        (("upscale", str(frames / "shot_0001.png"), str(frames / "shot_0001.png")), "is an input image"),
        (("upscale", str(frames), str(tmp_path / "one.png")), "one file but the input has 2 frames"),
        (("geometry", str(frames / "shot_0001.png"), str(tmp_path / "g.obj"), "--model", str(family_models["geometry"])), "give a .ply mesh file"),
    ]
    for args, message in cases:
        done = cli(*args, cwd=tmp_path)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
        assert "model:" not in done.stdout  # refused before anything ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_output_folders_are_made_after_the_checks(tmp_path):
    frames = write_frames(tmp_path / "in", count=2)
    refused = cli("upscale", str(frames), str(tmp_path / "new" / "one.png"), "--device", "cpu", cwd=tmp_path)
    assert refused.returncode == 2 and "one file but the input has 2 frames" in refused.stderr
    assert not (tmp_path / "new").exists(), "a refused command makes no folder"
    done = cli("upscale", str(frames), str(tmp_path / "new" / "shot" / "o_####.png"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "new" / "shot").iterdir()) == ["o_0001.png", "o_0002.png"]
    done = cli("upscale", str(frames), str(tmp_path / "new" / "renders"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr  # no suffix, not there yet: a folder, made
    assert sorted(p.suffix for p in (tmp_path / "new" / "renders").iterdir()) == [".png", ".png"]
    (tmp_path / "blocker").write_text("a file where a folder would go")
    done = cli("upscale", str(frames), str(tmp_path / "blocker" / "sub" / "o_####.png"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 2 and "cannot be made (Not a directory)" in done.stderr, done.stderr


def test_existing_outputs_are_kept_unless_asked(tmp_path):
    frames = write_frames(tmp_path / "in", count=3)
    out = tmp_path / "out"
    out.mkdir()
    (out / "shot_upscaled_0001.png").write_bytes(b"earlier result")
    done = cli("upscale", str(frames), str(out), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 2 and "--overwrite" in done.stderr and "--skip-existing" in done.stderr
    assert len(list(out.iterdir())) == 1
    done = cli("upscale", str(frames), str(out), "--device", "cpu", "--skip-existing", cwd=tmp_path)
    assert done.returncode == 0 and (summary(done)["skipped"], summary(done)["written"]) == (1, 2)
    assert (out / "shot_upscaled_0001.png").read_bytes() == b"earlier result"
    (out / "shot_upscaled_0001.png").chmod(0o640)
    done = cli("upscale", str(frames), str(out), "--device", "cpu", "--overwrite", "--frames", "1-1", cwd=tmp_path)
    assert done.returncode == 0 and summary(done)["written"] == 1
    assert (out / "shot_upscaled_0001.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "shot_upscaled_0001.png").stat().st_mode & 0o777 == 0o640  # the file keeps its mode


def test_a_missing_frame_fails_that_frame_and_exits_2(tmp_path):
    frames = write_frames(tmp_path / "in", count=3)
    (frames / "shot_0002.png").unlink()
    out = tmp_path / "out"
    out.mkdir()
    done = cli("upscale", str(frames / "shot_####.png"), str(out), "--frames", "1-3", "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 2 and "frame 2" in done.stderr
    report = summary(done)
    assert (report["written"], [f["frame"] for f in report["failed"]]) == (2, [2])


def test_doctor_reports_onnxruntime_and_what_cuda_got(tmp_path):
    done = cli("doctor", "--json", cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "onnxruntime: onnxruntime" in done.stdout and "Providers offered:" in done.stdout
    import json

    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["onnxruntime_error"] is None and "CPUExecutionProvider" in report["available_providers"]


def test_the_readme_demo_can_run_twice(tmp_path):
    for _ in range(2):  # its own earlier result is replaced, not an error
        done = cli("upscale", "--device", "cpu", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["demo_upscaled.png"]


def _png_header_claiming(path, width, height):
    """A real small PNG whose IHDR is rewritten to claim width x height (a decompression bomb's
    header: Pillow reads the size before any pixel data)."""
    import struct
    import zlib

    Image.new("RGB", (4, 4)).save(path)
    data = bytearray(path.read_bytes())
    ihdr = data[12:29]  # b"IHDR" + 13 bytes
    ihdr[4:12] = struct.pack(">II", width, height)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)))
    path.write_bytes(bytes(data))


def test_decompression_bomb_is_a_clear_error_and_the_limit_can_be_raised(tmp_path):
    import os

    bomb = tmp_path / "bomb.png"
    _png_header_claiming(bomb, 40000, 40000)
    result = cli("upscale", str(bomb), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "1,600,000,000 pixels" in result.stderr and "decompression bomb" in result.stderr
    assert "LEAN_IMAGE_AI_MAX_PIXELS=1600000000" in result.stderr
    assert "DecompressionBombError" not in result.stderr + result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.png"], "no partial output"

    # a genuine image over a (lowered) limit is refused, then accepted once the setting allows it
    small = tmp_path / "big.png"
    Image.fromarray(np.zeros((30, 30, 3), np.uint8)).save(small)
    env = {**os.environ, "LEAN_IMAGE_AI_MAX_PIXELS": "100"}
    refused = subprocess.run(
        [sys.executable, "-m", "lean_image_ai", "upscale", str(small)], capture_output=True, text=True, env=env
    )
    assert refused.returncode == 2 and "900 pixels" in refused.stderr
    env["LEAN_IMAGE_AI_MAX_PIXELS"] = "900"
    accepted = subprocess.run(
        [sys.executable, "-m", "lean_image_ai", "upscale", str(small)], capture_output=True, text=True, env=env
    )
    assert accepted.returncode == 0, accepted.stderr
    assert (tmp_path / "big_upscaled.png").is_file()


def test_a_single_file_is_named_by_its_path_and_a_failed_job_reports_memory_once(tmp_path):
    """img1080.png is one image, not "frame 1080"; a frame that fails inside the model ends the
    batch without a second (empty) operation and its memory report."""
    from builders_moge2 import moge2_like_model

    image = tmp_path / "img1080.png"
    Image.fromarray(np.full((40, 48, 3), 128, np.uint8)).save(image)
    poisoned = moge2_like_model(tmp_path / "nan.onnx", poison="nan")
    done = cli("geometry", str(image), str(tmp_path / "g.ply"), "--device", "cpu", "--model", str(poisoned), cwd=tmp_path)
    assert done.returncode != 0
    assert "error: img1080.png: " in done.stderr and "frame 1080" not in done.stderr + done.stdout
    assert summary(done)["failed"][0]["input"] == str(image)
    assert done.stdout.count("memory of geometry") == 1
    assert not (tmp_path / "g.ply").exists()
