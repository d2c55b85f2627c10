"""Issue 11, bpy-free: the job's memory report (grew / gave back / kept / floors, no arrow),
Release now vs Unload all, idle unload, the leak check both ways. Real onnxruntime on CPU, whose
shared arena stands in for the GPU's; figures compared only with others from the same run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from lean_image_ai.models.leak_request import repeatable_run
from lean_image_ai.runtime import Runtime, mark_last
from lean_image_ai.runtime.measure.leak_check import analyse, leak_check
from lean_image_ai.runtime.measure.memory_report import format_freed, format_job_memory, job_figures
from onnx_builders import conv_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conv_model(tmp_path_factory.mktemp("models") / "conv.onnx")


def job(runtime, model, size=256, runs=3):
    with runtime.operation("governed") as op:
        handle = op.session(model, "cpu")
        for _, last in mark_last(range(runs)):
            op.run(handle, {"x": np.ones((1, 3, size, size), np.float32)}, last=last)
    return op


def test_the_report_splits_load_runs_release_and_floors(conv):
    runtime = Runtime()
    op = job(runtime, conv)
    report = op.memory
    assert report is runtime.last_job_memory and runtime.events.recent("job_memory")[-1]["lines"] == report["lines"]
    (ram,) = report["figures"]
    assert ram["figure"] == "ram" and report["loaded_models"][-1] == "conv.onnx"
    # the identities the wording rests on: grew = gave back + kept; the floors add up to what stays
    assert ram["grew"] == ram["gave_back"] + ram["kept"] - ram["load_given_back"]
    assert sum(v for _, v in ram["floors"] if v is not None) == ram["after"]
    assert ram["grew"] >= 0 and ram["gave_back"] >= 0  # (in a fresh process both are well above 0)
    text = "\n".join(report["lines"])
    assert "->" not in text and "→" not in text, "never one arrow across a model load"
    for words in ("the runs grew", "the release gave back", "what stays", "runtime/libraries",
                  "model weights (1 cached session, as the model files hold them)", "kept by the runtime", "rest of the process",
                  "live tensors", "reserved by the runtime and given back", "the OS sees (RSS)"):
        assert words in text, words
    # the second job loads nothing: its report has no load, and the same session is counted once
    again = job(runtime, conv)
    assert again.memory["loaded_models"] == [] and again.memory["figures"][0]["loaded"] == 0
    assert "model weights (1 cached session, as the model files hold them)" in "\n".join(again.memory["lines"])
    # the timeline: before, one mark per run, the release, after
    labels = [label for _, label, _ in runtime.last_timeline["marks"]]
    assert labels == ["before", "run 1", "run 2", "run 3", "release", "after"]


def test_the_figures_of_a_gpu_job_from_recorded_nvml_values():
    """NVML is absent here: these are the fields nvmlDeviceGetMemoryInfo / ...RunningProcesses
    give (bytes), recorded as numbers; the wording and the identities are what is checked."""
    gib = 2**30
    vram = job_figures("vram", before=1 * gib, loaded=gib // 2, peak=3 * gib, after=2 * gib,
                       library=gib // 4, weights=gib // 2, cached_sessions=1)
    assert vram["grew"] == 3 * gib - 3 * gib // 2 and vram["gave_back"] == gib and vram["kept"] == gib // 2
    lines = format_job_memory({"operation": "depth", "outcome": "success", "devices": ["CUDA:0"],
                               "loaded_models": ["da3.onnx"], "released": True, "live_output_bytes": 0,
                               "figures": [vram]})
    assert "GPU memory of this process (NVML, what the driver sees):" in lines[1]
    assert "the driver sees (NVML) 2048 MiB" in lines[-1]


def test_release_now_keeps_sessions_and_unload_all_drops_them(conv):
    runtime = Runtime(settings=None)
    runtime.configure(release_memory=False)  # the job leaves its arena grown, so there is something to release
    op = job(runtime, conv, size=384)
    handle = next(iter(runtime.cached_sessions()))
    released = runtime.release_now()
    assert runtime.cached_sessions() == [handle] and handle.session is not None and not handle.evicted
    assert released["sessions"] == 0 and released["by"]["ram"] is not None
    assert op.memory["released"] is False
    unloaded = runtime.unload()
    assert unloaded["sessions"] == 1 and runtime.cached_sessions() == [] and handle.evicted
    assert format_freed("Unload all", unloaded).startswith("Unload all freed process RAM ")
    assert [e["action"] for e in runtime.events.recent("memory_freed")] == ["release now", "unload all"]


def test_unload_one_device_leaves_the_others(conv, tmp_path):
    runtime = Runtime()
    cpu = runtime.session(conv, "cpu")
    assert runtime.unload(device="CUDA:1")["sessions"] == 0 and runtime.cached_sessions() == [cpu]
    assert runtime.unload(device=cpu.device_label)["sessions"] == 1


def test_idle_unload_drops_only_sessions_unused_long_enough(conv, tmp_path):
    runtime = Runtime()
    old = runtime.session(conv, "cpu")
    fresh = runtime.session(conv_model(tmp_path / "other.onnx", mid_channels=4), "cpu")
    old.last_used -= 600
    assert runtime.unload_idle(0) == []  # 0 keeps everything
    assert runtime.unload_idle(300) == [old]
    assert runtime.cached_sessions() == [fresh] and old.evicted
    assert runtime.events.recent("session_evict")[-1]["reason"] == "idle"


def test_a_run_refreshes_last_used(conv):
    runtime = Runtime()
    job(runtime, conv, size=32, runs=1)
    handle = runtime.cached_sessions()[0]
    handle.last_used -= 600
    job(runtime, conv, size=32, runs=1)
    assert runtime.unload_idle(300) == []


def test_leak_check_says_stable_for_the_real_runtime_over_30_runs():
    result = leak_check(repeatable_run("upscale", device="cpu", runtime=Runtime()), runs=30)
    assert result.verdict == "stable", (result.summary(), result.samples)


LEAKING_JOB = """
import json
from lean_image_ai.models.leak_request import repeatable_run
from lean_image_ai.runtime import Runtime
from lean_image_ai.runtime.measure.leak_check import leak_check

