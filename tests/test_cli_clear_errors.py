"""Issue 33, clear errors: what a command-line user sees for hostile names, odd values and
folders they cannot use. Real CLI processes (what the terminal shows), real files."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import OpenEXR
import pytest
from lean_image_ai.runtime.log import event_file
from onnx_builders import sr_model
from PIL import Image

ESC = "\x1b"
HOSTILE = "a\x1b]0;owned\x07\nb\x1b[31m"  # retitles the terminal, splits the line, turns it red


def cli(tmp_path: Path, *args, env=None, prelude: str | None = None, timeout=180) -> subprocess.CompletedProcess:
    environment = {**os.environ, event_file.LOG_DIR_ENV: str(tmp_path / "logs"), **(env or {})}
    if prelude is None:
        command = [sys.executable, "-m", "lean_image_ai", *args]
    else:  # main() after some setup in the same interpreter (e.g. dropping to another user)
        code = f"{prelude}\nimport sys\nfrom lean_image_ai.ui.cli.main import main\nsys.exit(main({list(args)!r}))"
        command = [sys.executable, "-c", code]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=environment,
                          errors="surrogateescape")


def one_error(done: subprocess.CompletedProcess, *words: str) -> str:
    """Exit 2, one line on stderr starting with "error:" that holds each of ``words``."""
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr and "a bug;" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def picture(path: Path, height: int = 12, width: int = 16) -> Path:
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (height, width, 3), np.uint8)).save(path)
    return path


# ---- 7. raw file names never reach the terminal ---------------------------------------------------


def test_a_hostile_input_name_is_escaped_on_every_console_line(tmp_path):
    source = picture(tmp_path / f"{HOSTILE}.png")
    out = tmp_path / "out"
    out.mkdir()
    done = cli(tmp_path, "upscale", str(source), str(out), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert ESC not in done.stdout + done.stderr and "\x07" not in done.stdout
    (wrote,) = [line for line in done.stdout.splitlines() if line.startswith("wrote:")]  # one line, not split
    assert "a\\u001b]0;owned\\u0007\\nb\\u001b[31m" in wrote
    assert [p.name for p in out.iterdir()][0].startswith(HOSTILE)  # the file keeps its real name

    missing = cli(tmp_path, "upscale", str(tmp_path / f"gone{HOSTILE}.png"), "--device", "cpu")
    line = one_error(missing, "gone")
    assert "\\u001b]0;owned" in line and ESC not in missing.stderr


def test_a_hostile_model_name_is_escaped_in_models_list_rows(tmp_path):
    model = sr_model(tmp_path / f"x2{HOSTILE}.onnx", scale=2)
    folder = tmp_path / "models"
    registered = cli(tmp_path, "models", "register", "upscale", str(model), "--models-dir", str(folder))
    assert registered.returncode == 0, registered.stderr
    assert ESC not in registered.stdout
    listed = cli(tmp_path, "models", "list", "--family", "upscale", "--models-dir", str(folder))
    assert listed.returncode == 0 and ESC not in listed.stdout
    rows = [line for line in listed.stdout.splitlines() if "user_file" in line]
    assert len(rows) == 1 and "x2a\\u001b]0;owned\\u0007\\nb" in rows[0]  # one row, not split in two


# ---- 11. depth ranges that cannot work ------------------------------------------------------------


@pytest.mark.parametrize("value, words", [
    ("-3e38:3e38", ("32-bit float",)),
    ("-1e38:3e38", ("32-bit float",)),
    ("1:1.00000001", ("32-bit float",)),
    ("", ("empty",)),
    ("  ", ("empty",)),
])
def test_a_depth_range_that_cannot_work_is_refused_before_anything_runs(tmp_path, family_models, value, words):
    source = picture(tmp_path / "in.png", 56, 56)
    out = tmp_path / "depth.png"
    done = cli(tmp_path, "depth", str(source), str(out), "--model", str(family_models["depth"]),
               "--device", "cpu", f"--depth-range={value}")
    one_error(done, "Depth range", *words)
    assert not out.exists() and "wrote:" not in done.stdout


def test_a_wide_depth_range_that_fits_float32_still_writes(tmp_path, family_models):
    source = picture(tmp_path / "in.png", 56, 56)
    done = cli(tmp_path, "depth", str(source), str(tmp_path / "d.png"), "--model", str(family_models["depth"]),
               "--device", "cpu", "--depth-range=-1e38:1e38")
    assert done.returncode == 0, done.stderr


# ---- 12. verify of an unknown id -----------------------------------------------------------------


def test_verify_of_an_unknown_id_says_so_like_remove(tmp_path):
    folder = str(tmp_path / "models")
    verify = one_error(cli(tmp_path, "models", "verify", "no-such-id", "--models-dir", folder), "No model with id 'no-such-id'")
    remove = one_error(cli(tmp_path, "models", "remove", "no-such-id", "--models-dir", folder))
    assert verify == remove


# ---- 13. an event log that cannot be written -----------------------------------------------------


def test_an_event_log_that_cannot_be_written_is_said_once_on_stderr(tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    logs = blocker / "logs"  # mkdir fails, even as root
    done = cli(tmp_path, "upscale", "--output", str(tmp_path / "demo.png"), "--device", "cpu",
               env={event_file.LOG_DIR_ENV: str(logs)})
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "event log" in line]
    assert len(said) == 1, done.stderr  # once, not once per event
    assert said[0].startswith("warning: the event log cannot be written at") and str(logs) in said[0]
    assert event_file.LOG_DIR_ENV in said[0]


# ---- 14. an output pattern that is the input pattern ---------------------------------------------


@pytest.mark.parametrize("output", ["s_####.png", "s_%04d.png", "./s_####.png"])
def test_an_output_pattern_naming_the_inputs_says_it_would_overwrite_them(tmp_path, output):
    for number in (1, 2, 3):
        picture(tmp_path / f"s_{number:04d}.png")
    before = {p.name: p.read_bytes() for p in tmp_path.glob("s_*.png")}
    given = "." if output.startswith("./") else "s_####.png"
    done = cli(tmp_path, "upscale", given, output, "--device", "cpu")
    one_error(done, "overwrite the inputs", "s_0001.png")
    assert "No file matches" not in done.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.glob("s_*.png")} == before


# ---- 15. register names what is at the path -------------------------------------------------------


def _not_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    (tmp_path / "a folder").mkdir()
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.onnx"
    loop.symlink_to(loop)
    return {
        "folder": (tmp_path / "a folder", "is a folder"),
        "fifo": (fifo, "named pipe (FIFO)"),
        "link-loop": (loop, "link loop"),
        "device": (Path("/dev/null"), "is a device"),
    }


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs, /dev/null")
@pytest.mark.parametrize("case", ["folder", "fifo", "link-loop", "device"])
def test_register_names_what_is_at_the_path_as_model_does(tmp_path, case):
    path, what = _not_files(tmp_path)[case]
    folder = tmp_path / "models"
    done = cli(tmp_path, "models", "register", "upscale", str(path), "--models-dir", str(folder), timeout=60)
    one_error(done, str(path), what)
    assert "no file at that path" not in done.stderr
    assert not (folder / "user_models.json").exists()
    job = cli(tmp_path, "upscale", "--model", str(path), "--device", "cpu", timeout=60)  # the same words
    assert what in job.stderr


def test_register_of_a_missing_path_still_says_there_is_no_file(tmp_path):
    done = cli(tmp_path, "models", "register", "upscale", str(tmp_path / "none.onnx"), "--models-dir", str(tmp_path))
    one_error(done, "no file at that path")


# ---- 18. negative frames --------------------------------------------------------------------------


@pytest.mark.parametrize("frames", ["-3-5", "-2", "-5--1", "-4-2:2"])
def test_negative_frames_are_refused_when_parsed(tmp_path, frames):
    picture(tmp_path / "s_0001.png")
    done = cli(tmp_path, "upscale", "s_####.png", "o_####.png", f"--frames={frames}", "--device", "cpu")
    one_error(done, "--frames", "start at 0")
    assert done.stdout == ""  # refused by the parser: nothing was loaded


# ---- 6. the decompression-bomb limit on EXR -------------------------------------------------------


def _exr(path: Path, width: int = 64, height: int = 40, *, declared: tuple[int, int] | None = None) -> Path:
    """A small float EXR written by OpenEXR; ``declared`` patches the header's data window to a
    larger (width, height) than the few compressed bytes hold: what a decompression bomb looks like."""
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    with OpenEXR.File(header, {"RGB": np.zeros((height, width, 3), np.float32)}) as exr:
        exr.write(str(path))
    if declared is not None:
        data = path.read_bytes()
        at = data.index(b"dataWindow\0box2i\0") + len(b"dataWindow\0box2i\0") + 4
        path.write_bytes(data[:at] + struct.pack("<4i", 0, 0, declared[0] - 1, declared[1] - 1) + data[at + 16:])
    return path


@pytest.mark.parametrize("side", [20000, 60000])
def test_an_exr_declaring_too_many_pixels_is_refused_from_its_header(tmp_path, side):
    bomb = _exr(tmp_path / "bomb.exr", declared=(side, side))
    assert bomb.stat().st_size < 10_000
    done = cli(tmp_path, "upscale", str(bomb), str(tmp_path / "out.exr"), "--device", "cpu")
    line = one_error(done, f"declares {side * side:,} pixels", "decompression bombs", "LEAN_IMAGE_AI_MAX_PIXELS")
    assert "part index" not in line and not (tmp_path / "out.exr").exists()


def test_an_exr_follows_the_limit_variable_with_the_message_png_gets(tmp_path):
    exr = _exr(tmp_path / "small.exr")
    png = picture(tmp_path / "small.png", 40, 64)
    limited = {"LEAN_IMAGE_AI_MAX_PIXELS": "1000"}
    exr_line = one_error(cli(tmp_path, "upscale", str(exr), str(tmp_path / "o.exr"), "--device", "cpu", env=limited))
    png_line = one_error(cli(tmp_path, "upscale", str(png), str(tmp_path / "o.png"), "--device", "cpu", env=limited))
    assert exr_line.replace("small.exr", "small.png") == png_line
    unlimited = cli(tmp_path, "upscale", str(exr), str(tmp_path / "o.exr"), "--device", "cpu",
                    env={"LEAN_IMAGE_AI_MAX_PIXELS": "0"})
    assert unlimited.returncode == 0, unlimited.stderr


def test_every_part_of_a_multi_part_exr_counts(tmp_path):
    from lean_image_ai.models import image_meta

    parts = [
        OpenEXR.Part({"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage,
                      "displayWindow": (np.array([0, 0], np.int32), np.array([29, 19], np.int32))},
                     {"RGB": np.zeros((h, w, 3), np.float32)}, name)
        for name, (w, h) in (("left", (30, 20)), ("right", (10, 7)))
    ]
    with OpenEXR.File(parts) as exr:
        exr.write(str(tmp_path / "parts.exr"))
    assert image_meta.exr_pixels(tmp_path / "parts.exr") == 30 * 20 + 10 * 7
    assert image_meta.exr_pixels(_exr(tmp_path / "one.exr", 9, 5)) == 45
    assert image_meta.exr_pixels(picture(tmp_path / "p.png")) is None


# ---- 20. no traceback and no bug line -------------------------------------------------------------

# root reads any folder: the child drops to 'nobody' once its modules are imported (as
# tests/test_models_folder_errors.py does), so the OS's own EACCES is what it meets
AS_NOBODY = "import os, onnxruntime, PIL.Image, numpy, lean_image_ai.ui.cli.main\nos.setgroups([]); os.setgid(65534); os.setuid(65534)"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="drops from root to another user")
@pytest.mark.parametrize("action", ["list", "verify"])
def test_models_list_and_verify_on_a_folder_this_user_cannot_enter(tmp_path, action):
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="lean_image_ai_perm_"))  # not under pytest's 0700 folder
    try:
        base.chmod(0o777)
        folder = base / "models"
        folder.mkdir(mode=0o700)
        (folder / "upscale-realesr-general-x4v3.onnx.part").write_bytes(b"x")
        logs = base / "logs"
        logs.mkdir(mode=0o777)
        done = cli(base, "models", action, "--models-dir", str(folder), prelude=AS_NOBODY,
                   env={event_file.LOG_DIR_ENV: str(logs)})
        one_error(done, "Permission denied", str(folder), "--models-dir")
    finally:
        shutil.rmtree(base)


def test_models_list_and_verify_on_a_folder_that_is_no_folder_or_too_long(tmp_path):
    a_file = tmp_path / "a file"
    a_file.write_text("x")
    for folder, words in (
        (a_file / "models", ("is not a folder",)),
        (tmp_path / ("m" * 300), ("File name too long",)),
    ):
        for action in ("list", "verify"):
            one_error(cli(tmp_path, "models", action, "--models-dir", str(folder)), *words)
    assert cli(tmp_path, "models", "verify", "--models-dir", str(tmp_path / "not made yet")).returncode == 0


def test_a_log_folder_of_an_unknown_user_is_a_setting_error(tmp_path):
    done = cli(tmp_path, "models", "list", env={event_file.LOG_DIR_ENV: "~nosuchuser_lean/x"})
    one_error(done, event_file.LOG_DIR_ENV, "~nosuchuser_lean/x")


@pytest.mark.parametrize("where", ["LEAN_IMAGE_AI_RAM_BUDGET_MB", "LEAN_IMAGE_AI_VRAM_BUDGET_MB", "--ram-budget"])
def test_a_budget_of_5000_digits_is_out_of_range_in_a_short_line(tmp_path, where):
    digits = "9" * 5000
    flag = [f"--ram-budget={digits}"] if where.startswith("--") else []
    env = {} if flag else {where: digits}
    line = one_error(cli(tmp_path, "upscale", "--device", "cpu", *flag, env=env), where, "whole number of MiB")
    assert len(line) < 400


@pytest.mark.parametrize("case", ["input name", "input path", "output name", "output path"])
def test_paths_longer_than_the_os_allows_are_one_line(tmp_path, case):
    source = picture(tmp_path / "in.png")
    long_name = "n" * 300  # over NAME_MAX (255 on common file systems)
    long_path = "/".join(["p" * 200] * 30)  # over PATH_MAX (4096 on Linux)
    too_long = {"input name": long_name, "input path": long_path}.get(case)
    args = [str(tmp_path / (too_long + ".png")), str(tmp_path / "out.png")] if too_long else [
        str(source), str(tmp_path / ((long_name if case == "output name" else long_path) + ".png"))]
    line = one_error(cli(tmp_path, "upscale", *args, "--device", "cpu"), "longer than this system allows")
    assert len(line) < 400


@pytest.mark.parametrize("root", ["/", "//", "/tmp/.."])
def test_the_root_as_gpu_library_folder_is_refused_before_anything_is_deleted(monkeypatch, root):
    from lean_image_ai.runtime.cuda import gpu_libraries

    monkeypatch.setenv(gpu_libraries.FOLDER_ENV, root)
    folder = gpu_libraries.folder("/unused")
    for call in (gpu_libraries.remove, gpu_libraries.check_replaceable):
        with pytest.raises(gpu_libraries.GpuRuntimeError, match="root of the file system.*Nothing was deleted"):
            call(folder)
    assert Path("/tmp").is_dir()


@pytest.mark.parametrize("shape", [(10,), (2, 3, 4, 5), (8, 8, 7)])
def test_upscale_of_an_array_that_is_no_image_is_a_clear_error(shape):
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.runtime.errors import InvalidImageError

    with pytest.raises(InvalidImageError, match=r"image has shape .*expected HxW"):
        upscale.run(np.zeros(shape, np.float32))
