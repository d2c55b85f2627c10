"""Issue 11, the budget acting before a job (runtime/measure/budget.py), bpy-free.

Real CPU sessions with the RAM budget set low relative to a figure measured in the same process
(the budget reads this process's RSS, so those tests run in a fresh process each: memory left
free by earlier tests would stand in for what a job needs). The GPU path uses NVML figures
recorded per loaded model (no GPU here): the stand-in pynvml records what NVML was asked.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.base import RunOptions
from lean_image_ai.runtime import Runtime, RuntimeSettings, core, mark_last
from lean_image_ai.runtime.errors import MemoryBudgetError
from lean_image_ai.runtime.measure import memory
from lean_image_ai.runtime.measure.budget import WHAT_TO_DO
from lean_image_ai.runtime.measure.memory import process_rss_bytes
from onnx_builders import conv_model, sr_model
from recording import CPU, RecordingFactory

FRESH = "LEAN_IMAGE_AI_BUDGET_FRESH"
fresh_only = pytest.mark.skipif(not os.environ.get(FRESH), reason="runs in its own process (see the module doc)")


def run_fresh(name: str) -> None:
    test = f"{__file__}::{name}"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=--import-mode=importlib", "-q", test],
        capture_output=True, text=True, timeout=300, env={**os.environ, FRESH: "1"}, cwd=Path(__file__).parents[1],
    )
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.parametrize("name", ["upscale_degrades_to_smaller_tiles_with_the_same_bytes",
                                  "lru_sessions_go_first_then_a_plain_job_is_refused"])
def test_in_a_fresh_process(name):
    run_fresh(f"test_{name}")


def card(size):
    return (np.random.default_rng(0).random((size, size, 3)) * 255).astype(np.uint8)


@fresh_only
def test_upscale_degrades_to_smaller_tiles_with_the_same_bytes(tmp_path):
    runtime = Runtime()
    model = sr_model(tmp_path / "sr.onnx", scale=2, mid_channels=32)
    image = card(384)
    options = RunOptions(device="cpu", runtime=runtime)
    whole = upscale.run(image, model, options=options, tile_size=None)  # one window: measured
    measured = runtime.working_memory[("sr.onnx", ((1, 3, 384, 384),))]
    assert measured > 0 and not whole.warnings
    # room for half of what the measured window needs: the window is refused before it runs,
    # the tiler plans smaller tiles (their need scaled from the measured one) and those fit
    runtime.configure(ram_budget_bytes=process_rss_bytes() + measured // 2)
    mark = len(runtime.events.recent())
    tiled = upscale.run(image, model, options=options, tile_size=None)
    assert np.array_equal(tiled.image, whole.image), "smaller tiles, overlap >= radius: the same bytes"
    assert tiled.tile_size_used < 384
    assert tiled.warnings and tiled.warnings[0].startswith("Memory budget: tiles were made smaller 1 time(s)")
    events = runtime.events.recent()[mark:]
    budget = [e for e in events if e["event"] == "budget"]
    assert budget[0]["fits"] is False and budget[0]["actions"][0] == "releasing arenas"
    (split,) = [e for e in events if e["event"] == "tile_split"]
    assert split["reason"] == "memory_budget" and split["old_tile_size"] == 384
    report = runtime.last_job_memory
    assert report["outcome"] == "success"
    (note,) = report["budget"]
    assert note.startswith("a 1x3x384x384 run of sr.onnx needed about ") and "(measured for this input size)" in note
    assert note.endswith("still short: not run at that size") and f"  budget: {note}" in report["lines"]


@fresh_only
def test_lru_sessions_go_first_then_a_plain_job_is_refused(tmp_path):
    runtime = Runtime()
    model = conv_model(tmp_path / "conv.onnx")
    feeds = {"x": np.ones((1, 3, 256, 256), np.float32)}
    with runtime.operation("measure") as op:
        handle = op.session(model, "cpu")
        op.run(handle, feeds, last=True)
    measured = runtime.working_memory[("conv.onnx", ((1, 3, 256, 256),))]
    assert measured > 0
    older = runtime.session(conv_model(tmp_path / "older.onnx", mid_channels=4), "cpu")
    newer = runtime.session(conv_model(tmp_path / "newer.onnx", mid_channels=4), "cpu")
    older.last_used, newer.last_used = 1.0, 2.0  # older is the least recently used
    reports = len(runtime.events.recent("job_memory"))
    # no room at all (half the process: what a release gives back can't make room); a job takes
    # its budgets when it starts (the runtime's settings here: the job brings none of its own)
    runtime.configure(ram_budget_bytes=process_rss_bytes() // 2)
    with pytest.raises(MemoryBudgetError) as refused, runtime.operation("refused") as op:
        handle = op.session(model, "cpu")  # loaded already: only the run is checked
        op.run(handle, feeds, last=True)
    assert op.runs == 0, "refused before the run"
    budget = runtime.events.recent("budget")[-1]
    assert budget["actions"] == ["releasing arenas", "unloading older.onnx (least recently used)",
                                 "unloading newer.onnx (least recently used)"]
    assert [h.model_name for h in runtime.cached_sessions()] == ["conv.onnx"], "never the job's own session"
    message = str(refused.value)
    assert message.startswith("Not enough memory: a 1x3x256x256 run of conv.onnx on CPU needs about ")
    # releasing gave a little back (the C heap's free pages), never the 12 MB the run needs
    assert re.search(r"\(measured for this input size\) but only \d+ [KM]iB free under the ", message), message
    assert "this process uses" in message and message.endswith(WHAT_TO_DO)
    report = runtime.last_job_memory
    assert report["outcome"] == "over_budget" and len(runtime.events.recent("job_memory")) == reports + 1
    # a model that is not loaded yet is refused before its weights are
    created = runtime.sessions_created
    with pytest.raises(MemoryBudgetError, match=r"loading other\.onnx on cpu needs about .* \(its file's size\)"):
        with runtime.operation("refused load") as op:
            op.session(conv_model(tmp_path / "other.onnx"), "cpu")
    assert runtime.sessions_created == created


# ---- the GPU path: NVML figures recorded per loaded model ---------------------------------------

MIB = 1 << 20
IDLE_H200 = {"total": 150754820096, "used": 644939776}  # nvmlDeviceGetMemoryInfo on an idle H200
CONTEXT = 517 * MIB  # what a CUDA context with cuDNN/cuBLAS handles adds to this process
PER_MODEL = {"a.onnx": 900 * MIB, "b.onnx": 700 * MIB, "c.onnx": 300 * MIB}  # this process, per session


class RecordedNvml(SimpleNamespace):
    """pynvml as NVML answers on that H200: the process's figure is the context plus what each
    cached session's model added, as recorded; every call is kept with its arguments."""

    def __init__(self, runtime):
        super().__init__(calls=[], runtime=runtime)

    def _process_bytes(self):
        cached = [h for h in self.runtime.cached_sessions() if h.gpu_device_id == 0]
        return CONTEXT + sum(PER_MODEL.get(h.model_name, 0) for h in cached)

    def nvmlInit(self):
        self.calls.append(("nvmlInit",))

    def nvmlDeviceGetCount(self):
        self.calls.append(("nvmlDeviceGetCount",))
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        self.calls.append(("nvmlDeviceGetHandleByIndex", index))
        return ("handle", index)

    def nvmlDeviceGetPciInfo(self, handle):  # how the runtime finds CUDA device 0 (runtime/cuda/gpu_index.py)
        self.calls.append(("nvmlDeviceGetPciInfo", handle))
        return SimpleNamespace(busId=b"00000000:19:00.0")  # NVML's format; this one bus id is made up

    def nvmlDeviceGetUUID(self, handle):
        self.calls.append(("nvmlDeviceGetUUID", handle))
        return "GPU-00000000-0000-0000-0000-000000000000"  # format only: not a real device's

    def nvmlDeviceGetName(self, handle):
        self.calls.append(("nvmlDeviceGetName", handle))
        return "NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle):
        self.calls.append(("nvmlDeviceGetMemoryInfo", handle))
        used = IDLE_H200["used"] + self._process_bytes()
        return SimpleNamespace(total=IDLE_H200["total"], used=used, free=IDLE_H200["total"] - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self.calls.append(("nvmlDeviceGetComputeRunningProcesses", handle))
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=self._process_bytes())]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        self.calls.append(("nvmlDeviceGetGraphicsRunningProcesses", handle))
        return []


