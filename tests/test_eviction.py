"""Eviction from another thread while jobs run: a job finishes on the session it began with, the
session's memory goes when the last job using it ends, and a session dropped for good gives the
project's own readable error (real onnxruntime sessions, real threads)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.base import RunOptions
from lean_image_ai.runtime import Runtime, SessionClosedError
from onnx_builders import sr_model


@pytest.fixture
def model(tmp_path):
    return sr_model(tmp_path / "sr.onnx", scale=2)


def _frames(count=3):
    rng = np.random.default_rng(1)
    return [rng.random((40, 56, 3), dtype=np.float32) for _ in range(count)]


def test_tiled_multi_frame_jobs_survive_an_evicting_thread(model):
    runtime = Runtime()
    frames = _frames()
    reference = upscale.run(frames, model, options=RunOptions(device="cpu", runtime=runtime), tile_size=24, overlap=4)
    stop = threading.Event()
    evictions = 0

    def evict_forever():
        nonlocal evictions
        while not stop.is_set():
            runtime.clear("test: another thread")
            for handle in runtime.cached_sessions():
                runtime.evict(handle, "test: another thread")
            evictions += 1

    thread = threading.Thread(target=evict_forever, daemon=True)
    thread.start()
    failures = []
    try:
        for _ in range(30):
            try:
                results = upscale.run(
                    frames, model, options=RunOptions(device="cpu", runtime=runtime), tile_size=24, overlap=4
                )
            except Exception as exc:  # noqa: BLE001 - every failure is the finding
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            for got, want in zip(results, reference, strict=True):
                np.testing.assert_array_equal(got.image, want.image)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert failures == []
    assert evictions > 30, "the evicting thread really ran alongside the jobs"
    evicted_in_use = [e for e in runtime.events.recent("session_evict") if e.get("in_use")]
    assert evicted_in_use, "some evictions landed while a job was using the session"
    # the next job in the same process works and nothing stays loaded behind the cache's back
    runtime.clear("test end")
    upscale.run(frames[0], model, options=RunOptions(device="cpu", runtime=runtime), tile_size=None)


def test_evicted_session_is_kept_until_its_job_ends(model):
    runtime = Runtime()
    feed = {"input": np.zeros((1, 3, 16, 16), np.float32)}
    with runtime.operation("job") as op:
        handle = op.session(model, "cpu")
        op.run(handle, feed, last=False)
        runtime.clear("another thread")
        assert runtime.cached_sessions() == [] and handle.evicted
        assert handle.session is not None, "the job is still using it"
        assert op.session(model, "cpu") is handle, "the job finishes on the session it began with"
        op.run(handle, feed, last=True)
    assert handle.session is None, "its memory went when the job ended"
    assert runtime.events.recent("session_closed")[-1]["model"] == "sr.onnx"
    with runtime.operation("next") as op:  # the next job loads it anew
        fresh = op.session(model, "cpu")
        assert fresh is not handle
        op.run(fresh, feed, last=True)


def test_a_session_dropped_for_good_gives_a_readable_error(model):
    runtime = Runtime()
    handle = runtime.session(model, "cpu")  # held by no job
    runtime.evict(handle, "user request")
    with pytest.raises(SessionClosedError) as info, runtime.operation("late job") as op:
        op.run(handle, {"input": np.zeros((1, 3, 8, 8), np.float32)}, last=True)
    msg = str(info.value)
    assert "sr.onnx" in msg and "user request" in msg
    assert "nothing was written" in msg and "Run the job again" in msg


def test_out_of_memory_frees_the_session_before_its_replacement_loads(tmp_path):
    """A real BFCArena out-of-memory (capped shared CPU arena, own process) in the middle of a
    tiled upscale: when the tiler asks for the replacement session, the failed one's weights and
    the arena regions its run grew must already be gone. Before the fix the error's traceback kept
    the session (and its arena) alive until the caller's `except` ended, where the replacement
    was loaded: RSS at the second load was above the first session's loaded level."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from builders_upscale import heavy_sr_model

    model = heavy_sr_model(tmp_path / "heavy.onnx", weights_mib=64)
    job = Path(__file__).resolve().parent / "oom_free_job.py"
    # 16 MiB cap: the 384 px window's 32-channel intermediate (18 MiB) cannot fit, 96 px tiles do
    done = subprocess.run(
        [sys.executable, str(job), str(model), str(16 << 20), "384"], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["oom_events"] >= 1 and report["splits"] == report["oom_events"]
    assert report["shape"] == [768, 768, 3] and report["finite"]
    first, second = report["loads"][0], report["loads"][1]
    loaded = first["after"] - first["before"]  # what the first session (64 MiB of weights) added
    # still held at the moment the replacement is asked for, as a share of that
    held = (second["before"] - first["before"]) / loaded
    assert held < 0.5, f"{held:.2f} of the failed session's memory was still held at re-acquire"
