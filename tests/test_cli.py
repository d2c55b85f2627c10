"""`python -m lean_image_ai`: the headless main job, run as a real process."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from lean_image_ai.cli import build_parser, demo_image
from PIL import Image


def cli(*args, cwd, prelude=None, timeout=120):
    if prelude is None:
        command = [sys.executable, "-m", "lean_image_ai", *args]
    else:  # run main() after some setup in the same interpreter (e.g. hiding Pillow)
        code = f"{prelude}\nimport sys\nfrom lean_image_ai.cli import main\nsys.exit(main({list(args)!r}))"
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
    # memory report: snapshots before/after and the runtime's release event (RSS before -> after)
    assert "before the job: process RSS" in text and "after the job:  process RSS" in text
    assert "release after upscale (bicubic_x2.onnx on CPU" in text and " -> process RSS" in text
    assert not [p for p in tmp_path.iterdir() if p.name != "demo.png"]  # no temp files left


def test_demo_output_default_name_in_the_current_folder(tmp_path):
    done = cli("upscale", "--device", "cpu", "--tile", "64", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with Image.open(tmp_path / "demo_upscaled.png") as written:
        assert written.size == (1024, 768)
    assert "tile 64 px" in done.stdout


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
        "from lean_image_ai import cli as _cli\n"
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
    assert "Cancelling after the current model run" in done.stderr and "nothing was written" in done.stderr
    assert "wrote:" not in done.stdout and list(tmp_path.iterdir()) == []
