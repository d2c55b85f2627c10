"""Asking for CUDA where it cannot start (real onnxruntime-gpu, no GPU here): onnxruntime's own log
is kept in the event log and `doctor`, never printed raw; one warning per job; no raw JSON event
line; and the CPU fallback gives its arena back like a CPU job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest
from lean_image_ai.runtime.log import native_log

REPO = Path(__file__).resolve().parents[1]


def _cli(tmp_path, *argv):
    env = dict(os.environ, LEAN_IMAGE_AI_LOG_DIR=str(tmp_path / "logs"))
    env["PYTHONPATH"] = str(REPO.parent) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "lean_image_ai", *argv], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )


@pytest.fixture(scope="module")
def no_cuda():
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime build does not offer CUDA")
    if (Path(ort.__file__).resolve().parents[1] / "nvidia").is_dir():
        pytest.skip("NVIDIA's CUDA wheels are installed here: CUDA may start")


def test_cuda_fallback_job_is_quiet_warns_once_and_releases(no_cuda, tmp_path):
    done = _cli(tmp_path, "upscale", "--device", "cuda:0")  # the demo image, written into tmp_path
    assert done.returncode == 0, done.stderr[-3000:]
    console = done.stdout + done.stderr
    if "CUDA was requested" not in console:
        pytest.skip("CUDA started on this machine: no fallback to observe")
    assert ":onnxruntime:" not in console, console[:3000]  # no raw [E:onnxruntime...] line
    assert not any(line.startswith('{"event"') for line in console.splitlines()), console[:3000]
    warnings = [line for line in console.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "CUDA was requested" in warnings[0], warnings
    assert "memory of upscale (success, CPU)" in done.stdout
    assert "the release gave back" in done.stdout and "no release" not in done.stdout
    events = [json.loads(line) for line in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    said = [e for e in events if e["event"] == "onnxruntime_log"]
    assert said and any("Failed to load library" in line for e in said for line in e["lines"])
    assert [e["event"] for e in events].count("provider_fallback") == 1


def test_doctor_keeps_onnxruntimes_lines_in_its_report(no_cuda, tmp_path):
    done = _cli(tmp_path, "doctor")
    assert ":onnxruntime:" not in done.stdout + done.stderr
    if "CUDA session: fell back" not in done.stdout:
        pytest.skip("CUDA started on this machine")
    report = done.stdout.split("onnxruntime said:")[1]
    assert "Failed to create CUDAExecutionProvider" in report


def test_captured_keeps_ort_lines_and_passes_others_on(capfd):
    with native_log.captured() as lines:
        os.write(2, b"\x1b[1;31m2026-12-01 21:27:20.68 [E:onnxruntime:Default, x.cc:1 f] Failed: thing\n\x1b[m\n")
        os.write(2, b"some other library's message\n")
    assert lines == ["Failed: thing"]
    assert capfd.readouterr().err == "some other library's message\n"
