"""Issue 11, the picture of a job's memory (runtime/measure/memory_plot.py): drawn from a real job's
timeline, decoded with Pillow (which the add-on itself never needs)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from lean_image_ai.runtime import Runtime, mark_last
from lean_image_ai.runtime.log import event_file
from lean_image_ai.runtime.measure import memory_plot
from onnx_builders import conv_model
from PIL import Image


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conv_model(tmp_path_factory.mktemp("models") / "conv.onnx", mid_channels=8)


def mark_groups(rgba: np.ndarray, colour, timeline=None) -> list[int]:
    """First column of each run of adjacent columns holding ``colour`` (one group per mark)
    inside the plot area (the legend's swatches and the labels are outside it)."""
    left, top, right, bottom = memory_plot.plot_box(timeline or {}, rgba.shape[1], rgba.shape[0])
    inside = np.zeros(rgba.shape[:2], bool)
    inside[top + 1 : bottom, left + 1 : right] = True
    columns = np.flatnonzero(((rgba[:, :, :3] == colour).all(axis=2) & inside).any(axis=0))
    return [int(c) for i, c in enumerate(columns) if i == 0 or c != columns[i - 1] + 1]


def decoded(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as picture:
        assert picture.format == "PNG" and picture.mode == "RGBA"
        return np.asarray(picture)


def test_the_png_of_a_real_job_shows_each_run_and_the_release(conv):
    runtime = Runtime()
    runs = 5
    with runtime.operation("plotted") as op:
        handle = op.session(conv, "cpu")
        for _, last in mark_last(range(runs)):
            op.run(handle, {"x": np.ones((1, 3, 160, 160), np.float32)}, last=last)
    timeline = runtime.last_timeline
    picture = decoded(memory_plot.png_bytes(memory_plot.render(timeline)))
    assert picture.shape == (memory_plot.HEIGHT, memory_plot.WIDTH, 4)
    assert np.array_equal(picture, memory_plot.render(timeline)), "the PNG holds exactly the drawing"
    run_marks = mark_groups(picture, memory_plot.COLOURS["run"], timeline)
    (release,) = mark_groups(picture, memory_plot.COLOURS["release"], timeline)
    before, after = mark_groups(picture, memory_plot.COLOURS["edge"], timeline)
    assert len(run_marks) == runs == op.runs
    assert before < run_marks[0] and run_marks[-1] < release < after, "in the order they happened"
    assert mark_groups(picture, memory_plot.COLOURS["ram"], timeline), "the RSS line is drawn"
    assert not (picture[:, :, :3] == memory_plot.COLOURS["vram"]).all(axis=2).any(), "no GPU figure on a CPU job"
    assert memory_plot.title(timeline).startswith("memory of plotted on CPU for ")
    legend = memory_plot.legend(timeline)
    assert legend[0].startswith("process RAM (blue): ") and legend[-1].startswith(f"marks: {runs} run(s) orange")


def test_marks_closer_than_a_pixel_stay_apart():
    mb = 1 << 20
    marks = [(0.0, "before", {"ram": 100 * mb})] + [(1.0 + i * 1e-4, f"run {i + 1}", {"ram": 120 * mb}) for i in range(4)]
    marks += [(1.001, "release", {"ram": 101 * mb}), (1.002, "after", {"ram": 101 * mb})]
    timeline = {"samples": [(0.5, {"ram": 110 * mb, "vram": None})], "marks": marks}
    picture = memory_plot.render(timeline, 400, 200)
    assert len(mark_groups(picture, memory_plot.COLOURS["run"], timeline)) == 4
    assert len(mark_groups(picture, memory_plot.COLOURS["release"], timeline)) == 1


def test_many_runs_thin_to_ticks_instead_of_a_solid_band():
    """Issue 32 item 9: 2000 runs nudged 3 px apart filled the plot with orange; now they keep
    their own columns (marks closer than a pixel merge) as ticks along the bottom, and the RSS
    line stays clear above them. Few runs still get a full-height line each (the test above)."""
    mb = 1 << 20
    runs = 2000
    marks = [(0.0, "before", {"ram": 100 * mb})]
    marks += [(0.1 + i * 0.005, f"run {i + 1}", {"ram": (120 + i % 7) * mb}) for i in range(runs)]
    marks += [(10.2, "release", {"ram": 101 * mb}), (10.3, "after", {"ram": 101 * mb})]
    timeline = {"samples": [(5.0, {"ram": 140 * mb, "vram": None})], "marks": marks}
    picture = memory_plot.render(timeline)
    left, top, right, bottom = memory_plot.plot_box(timeline, picture.shape[1], picture.shape[0])
    plot = picture[top + 1 : bottom, left + 1 : right, :3]
    orange = (plot == memory_plot.COLOURS["run"]).all(axis=2)
    upper = orange[: orange.shape[0] // 2]
    assert not upper.any(), "no run mark reaches the upper half, where the lines are"
    assert orange.mean() < 0.05, orange.mean()
    assert orange.any(axis=0).sum() > (right - left) // 2  # the ticks span the runs' time (0.1..10.1 s)
    assert len(mark_groups(picture, memory_plot.COLOURS["release"], timeline)) == 1
    assert memory_plot.legend(timeline)[-1].startswith(f"marks: {runs} run(s) orange")


def test_the_command_line_writes_the_plot(tmp_path):
    plot = tmp_path / "memory.png"
    command = [sys.executable, "-m", "lean_image_ai", "upscale", "--output", str(tmp_path / "out.png"),
               "--device", "cpu", "--tile", "128", "--memory-plot", str(plot)]
    env = {**os.environ, event_file.LOG_DIR_ENV: str(tmp_path / "logs")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"memory plot: {plot} (process RAM (blue): " in done.stdout
    json.loads(done.stdout.strip().splitlines()[-1])  # the summary stays the last line
    picture = decoded(plot.read_bytes())
    assert picture.shape == (memory_plot.HEIGHT, memory_plot.WIDTH, 4)
    events = [json.loads(line) for line in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    (end,) = [e for e in events if e["event"] == "operation_end"]
    assert end["runs"] > 1 and len(mark_groups(picture, memory_plot.COLOURS["run"], {})) == end["runs"]


def test_the_picture_explains_itself():
    """Axes in MiB and seconds with round ticks, the title, the before/after levels and the legend,
    in the picture itself (checked against the same text drawn by the built-in font)."""
    from lean_image_ai.runtime.measure.bitmap_font import draw_text, text_width

    mb = 1 << 20
    marks = [(0.0, "before", {"ram": 200 * mb, "vram": 100 * mb})]
    marks += [(0.5 + i * 0.5, f"run {i + 1}", {"ram": 260 * mb, "vram": 900 * mb}) for i in range(3)]
    marks += [(2.1, "release", {"ram": 210 * mb, "vram": 150 * mb}), (2.2, "after", {"ram": 210 * mb, "vram": 150 * mb})]
    timeline = {"samples": [(1.0, {"ram": 250 * mb, "vram": 880 * mb})], "marks": marks,
                "operation": "depth", "devices": ["CUDA:0"], "outcome": "success"}  # fmt: skip
    assert memory_plot.title(timeline) == "memory of depth on CUDA:0 for 2.2 s - job peak RSS 260 MiB, VRAM 900 MiB"
    assert memory_plot.nice_ticks(200, 260) == [200, 220, 240, 260]
    assert memory_plot.nice_ticks(0.0, 2.2, 6) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    picture = memory_plot.render(timeline)
    for text in ("RSS, MiB", "VRAM, MiB", "RSS before 200 MiB", "VRAM after 150 MiB", "model runs (3)", "release"):
        stamp = np.zeros((14, text_width(text, 2), 3), np.uint8)
        draw_text(stamp, 0, 0, text, (255, 255, 255), 2)
        on = stamp[:, :, 0] > 0
        colours = [memory_plot.COLOURS[k] for k in ("text", "ram", "vram")]
        found = False
        for colour in colours:  # somewhere the glyphs' pixels are all of one colour
            mask = (picture[:, :, :3] == colour).all(axis=2)
            ys, xs = np.nonzero(mask)
            for y, x in zip(ys, xs, strict=True):
                window = mask[y : y + 14, x : x + on.shape[1]]
                if window.shape == on.shape and window[on].all():
                    found = True
                    break
            if found:
                break
        assert found, f"{text!r} is not in the picture"