kept = []
real = repeatable_run("upscale", device="cpu", runtime=Runtime(), size=(192, 256))

def leaking():  # the stand-in: the same request, but every run's result stays referenced
    kept.append(real())

result = leak_check(leaking, runs=30)
first = kept[0][0] if isinstance(kept[0], list) else kept[0]
print(json.dumps({"verdict": result.verdict, "growing": result.growing, "summary": result.summary(),
                  "slope": result.slopes.get("ram"), "per_run": getattr(first, "image", None).nbytes}))
"""


def test_leak_check_says_growing_for_a_job_that_keeps_each_result():
    # a fresh process: in the test process, memory freed by earlier tests hides the growth
    import json

    proc = subprocess.run([sys.executable, "-c", LEAKING_JOB], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["verdict"] == "growing" and result["growing"] == ["ram"], result["summary"]
    assert result["summary"].startswith("growing: process RAM grows ")
    assert 0.5 * result["per_run"] < result["slope"] < 3 * result["per_run"]  # about what each run keeps


def test_a_single_step_is_not_a_leak():
    base = [100 << 20] * 30
    stepped = base[:15] + [(104 << 20)] * 15
    assert analyse({"ram": stepped}).verdict == "stable"
    ramp = [(100 << 20) + i * (1 << 20) for i in range(30)]
    assert analyse({"ram": ramp}).verdict == "growing"


def test_cli_leak_check_last_line():
    proc = subprocess.run([sys.executable, "-m", "lean_image_ai", "leak-check", "--runs", "60", "--device", "cpu"],
                          capture_output=True, text=True, timeout=180, cwd=REPO.parent)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines[-1] == "stable", proc.stdout + proc.stderr
    assert sum(line.startswith("  run ") for line in lines) == 60


def test_budget_decisions_in_a_fresh_process():
    """The budget reads this process's RSS: memory left free by earlier tests in a shared test
    process would stand in for what the job needs, so its decisions are checked in a fresh one."""
    import os

    env = {**os.environ, "LEAN_IMAGE_AI_BUDGET_TEST": "1"}
    test = f"{__file__}::test_budget_remembers_working_memory_then_releases_evicts_lru_and_refuses"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=--import-mode=importlib", "-q", test], capture_output=True, text=True, timeout=300, env=env, cwd=REPO
    )
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.mark.skipif(not __import__("os").environ.get("LEAN_IMAGE_AI_BUDGET_TEST"), reason="runs in its own process")
def test_budget_remembers_working_memory_then_releases_evicts_lru_and_refuses(conv, tmp_path):
    from lean_image_ai.runtime.measure import budget
    from lean_image_ai.runtime.measure.memory import process_rss_bytes

    runtime = Runtime()
    shapes = [(1, 3, 256, 256)]
    first = budget.check(runtime, conv, shapes, budget=None)
    assert first.fits and not first.working_known, "an unmeasured shape is said to be unknown"
    job(runtime, conv, size=256)
    grew = runtime.working_memory[("conv.onnx", tuple(shapes))]
    assert grew == runtime.last_job_memory["figures"][0]["grew"] >= 0
    older = runtime.session(conv_model(tmp_path / "older.onnx", mid_channels=4), "cpu")
    newer = runtime.session(conv_model(tmp_path / "newer.onnx", mid_channels=4), "cpu")
    older.last_used, newer.last_used = 1.0, 2.0
    roomy = budget.check(runtime, conv, shapes, budget=process_rss_bytes() + 4 * max(grew, first.needed))
    assert roomy.fits and roomy.working_known and roomy.actions == [] and len(runtime.cached_sessions()) == 3
    tight = budget.check(runtime, conv, shapes, budget=process_rss_bytes())  # no room at all
    assert not tight.fits
    assert tight.actions == ["releasing arenas", "unloading older.onnx (least recently used)",
                             "unloading newer.onnx (least recently used)"]
    assert [h.model_name for h in runtime.cached_sessions()] == ["conv.onnx"], "never the needed session"
    assert tight.message().startswith("Not enough memory: this job needs about ")
