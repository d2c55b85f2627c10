"""Issue 38: a deep upscaler's default plan is staged (body and head cut apart at the graph's last 1x
tensor), the reach it tiles by is the model's (a fixed probe, cached per content in the models
folder's cache, validated when read), an explicit tile never costs more than twice the automatic
plan, and memory other processes hold never changes the pixels. Real onnxruntime on a small deep
net built here (72 convs: a receptive radius past MAX_EXACT_RADIUS); trained weights in
tests/test_trained_seams.py."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.adapters.upscale.plan import MAX_EXACT_RADIUS
from lean_image_ai.models.base import RunOptions
from lean_image_ai.models.tiles import reach, reach_cache
from lean_image_ai.models.tiles.receptive import graph_receptive_field
from lean_image_ai.models.tiles.stages import stages_for
from lean_image_ai.runtime import Runtime
from lean_image_ai.runtime.errors import InferenceOutOfMemoryError
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import save_model

DEPTH = 70  # 3x3 convs in the body: a radius of 72 px with the first conv and the head


def deep_sr_model(path, seed=0, depth=DEPTH, channels=4):
    """conv 3->4, `depth` near-identity 3x3 convs with LeakyReLU, a skip, nearest x2, conv 4->3:
    RRDBNet's shape in miniature (its body at 1x, its head after the upsampling)."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def weight(name, out, inp, identity):
        w = rng.standard_normal((out, inp, 3, 3)).astype(np.float32) * 0.05
        if identity:
            w[np.arange(out), np.arange(out), 1, 1] += 1.0
        inits.append(numpy_helper.from_array(w, name))
        return name

    nodes.append(helper.make_node("Conv", ["input", weight("w0", channels, 3, False)], ["f0"], pads=[1, 1, 1, 1]))
    x = "f0"
    for i in range(depth):
        nodes.append(helper.make_node("Conv", [x, weight(f"w{i + 1}", channels, channels, True)], [f"c{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("LeakyRelu", [f"c{i}"], [f"r{i}"], alpha=0.2))
        x = f"r{i}"
    nodes.append(helper.make_node("Add", ["f0", x], ["joined"]))
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    nodes.append(helper.make_node("Resize", ["joined", "", "scales"], ["up"], mode="nearest"))
    nodes.append(helper.make_node("Conv", ["up", weight("wl", 3, channels, False)], ["output"], pads=[1, 1, 1, 1]))
    graph = helper.make_graph(
        nodes, "deep", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, "OH", "OW"])], inits,
    )  # fmt: skip
    return save_model(graph, path)


@pytest.fixture
def models_folder(tmp_path, monkeypatch):
    folder = tmp_path / "models"
    folder.mkdir()
    monkeypatch.setenv("LEAN_IMAGE_AI_MODELS_DIR", str(folder))
    reach_cache.forget_in_process()
    yield folder
    reach_cache.forget_in_process()


@pytest.fixture
def deep(tmp_path):
    (tmp_path / "user").mkdir()
    return deep_sr_model(tmp_path / "user" / "deep.onnx")


@pytest.fixture
def runtime():
    runtime = Runtime()
    yield runtime
    runtime.clear("test teardown")


def picture(height, width, seed=0):
    return np.random.default_rng(seed).random((height, width, 3), dtype=np.float32)


def _run(runtime, image, model, **settings):
    return upscale.run(image, model, options=RunOptions(device="cpu", runtime=runtime), **settings)


def test_a_deep_nets_default_plan_is_staged_and_exact(runtime, deep, models_folder):
    assert graph_receptive_field(deep).radius > MAX_EXACT_RADIUS
    image = picture(60, 70)
    staged = _run(runtime, image, deep)
    whole = _run(runtime, image, deep, tile_size=None)
    assert staged.plan["staged"] and staged.exact and staged.seams == "exact"
    assert staged.plan["compute"] <= 1.1  # the body once over the image, the head's 2 px overlap
    np.testing.assert_array_equal(staged.image, whole.image)
    assert not [w for w in staged.warnings if w.startswith("Not exact")]
    cached = sorted(p.name for p in (models_folder / ".cache" / "tiling").iterdir())
    assert any(name.endswith(".body.onnx") for name in cached) and any(name.endswith(".head.onnx") for name in cached)
    assert sorted(p.name for p in deep.parent.iterdir()) == ["deep.onnx"]  # nothing beside the user's file


