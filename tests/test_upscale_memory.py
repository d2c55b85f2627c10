"""models/adapters/upscale/ and models/tiles/tiling.py: results too big for memory are refused before any run;
outputs are written into the job's own buffers from the very first run (real onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.adapters.upscale import job as upscale_job
from lean_image_ai.models.adapters.upscale.runs import learned_scale
from lean_image_ai.models.tiles import tiling
from lean_image_ai.models.tiles.tile_memory import refuse_oversized_result
from lean_image_ai.models.tiles.tile_plan import TilePlan
from lean_image_ai.runtime import Runtime
from lean_image_ai.runtime.errors import InvalidImageError
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import save_model, sr_model
from recording import cpu_options as opts


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("upscale-memory-models")
    return {
        "x4": sr_model(folder / "sr4.onnx", scale=4, mid_channels=8, seed=2),
        "to64": _resize_to_64(folder / "to64.onnx"),
    }


def _resize_to_64(path):
    """Resize to max(side, 64) per side, the size computed from the input's shape: for inputs up to
    64 px its integer factor depends on the input size (16 px: x4, 32 px: x2), and neither the
    graph walk nor onnxruntime can know the output size beforehand (declared and reported
    dynamic)."""
    consts = [
        numpy_helper.from_array(np.array([2], np.int64), "two"),
        numpy_helper.from_array(np.array([4], np.int64), "four"),
        numpy_helper.from_array(np.array([64, 64], np.int64), "floor"),
        numpy_helper.from_array(np.array([1, 3], np.int64), "batch_channels"),
    ]
    nodes = [
        helper.make_node("Shape", ["input"], ["shape"]),
        helper.make_node("Slice", ["shape", "two", "four"], ["hw"]),
        helper.make_node("Max", ["hw", "floor"], ["out_hw"]),
        helper.make_node("Concat", ["batch_channels", "out_hw"], ["sizes"], axis=0),
        helper.make_node("Resize", ["input", "", "", "sizes"], ["output"], mode="nearest"),
    ]
    graph = helper.make_graph(
        nodes,
        "to64",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, "OH", "OW"])],
        consts,
    )
    return save_model(graph, path)


def picture(height, width, channels=3, seed=0):
    return np.random.default_rng(seed).random((height, width, channels), dtype=np.float32)


def _result_bytes(height, width, scale, channels=3):
    return height * scale * width * scale * channels * np.dtype(np.float32).itemsize


def test_a_result_bigger_than_the_memory_available_is_refused_before_any_run(recorded, models):
    runtime, factory = recorded
    need = _result_bytes(48, 64, 4)
    with pytest.raises(InvalidImageError) as info:
        upscale.run(picture(48, 64), models["x4"], options=opts(runtime), available_memory_bytes=need - 1)
    message = str(info.value)
    assert "64x48" in message and "x4" in message and "256x192" in message, message
    assert "smaller scale" in message and "smaller image" in message, message
    assert factory.runs == [], "refused before the model ran at all"
    # exactly enough memory: it runs
    result = upscale.run(picture(48, 64), models["x4"], options=opts(runtime), available_memory_bytes=need)
    assert result.image.shape == (192, 256, 3)


def test_the_refusal_reads_the_os_figure_by_default(recorded, models, monkeypatch):
    runtime, factory = recorded
    need = _result_bytes(40, 30, 4, channels=4)  # the alpha channel counts too
    # a stand-in for the OS's figure: just short of what this image's RGBA result needs
    monkeypatch.setattr(upscale_job, "available_system_memory_bytes", lambda: need - 1)
    with pytest.raises(InvalidImageError, match="smaller image"):
        upscale.run(picture(40, 30, channels=4), models["x4"], options=opts(runtime))
    assert factory.runs == []
    monkeypatch.setattr(upscale_job, "available_system_memory_bytes", lambda: None)  # unknown: no refusal
    assert upscale.run(picture(40, 30, channels=4), models["x4"], options=opts(runtime)).image.shape == (160, 120, 4)


def test_a_scale_unknown_before_the_first_run_is_refused_before_the_result_is_allocated():
    calls = []

    def run_tile(window, last):
        calls.append(window.shape)
        return np.zeros((window.shape[0] * 3, window.shape[1] * 3, 3), np.float32)

    need = _result_bytes(20, 20, 3)
    with pytest.raises(InvalidImageError, match="60x60"):
        tiling.run_tiled(picture(20, 20), tiling.TiledRun(run_tile, TilePlan(None), available_memory=need - 1))
    assert len(calls) == 1, "one run taught the scale; nothing was allocated for the result"
    refuse_oversized_result(20, 20, 3, 3, label="m", available=need)  # fits: no error


def test_the_first_run_of_a_job_already_writes_into_the_jobs_own_buffer(models, monkeypatch):
    """The scale comes from the graph before any output is seen, so even a fresh session's first
    run is bound: no output left in the arena, so no release run of its own after the job."""
    runtime = Runtime()
    probes = []
    monkeypatch.setattr(runtime, "release_cpu_arena", lambda: probes.append(1) or True)
    try:
        result = upscale.run(picture(20, 24), models["x4"], options=opts(runtime), tile_size=None)
        assert result.scale == 4 and probes == []
        assert [e["in_run"] for e in runtime.events.recent("memory_release")] == [True]
    finally:
        runtime.clear("test teardown")


def test_a_scale_that_changes_with_the_input_size_is_learned_again(recorded, models):
    runtime, factory = recorded
    kwargs = {"tile_size": None, "model_overlap": 0}  # no impulse probe: only the image's own runs
    first = upscale.run(picture(32, 32), models["to64"], options=opts(runtime), **kwargs)
    assert first.scale == 2 and first.image.shape == (64, 64, 3)
    # the session showed x2; a 16 px input gives x4: the bound run fails, an unbound one teaches it
    second = upscale.run(picture(16, 16, seed=1), models["to64"], options=opts(runtime), **kwargs)
    assert second.scale == 4 and second.image.shape == (64, 64, 3)
    assert [r["ok"] for r in factory.runs] == [True, False, True], "bound with x2, failed, ran unbound"
    source = np.clip(picture(16, 16, seed=1), 0, 1)
    np.testing.assert_array_equal(second.image, np.repeat(np.repeat(source, 4, axis=0), 4, axis=1))


def test_the_learned_scale_is_the_sessions_and_goes_when_it_is_evicted(recorded, models):
    """What a session showed is kept by the upscale for that session (upscale/runs.py learned_scale,
    not on the runtime's handle): the next job on the same cached session binds with it, and a
    session loaded again after an eviction starts without it (a module-wide table keyed by the
    cache key outlived its session and fed the new one a stale scale)."""
    runtime, factory = recorded
    kwargs = {"tile_size": None, "model_overlap": 0}  # no impulse probe: only the image's own runs
    upscale.run(picture(32, 32), models["to64"], options=opts(runtime), **kwargs)
    (handle,) = runtime.cached_sessions()
    assert learned_scale(handle) == 2 and not hasattr(handle, "output_scale"), "the first run taught x2"
    upscale.run(picture(32, 32, seed=1), models["to64"], options=opts(runtime), **kwargs)
    assert factory.runs[-1]["ok"] and len(factory.runs) == 2, "the second job bound with x2 at once"
    runtime.evict(handle, "test: the session goes")
    second = upscale.run(picture(16, 16, seed=2), models["to64"], options=opts(runtime), **kwargs)
    (fresh,) = runtime.cached_sessions()
    assert fresh is not handle and second.scale == 4 and learned_scale(fresh) == 4
    assert [r["ok"] for r in factory.runs[2:]] == [True], "no failed run bound with the evicted session's x2"
