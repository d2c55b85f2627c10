"""bench/gpu_release.py, the device check, exercised here without a GPU: its CPU dry run (the CPU
arena standing in, real onnxruntime, every child process) must produce its JSON line with sane
relations, and the real mode must refuse plainly, exit non-zero, and never report zeros."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_release.py"


def test_dry_run_exercises_every_check_and_its_figures_hold_together():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run-cpu", "--jobs", "frames"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["mode"] == "dry-run-cpu" and figures["ok"] and figures["failures"] == []
    assert set(figures) >= {"floors", "release", "identical_on_vs_off", "oom", "device_index", "workspace", "seconds"}
    floors = figures["floors"]
    assert set(floors) == {"context_mb", "weights_mb", "libraries_mb", "weights_file_mb"}
    # the weights floor is the model's weights: within half of the file's size either way
    assert 0.5 < floors["weights_mb"] / floors["weights_file_mb"] < 1.5
    release = figures["release"]
    assert set(release) == {f"frames_{e}_{m}" for e in ("success", "cancel") for m in ("on", "off")}
    for ending in ("success", "cancel"):
        on, off = release[f"frames_{ending}_on"], release[f"frames_{ending}_off"]
        # a CPU session is never evicted by the release: a kept figure, not an eviction label
        assert not on["evicted"] and not off["evicted"]
        # RSS moves by a fraction of a MiB on its own: a cancelled 128 px job keeps next to nothing
        # either way, so only the successful job is held to a strict comparison
        slack = 0.0 if ending == "success" else 0.5
        assert on["kept_above_floor_mb"] <= off["kept_above_floor_mb"] + slack
        assert on["kept_above_floor_mb"] <= on["peak_above_floor_mb"] + 0.5
    assert release["frames_success_on"]["run_after_shrink_ok"] is True
    assert release["frames_success_on"]["run_after_shrink_reloaded"] is False
    assert release["frames_success_on"]["output_sha256"] and figures["identical_on_vs_off"] == {"frames": True}
    oom = figures["oom"]
    assert oom["resource"] == "system memory" and oom["evicted"] and "Available memory of" in oom["detail"]
    assert oom["after_eviction_below_loaded_mb"] > 0  # the weights went at the eviction
    index = figures["device_index"]
    assert index["device_honoured"] and index["entry_sent"] == "cpu:0" and index["not_found_text"]
    assert set(figures["workspace"]) == {"EXHAUSTIVE_1", "EXHAUSTIVE_0", "HEURISTIC_0"}
    assert {w["applies"] for w in figures["workspace"].values()} == {False}  # no cuDNN on CPU


def test_real_mode_without_a_gpu_exits_non_zero_and_says_why():
    if "CUDAExecutionProvider" in ort.get_available_providers():
        from lean_image_ai.runtime.measure.memory import nvidia_gpu_count

        if nvidia_gpu_count():
            pytest.skip("a GPU is here: the real check would run")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "cannot check on a GPU here" in done.stderr
    assert "CUDAExecutionProvider" in done.stderr or "NVML" in done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["ok"] is False and figures["error"] and "release" not in figures