@pytest.fixture
def gpu_runtime(monkeypatch):
    factory = RecordingFactory(reported_providers=["CUDAExecutionProvider", CPU],
                               reported_options={"CUDAExecutionProvider": {"device_id": "0"}})
    runtime = Runtime(RuntimeSettings(), session_factory=factory, available_providers=lambda: ["CUDAExecutionProvider", CPU])
    nvml = RecordedNvml(runtime)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(memory, "_nvml_state", {"initialised": False, "error": None})
    monkeypatch.setattr(core, "visible_cuda_count", lambda: 1)
    yield runtime, nvml
    runtime.clear("test teardown")


def test_gpu_budget_evicts_only_until_the_load_fits(gpu_runtime, tmp_path):
    runtime, nvml = gpu_runtime
    for age, name in enumerate(["a.onnx", "c.onnx", "b.onnx"]):  # a, then c, are the least recently used
        runtime.session(conv_model(tmp_path / name, mid_channels=4), "cuda:0").last_used = float(age)
    model = conv_model(tmp_path / "d.onnx")
    need = int(model.stat().st_size * 1.1) + 1
    # room for d once a's recorded 900 MiB are gone, not before
    runtime.configure(vram_budget_bytes=CONTEXT + PER_MODEL["b.onnx"] + PER_MODEL["c.onnx"] + need)
    with runtime.operation("load d") as op:
        handle = op.session(model, "cuda:0")
        op.run(handle, {"x": np.ones((1, 3, 32, 32), np.float32)}, last=True)
    event = runtime.events.recent("budget")[-1]
    assert event["fits"] and event["device"] == "cuda:0"
    assert event["actions"] == ["releasing arenas", "unloading a.onnx (least recently used)"]
    assert sorted(h.model_name for h in runtime.cached_sessions()) == ["b.onnx", "c.onnx", "d.onnx"]
    assert ("nvmlDeviceGetHandleByIndex", 0) in nvml.calls and ("nvmlDeviceGetMemoryInfo", ("handle", 0)) in nvml.calls
    assert {c[1] for c in nvml.calls if c[0] == "nvmlDeviceGetHandleByIndex"} == {0}, "only the job's GPU is asked"
    assert op.memory["budget"][0].startswith("loading d.onnx needed about ")


