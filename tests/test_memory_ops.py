"""operators/memory_ops.py with real bpy: Release now keeps the session objects, Unload all drops
them, both report what they freed; idle unload's timer (off in background mode, re-armed only
while sessions are cached); the leak check operator."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402
import onnx_builders as ob  # noqa: E402

bpy = pytest.importorskip("bpy")
memory_ops = bh.import_submodule("operators.memory_ops")
prefs = bh.import_submodule("operators.prefs")
jobs = bh.import_submodule("operators.jobs")
from lean_image_ai.runtime import get_runtime, mark_last  # noqa: E402


@pytest.fixture
def runtime():
    with bh.registered_addon():
        rt = get_runtime()
        rt.clear("test setup")
        yield rt
        rt.clear("test teardown")


def grown_job(runtime, model):
    runtime.configure(release_memory=False)
    try:
        with runtime.operation("grow") as op:
            handle = op.session(model, "cpu")
            for _, last in mark_last(range(2)):
                op.run(handle, {"x": np.ones((1, 3, 320, 320), np.float32)}, last=last)
    finally:
        runtime.configure(release_memory=True)
    return handle


def test_release_now_keeps_the_session_and_unload_all_drops_it(runtime, tmp_path):
    handle = grown_job(runtime, ob.conv_model(tmp_path / "conv.onnx"))
    assert bpy.ops.lean_image_ai.release_memory() == {"FINISHED"}
    assert runtime.cached_sessions() == [handle] and handle.session is not None
    released = runtime.events.recent("memory_freed")[-1]
    assert released["action"] == "release now" and released["sessions"] == 0 and released["by"]["ram"] is not None
    assert bpy.ops.lean_image_ai.unload_all() == {"FINISHED"}
    assert runtime.cached_sessions() == [] and handle.evicted and handle.session is None
    assert runtime.events.recent("memory_freed")[-1]["sessions"] == 1


def test_both_refuse_while_a_job_runs(runtime, tmp_path):
    runtime.session(ob.conv_model(tmp_path / "conv.onnx", mid_channels=4), "cpu")
    saved = jobs.manager.current
    jobs.manager.current = jobs.Job("Depth")
    try:
        for op in (bpy.ops.lean_image_ai.release_memory, bpy.ops.lean_image_ai.unload_all):
            with pytest.raises(RuntimeError, match="'Depth' is using the loaded models"):
                op()
        assert len(runtime.cached_sessions()) == 1
    finally:
        jobs.manager.current = saved


def test_idle_unload_timer(runtime, tmp_path, monkeypatch):
    monkeypatch.setattr(prefs, "get_prefs", lambda context=None: prefs.DefaultPreferences(idle_unload_minutes=5))
    assert bpy.app.background
    assert memory_ops.arm_idle_unload() is False, "off in background mode"
    assert memory_ops.idle_tick() is None, "nothing cached: the timer stops"
    handle = runtime.session(ob.conv_model(tmp_path / "conv.onnx", mid_channels=4), "cpu")
    wait = memory_ops.idle_tick()
    assert wait is not None and 1.0 <= wait <= memory_ops.IDLE_CHECK_MAX_S, "re-armed while a session is cached"
    assert runtime.cached_sessions() == [handle]
    handle.last_used = time.time() - 301
    assert memory_ops.idle_tick() is None and handle.evicted and runtime.cached_sessions() == []
    monkeypatch.setattr(prefs, "get_prefs", lambda context=None: prefs.DefaultPreferences(idle_unload_minutes=0))
    runtime.session(ob.conv_model(tmp_path / "conv.onnx", mid_channels=4), "cpu")
    assert memory_ops.idle_tick() is None, "0 minutes: keep, and no timer"


def test_the_job_engine_arms_idle_unload_after_each_job(runtime):
    assert memory_ops._after_job in jobs.manager.on_end


def test_leak_check_operator(runtime):
    assert bpy.ops.lean_image_ai.leak_check(runs=10) == {"FINISHED"}