def test_a_small_budget_cuts_the_body_into_few_windows_and_says_so(runtime, deep, models_folder):
    image = picture(120, 160)
    whole = _run(runtime, image, deep, tile_size=None)
    rate = stages_for(deep, models_folder / ".cache" / "tiling").body_bytes_per_pixel
    budget = int(2 * 17_000 * rate)  # half of it per window: 17k px of body, the image is 19.2k
    staged = _run(runtime, image, deep, memory_budget_bytes=budget)
    assert staged.plan["staged"] and not staged.exact and staged.plan["windows"] > 2
    assert staged.plan["window"] == [120, 160 // 2 + staged.overlap]  # two full-height strips: one seam
    assert staged.plan["compute"] < 2.0
    assert any(w.startswith("Not exact:") and "body" in w for w in staged.warnings)
    assert np.abs(staged.image - whole.image).max() * 255 < 2  # near-identity convs: the seams stay small


def _measuring(calls):
    def infer(window):  # a 3x3 box blur then x2: it reaches 1 px
        calls.append(window.shape)
        padded = np.pad(window, ((1, 1), (1, 1), (0, 0)), mode="edge")
        blurred = sum(padded[dy : dy + window.shape[0], dx : dx + window.shape[1]] for dy in range(3) for dx in range(3)) / 9
        return blurred.repeat(2, axis=0).repeat(2, axis=1)

    return infer


def _record(model) -> os.PathLike:
    return reach_cache.record_path(reach_cache.content_hash(model))


def test_the_reach_is_kept_per_content_in_the_models_folders_cache(tmp_path, models_folder):
    model = tmp_path / "net.onnx"
    model.write_bytes(b"a" * 64)
    calls = []
    assert reach.reach_for(model, _measuring(calls)) == (1, [])
    assert len(calls) == 2 and calls[0] == reach.probe_image().shape  # the fixed probe, not a job's image
    record = _record(model)
    assert record.parent == models_folder / ".cache" / "tiling" and json.loads(record.read_text())["reach"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "net.onnx"]
    reach_cache.forget_in_process()
    assert reach.reach_for(model, _measuring(calls)) == (1, []) and len(calls) == 2  # read, not measured
    # another file of the same size with its mtime kept (cp -p, rsync -a): its own key, measured again
    stat = model.stat()
    model.write_bytes(b"b" * 64)
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert reach.reach_for(model, _measuring(calls))[0] == 1 and len(calls) == 4


@pytest.mark.parametrize("stored", [0, -5, True, "56", 1e9, 96])
def test_a_reach_out_of_range_is_ignored_measured_again_and_said_once(tmp_path, models_folder, stored):
    model = tmp_path / "net.onnx"
    model.write_bytes(b"net")
    digest = reach_cache.content_hash(model)
    _record(model).parent.mkdir(parents=True)
    _record(model).write_text(json.dumps({"sha256": digest, "reach": stored, **reach.RULES}))
    calls = []
    found, notes = reach.reach_for(model, _measuring(calls))
    assert found == 1 and len(calls) == 2
    assert len(notes) == 1 and notes[0].startswith("Ignored the cached reach") and "\n" not in notes[0]
    assert json.loads(_record(model).read_text())["reach"] == 1  # replaced by the measured figure


def _fifo(path):
    os.mkfifo(path)


def _dev_zero(path):
    os.symlink("/dev/zero", path)


def _deep_json(path):
    path.write_text("[" * 100_000 + "]" * 100_000)


def _nested_small(path):
    path.write_text("[" * 1500 + "]" * 1500)


def _huge(path):
    path.write_text(json.dumps({"reach": 40, "pad": "x" * 100_000}))


@pytest.mark.parametrize("make", [_fifo, _dev_zero, _deep_json, _nested_small, _huge])
def test_a_record_that_is_no_record_is_ignored_at_once(tmp_path, models_folder, make):
    model = tmp_path / "net.onnx"
    model.write_bytes(b"net")
    _record(model).parent.mkdir(parents=True)
    make(_record(model))
    calls = []
    found, notes = reach.reach_for(model, _measuring(calls))  # no hang on a FIFO, no MemoryError, no recursion
    assert found == 1 and len(calls) == 2 and len(notes) == 1


def test_an_explicit_tile_that_would_cost_more_than_twice_auto_is_raised_and_said(runtime, deep, models_folder):
    image = picture(120, 200)
    result = _run(runtime, image, deep, tile_size=80)
    said = [w for w in result.warnings if w.startswith("Tile size") and "would cost" in w]
    assert said and "raised to" in said[0] and "\n" not in said[0]
    assert result.plan["compute"] <= 2.0 * 1.1  # twice the staged auto plan (about 1.0x), at most
    kept = _run(runtime, image, deep, tile_size=400)
    assert not [w for w in kept.warnings if "would cost" in w]


def test_memory_other_processes_hold_never_changes_the_pixels(runtime, deep, models_folder, monkeypatch):
    """The same job under a simulated low available memory: the same pixels, or refused in one line
    (an explicit overlap below the radius: smaller windows would move its seams)."""
    from lean_image_ai.runtime.measure import budget

    wide = deep_sr_model(deep.parent / "wide.onnx", channels=32)  # its windows grow the arena measurably
    image = picture(120, 160)
    jobs = [{}, {"tile_size": 112, "overlap": 24}]
    before = [_run(runtime, image, wide, **job) for job in jobs]
    monkeypatch.setattr(budget, "available_system_memory_bytes", lambda: 4096)  # below any window's need
    for job, first in zip(jobs, before, strict=True):
        since = time.time()
        try:
            again = _run(runtime, image, wide, **job)
        except InferenceOutOfMemoryError as exc:
            assert len(str(exc).strip().splitlines()) == 1, str(exc)
        else:
            np.testing.assert_array_equal(again.image, first.image)
        if job:  # blended tiles: never a smaller window that moves the seams first (the old degrade split)
            assert not [e for e in runtime.events.recent() if e["event"] == "tile_split" and e["time"] >= since]
