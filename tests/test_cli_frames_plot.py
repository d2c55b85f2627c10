"""Frames map to exactly one file each, and the memory plot is an output like the others: both
checked before any model runs, through real CLI processes on real files."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from lean_image_ai.models.batch import frame_lists
from lean_image_ai.runtime.errors import LeanImageError
from lean_image_ai.runtime.measure import memory_plot
from PIL import Image


def cli(*args, cwd, prelude=""):
    code = f"{prelude}\nimport sys\nfrom lean_image_ai.ui.cli.main import main\nsys.exit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd)


def _png(path: Path, value: int, size=(12, 16)) -> Path:
    Image.fromarray(np.full((*size, 3), value, np.uint8)).save(path)
    return path


def _one_error_line(done) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# ---- frames ----------------------------------------------------------------------------------------


def test_differently_padded_files_of_one_frame_are_refused_naming_all_before_any_model_runs(tmp_path):
    for value, name in enumerate(("s_0001.png", "s_001.png", "s_00001.png", "s_1.png", "s_0002.png")):
        _png(tmp_path / name, 10 * value)
    done = cli("upscale", str(tmp_path / "s_####.png"), str(tmp_path / "o_####.png"), "--device", "cpu", cwd=tmp_path)
    line = _one_error_line(done)
    claimed = line.split("frame 1: ", 1)[1].split(")", 1)[0]
    assert sorted(claimed.split(", ")) == ["s_00001.png", "s_0001.png", "s_001.png", "s_1.png"], line
    assert "overwrite each other" in line
    assert "model:" not in done.stdout and not list(tmp_path.glob("o_*"))
    # the same through --frames, and for the Blender batch (one listing for both)
    with pytest.raises(LeanImageError, match="s_1.png"):
        frame_lists.resolve_input(tmp_path / "s_####.png", range(1, 3))


def test_a_folder_with_two_files_for_one_frame_number_is_refused(tmp_path):
    _png(tmp_path / "a_0007.png", 1)
    _png(tmp_path / "b_0007.png", 2)
    _png(tmp_path / "a_0008.png", 3)
    with pytest.raises(LeanImageError, match=r"frame 7: a_0007.png, b_0007.png"):
        frame_lists.resolve_input(tmp_path)


def test_folder_frames_are_numbered_by_their_names_never_renumbered(tmp_path):
    for number in (7, 9, 12):
        _png(tmp_path / f"c_{number:04d}.png", number)
    assert [r.number for r in frame_lists.resolve_input(tmp_path)] == [7, 9, 12]
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("b.png", "a.png"):
        _png(plain / name, 1)
    assert [(r.number, r.path.name) for r in frame_lists.resolve_input(plain)] == [(1, "a.png"), (2, "b.png")]
    _png(tmp_path / "reference.png", 5)  # one file without a number among numbered frames
    with pytest.raises(LeanImageError, match=r"mixes numbered frames .*reference.png.*c_####.png"):
        frame_lists.resolve_input(tmp_path)


def test_a_huge_frame_range_is_refused_at_once_saying_what_exists(tmp_path):
    for number in range(1, 4):
        _png(tmp_path / f"s_{number:04d}.png", number)
    started = time.monotonic()
    done = cli("upscale", str(tmp_path / "s_####.png"), "--frames", "1-1000000", "--device", "cpu", cwd=tmp_path)
    line = _one_error_line(done)
    assert "only 3 of its 1,000,000 frames" in line and "--frames 1-3" in line
    done = cli("upscale", str(tmp_path / "s_####.png"), "--frames", "1-30000000", "--device", "cpu", cwd=tmp_path)
    assert "argument --frames" in _one_error_line(done) and "1,048,574" in done.stderr  # beyond Blender's frames
    assert time.monotonic() - started < 60  # was minutes with no output
    with pytest.raises(LeanImageError, match="up to 1,048,574"):
        frame_lists.parse_frames("1-99999999999999999999")
    # a range is never ignored: not with one unnumbered file, not with the demo image
    _png(tmp_path / "still.png", 1)
    with pytest.raises(LeanImageError, match="ends in no frame number"):
        frame_lists.resolve_input(tmp_path / "still.png", range(1, 3))
    assert "--frames needs an INPUT" in _one_error_line(cli("upscale", "--frames", "1-3", cwd=tmp_path))
    # a few missing frames in a range are still each reported failed, not dropped
    refs = frame_lists.resolve_input(tmp_path / "s_####.png", range(1, 6))
    assert [r.number for r in refs] == [1, 2, 3, 4, 5] and not refs[4].path.exists()


# ---- the memory plot ---------------------------------------------------------------------------------


@pytest.fixture
def job(tmp_path):
    return _png(tmp_path / "in.png", 90), tmp_path / "out.png"


@pytest.mark.parametrize(
    "plot, expected",
    [
        ("in.png", "an input or an output"),
        ("out.png", "an input or an output"),
        ("taken.png", "exists; add --overwrite"),
        ("missing/plot.png", "does not exist"),
        ("folder", "is a folder"),
        ("plot.jpg", "give a name ending in .png"),
    ],
)
def test_the_memory_plot_is_checked_before_any_model_runs(job, plot, expected, tmp_path):
    source, out = job
    taken = _png(tmp_path / "taken.png", 7)
    (tmp_path / "folder").mkdir()
    before = {p: p.read_bytes() for p in (source, taken)}
    done = cli("upscale", str(source), str(out), "--device", "cpu", "--memory-plot", str(tmp_path / plot), cwd=tmp_path)
    line = _one_error_line(done)
    assert line.startswith("error: --memory-plot") and expected in line
    assert "model:" not in done.stdout and not out.exists() and not (tmp_path / "plot.jpg").exists()
    assert {p: p.read_bytes() for p in (source, taken)} == before  # the input image is never the plot


def test_the_memory_plot_is_a_real_png_written_atomically(job, tmp_path):
    source, out = job
    plot = _png(tmp_path / "memory.png", 3)
    done = cli("upscale", str(source), str(out), "--device", "cpu", "--memory-plot", str(plot), "--overwrite", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with Image.open(plot) as image:
        assert image.format == "PNG" and image.size == (memory_plot.WIDTH, memory_plot.HEIGHT)
    assert f"memory plot: {plot}" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.png", "memory.png", "out.png"]  # no temp file


def test_a_plot_that_cannot_be_written_after_the_frames_keeps_the_json_line_and_the_frames(job, tmp_path):
    """A full disk (RLIMIT_FSIZE: the small frame fits, the plot does not) once every frame is written."""
    source, out = job
    plot = tmp_path / "memory.png"
    limit = "import resource\nresource.setrlimit(resource.RLIMIT_FSIZE, (300, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))"
    done = cli("upscale", str(source), str(out), "--device", "cpu", "--memory-plot", str(plot), cwd=tmp_path, prelude=limit)
    assert done.returncode == 2, done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["written"] == 1 and summary["failed"] == []
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: --memory-plot {plot}: could not write it")
    with Image.open(out) as image:
        assert image.size == (32, 24)
    assert not plot.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in.png", "out.png"]