def test_gpu_budget_refusal_names_the_nvml_figures(gpu_runtime, tmp_path):
    runtime, _ = gpu_runtime
    for age, name in enumerate(["c.onnx", "a.onnx"]):
        runtime.session(conv_model(tmp_path / name, mid_channels=4), "cuda:0").last_used = float(age)
    runtime.configure(vram_budget_bytes=CONTEXT)  # the context alone fills it
    with pytest.raises(MemoryBudgetError) as refused, runtime.operation("load d") as op:
        op.session(conv_model(tmp_path / "d.onnx"), "cuda:0")
    assert runtime.events.recent("budget")[-1]["actions"][1:] == [
        "unloading c.onnx (least recently used)", "unloading a.onnx (least recently used)"]
    message = str(refused.value)
    assert message.startswith("Not enough memory: loading d.onnx on cuda:0 needs about ")
    assert f"but only 0 KiB free under the {CONTEXT // MIB} MiB budget (this process uses {CONTEXT // MIB} MiB)" in message
    assert refused.value.resource == "memory under the budget" and message.endswith(WHAT_TO_DO)


def test_no_budget_and_room_to_spare_does_nothing(tmp_path):
    runtime = Runtime()
    model = conv_model(tmp_path / "conv.onnx", mid_channels=4)
    for _ in range(2):
        with runtime.operation("plain") as op:
            handle = op.session(model, "cpu")
            for _, last in mark_last(range(2)):
                op.run(handle, {"x": np.ones((1, 3, 64, 64), np.float32)}, last=last)
    assert runtime.events.recent("budget") == [] and op.memory["budget"] == []
    assert ("conv.onnx", ((1, 3, 64, 64),)) in runtime.working_memory
