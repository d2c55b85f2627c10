"""The shared runtime against the real onnxruntime (CPU here), one test per spec scenario plus
the cache, provider, OOM, memory and bad-input contracts of issue #2."""

import json
import logging
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from lean_image_ai.runtime import (
    DeviceSpecError,
    InferenceError,
    ModelFileError,
    OperationCancelled,
    ProviderUnavailableError,
    Runtime,
    RuntimeSettings,
    core,
    mark_last,
    memory_snapshot,
)
from lean_image_ai.runtime.release.cpu_arena import RELEASE_PROBE_MODEL
from lean_image_ai.runtime.settings import settings_from_environment
from onnx_builders import conv_model, release_probe_model
from recording import RecordingFactory

REPO = Path(__file__).resolve().parents[1]
CPU = "CPUExecutionProvider"


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conv_model(tmp_path_factory.mktemp("models") / "conv.onnx")


def frame(seed=0, size=32):
    return np.random.default_rng(seed).random((1, 3, size, size), dtype=np.float32)


def run_op(runtime, model, frames, device="cpu", tiles=1):
    """Runs `frames` x `tiles` model runs as one operation, marking only the final run."""
    outputs = []
    with runtime.operation("test") as op:
        handle = op.session(model, device)
        for image, last_frame in mark_last(frames):
            for _tile, last_tile in mark_last(range(tiles)):
                outputs.append(op.run(handle, {"x": image}, last=last_frame and last_tile)["y"])
    return handle, outputs


# ---- Requirement: cached model sessions survive inference cleanup ------------------------------


def test_matching_request_reuses_the_loaded_model_after_cleanup(conv):
    factory = RecordingFactory()
    runtime = Runtime(session_factory=factory)
    first, _ = run_op(runtime, conv, [frame()])
    assert runtime.events.recent("memory_release"), "the first operation must have released memory"
    second, _ = run_op(runtime, conv, [frame(1)])
    assert second is first
    assert len(factory.calls) == 1, "the model file must not be loaded again"
    assert runtime.sessions_created == 1
    assert [e["event"] for e in runtime.events.recent()].count("session_reuse") == 1


def test_different_key_gets_its_own_session(conv, tmp_path):
    runtime = Runtime()
    other = conv_model(tmp_path / "other.onnx", seed=1)
    a = runtime.session(conv, "cpu")
    assert runtime.session(conv, "cpu") is a
    assert runtime.session(other, "cpu") is not a
    runtime.configure(cpu_arena=False)
    assert runtime.session(conv, "cpu") is not a, "different runtime settings are a different key"
    assert runtime.sessions_created == 3


def test_same_key_from_many_threads_creates_one_session(conv):
    factory = RecordingFactory()
    runtime = Runtime(session_factory=factory)
    handles = []
    threads = [
        threading.Thread(target=lambda: handles.append(runtime.session(conv, "cpu"))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(factory.calls) == 1
    assert len({id(h) for h in handles}) == 1


def test_model_replaced_on_disk_gets_a_new_session(tmp_path):
    path = conv_model(tmp_path / "m.onnx", seed=0)
    runtime = Runtime()
    first = runtime.session(path, "cpu")
    conv_model(tmp_path / "m.onnx", seed=1, mid_channels=16)
    assert runtime.session(path, "cpu") is not first


# ---- Requirement: temporary memory is released at operation completion ------------------------


def test_single_run_inference_releases_temporary_memory(conv):
    factory = RecordingFactory()
    runtime = Runtime(session_factory=factory)
    run_op(runtime, conv, [frame()])
    assert factory.sessions[0].shrink_entries == ["cpu:0"]


def test_multi_frame_inference_releases_after_the_final_frame(conv):
    factory = RecordingFactory()
    runtime = Runtime(session_factory=factory)
    run_op(runtime, conv, [frame(i) for i in range(4)])
    assert factory.sessions[0].shrink_entries == ["", "", "", "cpu:0"]


def test_tiled_inference_releases_after_the_final_tile(conv):
    factory = RecordingFactory()
    runtime = Runtime(session_factory=factory)
    run_op(runtime, conv, [frame(i) for i in range(2)], tiles=3)
    assert factory.sessions[0].shrink_entries == ["", "", "", "", "", "cpu:0"]
    assert len(runtime.events.recent("memory_release")) == 1


def test_a_run_after_the_final_run_is_refused(conv):
    runtime = Runtime()
    with pytest.raises(RuntimeError, match="already made its final run"):
        with runtime.operation("twice") as op:
            handle = op.session(conv, "cpu")
            op.run(handle, {"x": frame()}, last=True)
            op.run(handle, {"x": frame()}, last=True)


def test_operation_without_a_final_run_still_releases(conv):
    runtime = Runtime()
    with runtime.operation("forgot") as op:
        op.run(op.session(conv, "cpu"), {"x": frame()}, last=False)
    releases = runtime.events.recent("memory_release")
    assert [e["reason"] for e in releases] == ["no_final_run"]
    assert runtime.events.recent("operation_end")[-1]["outcome"] == "no_final_run"


def test_mark_last():
    assert list(mark_last([])) == []
    assert list(mark_last("ab")) == [("a", False), ("b", True)]


# ---- Requirement: unsupported providers retain existing behaviour -----------------------------


@pytest.mark.parametrize(
    "device, available, reported",
    [
        ("directml", ["DmlExecutionProvider", CPU], ["DmlExecutionProvider", CPU]),
        ("coreml", ["CoreMLExecutionProvider", CPU], ["CoreMLExecutionProvider", CPU]),
        (
            "auto",
            ["SomeFutureExecutionProvider", "DmlExecutionProvider", CPU],
            ["SomeFutureExecutionProvider", CPU],
        ),
    ],
)
def test_provider_without_arena_shrinkage_gets_no_cleanup_config(conv, device, available, reported):
    factory = RecordingFactory(reported_providers=reported, reported_options={})
    runtime = Runtime(session_factory=factory, available_providers=lambda: available)
    handle, outputs = run_op(runtime, conv, [frame(), frame(1)], device=device)
    call = factory.calls[0]
    assert factory.sessions[0].shrink_entries == ["", ""], "no run may carry a shrink entry"
    assert "session.use_env_allocators" not in call["config"]
    for _name, options in call["providers"]:
        assert "arena_extend_strategy" not in options and "gpu_mem_limit" not in options
    assert handle.shrink == ""
    assert outputs[1].shape == (1, 3, 32, 32) and np.isfinite(outputs[1]).all()
    assert not runtime.events.recent("memory_release")


def test_cpu_session_without_runtime_arena_gets_no_cleanup_config(conv):
    factory = RecordingFactory()
    runtime = Runtime(RuntimeSettings(cpu_arena=False), session_factory=factory)
    handle, outputs = run_op(runtime, conv, [frame()])
    assert factory.sessions[0].shrink_entries == [""]
    assert "session.use_env_allocators" not in factory.calls[0]["config"]
    assert outputs[0].shape == (1, 3, 32, 32)


def test_cuda_request_that_falls_back_to_cpu_gets_no_gpu_entry(conv, caplog):
    """Real fallback: this onnxruntime-gpu lists CUDA but the machine has no GPU."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime build does not list CUDA")
    factory = RecordingFactory()  # real session, real get_providers()
    runtime = Runtime(session_factory=factory)
    with caplog.at_level(logging.WARNING, logger="lean_image_ai.runtime"):
        handle, outputs = run_op(runtime, conv, [frame()], device="cuda:0")
    if handle.providers[0] == "CUDAExecutionProvider":
        pytest.skip("a real GPU is present: no fallback to observe")
    assert factory.calls[0]["providers"][0][0] == "CUDAExecutionProvider", "CUDA was really requested"
    assert "session.use_env_allocators" not in factory.calls[0]["config"], "a CUDA request never joins the CPU arena"
    # ORT's own fallback has no shrinkable arena: the session is made again as a CPU one, which
    # gives its RAM back like any CPU job (and never gets a gpu: entry)
    assert factory.calls[1]["providers"] == [("CPUExecutionProvider", {})]
    assert factory.calls[1]["config"]["session.use_env_allocators"] == "1"
    assert factory.sessions[1].shrink_entries == ["cpu:0"]
    assert handle.shrink == "cpu:0" and runtime.sessions_created == 2
    assert outputs[0].shape == (1, 3, 32, 32)
    assert "CUDA was requested" in handle.fallback_warning
    fallback = runtime.events.recent("provider_fallback")
    assert len(fallback) == 1 and fallback[0]["requested"] == "cuda:0"
    assert any('"provider_fallback"' in r.getMessage() for r in caplog.records)


def test_cuda_session_options_and_run_entries_are_recorded_exactly(conv, monkeypatch):
    """No GPU here: record what the runtime hands to InferenceSession() and run() for CUDA."""
    monkeypatch.setattr(core, "visible_cuda_count", lambda: 2)  # a machine with two GPUs
    factory = RecordingFactory(
        reported_providers=["CUDAExecutionProvider", CPU],
        reported_options={
            "CUDAExecutionProvider": {"device_id": "1", "arena_extend_strategy": "kSameAsRequested"}
        },
    )
    runtime = Runtime(
        RuntimeSettings(gpu_mem_limit_bytes=2 << 30),
        session_factory=factory,
        available_providers=lambda: ["CUDAExecutionProvider", CPU],
    )
    handle, _ = run_op(runtime, conv, [frame(i) for i in range(3)], device="cuda:1")
    call = factory.calls[0]
    assert call["providers"] == [
        (
            "CUDAExecutionProvider",
            {
                "device_id": "1",
                "arena_extend_strategy": "kSameAsRequested",
                "cudnn_conv_use_max_workspace": "0",
                "cudnn_conv_algo_search": "HEURISTIC",
                "gpu_mem_limit": str(2 << 30),
            },
        ),
        (CPU, {}),
    ]
    assert call["config"] == {"session.use_device_allocator_for_initializers": "1"}, "no shared CPU arena"
    assert factory.sessions[0].shrink_entries == ["", "", "gpu:1"]
    assert handle.device_label == "CUDA:1" and handle.fallback_warning is None


def test_cudnn_workspace_and_search_are_chosen_and_make_their_own_session(conv, monkeypatch):
    """cudnn_conv_use_max_workspace off and HEURISTIC by default (see providers.py for why); turning
    the workspace on is another CUDA session (options are fixed at creation), not the cached one."""
    monkeypatch.setattr(core, "visible_cuda_count", lambda: 1)
    factory = RecordingFactory(
        reported_providers=["CUDAExecutionProvider", CPU],
        reported_options={"CUDAExecutionProvider": {"device_id": "0"}},
    )
    runtime = Runtime(session_factory=factory, available_providers=lambda: ["CUDAExecutionProvider", CPU])
    first = runtime.session(conv, "cuda:0")
    runtime.configure(cudnn_max_workspace=True, cudnn_conv_algo_search="EXHAUSTIVE")
    second = runtime.session(conv, "cuda:0")
    assert second is not first and len(factory.calls) == 2
    cuda_options = [call["providers"][0][1] for call in factory.calls]
    assert [(o["cudnn_conv_use_max_workspace"], o["cudnn_conv_algo_search"]) for o in cuda_options] == [
        ("0", "HEURISTIC"),
        ("1", "EXHAUSTIVE"),
    ]
    assert runtime.session(conv, "cuda:0") is second
    with pytest.raises(ValueError, match="cudnn_conv_algo_search"):  # refused where it enters
        runtime.configure(cudnn_conv_algo_search="FASTEST")
    # CPU sessions take no cuDNN option and are not split by them
    cpu = runtime.session(conv, "cpu")
    runtime.configure(cudnn_max_workspace=False)
    assert runtime.session(conv, "cpu") is cpu and factory.calls[-1]["providers"] == [(CPU, {})]


def test_headless_knob_turns_the_cudnn_workspace_on(monkeypatch):
    monkeypatch.delenv("LEAN_IMAGE_AI_CUDNN_MAX_WORKSPACE", raising=False)
    assert settings_from_environment().cudnn_max_workspace is False
    monkeypatch.setenv("LEAN_IMAGE_AI_CUDNN_MAX_WORKSPACE", "1")
    assert settings_from_environment().cudnn_max_workspace is True


def test_cuda_session_cancelled_is_evicted_to_free_its_arena(conv):
    factory = RecordingFactory(
        reported_providers=["CUDAExecutionProvider", CPU],
        reported_options={"CUDAExecutionProvider": {"device_id": "0"}},
    )
    runtime = Runtime(session_factory=factory, available_providers=lambda: ["CUDAExecutionProvider", CPU])
    cancel = threading.Event()
    with pytest.raises(OperationCancelled):
        with runtime.operation("cancel me", cancel=cancel) as op:
            handle = op.session(conv, "cuda")
            for image, last in mark_last([frame(i) for i in range(3)]):
                op.run(handle, {"x": image}, last=last)
                cancel.set()
    assert factory.sessions[0].shrink_entries == [""], "cancel is checked before the next run"
    assert handle.evicted and runtime.cached_sessions() == []
    assert runtime.events.recent("memory_release")[-1]["reason"] == "cancelled"


# ---- Requirement: results and failure contracts stay stable -----------------------------------


def test_cleanup_enabled_inference_returns_the_same_result(conv):
    frames = [frame(i, size=96) for i in range(3)]
    _, with_release = run_op(Runtime(), conv, frames)
    _, without = run_op(Runtime(RuntimeSettings(release_memory=False)), conv, frames)
    for a, b in zip(with_release, without, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.array_equal(a, b)


def test_outputs_are_owned_by_numpy_not_the_arena(conv):
    _, outputs = run_op(Runtime(), conv, [frame()])
    assert outputs[0].flags.owndata


def test_real_out_of_memory_gives_readable_error_and_evicts():
    """Capped CPU arena (a real BFCArena OOM, the same code path as CUDA's gpu_mem_limit)."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "oom_job.py")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["raised"] == "InferenceOutOfMemoryError"
    assert "Available memory of" in report["detail"], "must be a real arena failure"
    assert report["message"].startswith("Out of system memory while running conv.onnx on CPU")
    assert "smaller tile" in report["message"]
    assert report["evicted"] and report["oom_events"] == 1
    assert report["second_ok"] and report["new_session"] and report["sessions_created"] == 2


def _release_job(*args):
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "release_job.py"), *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_the_job_shows_release(off):
    """Precondition, from the figures this machine measured: without release the job must keep
    most of its transient memory (else nothing here could tell release on from off), and that
    transient memory must dwarf the output arrays (the intermediates are mid/3 = ~10x the
    outputs; a small fraction of them would be within reach of allocator noise)."""
    assert off["peak_transient_bytes"] > 4 * off["output_bytes"], off
    assert off["retained_beyond_outputs_bytes"] > 0.5 * off["peak_transient_bytes"], off


def test_release_gives_back_real_memory():
    """Release on vs off, each in a fresh process, same job: with release the RSS kept beyond the
    output arrays must be under 10% of what the same job keeps without release, and under 10% of
    its own peak transient memory (the issue's goal). Only ratios of figures measured in this
    run are compared, so the test holds on any machine and fails when release stops working."""
    off = _release_job("--release", "off", "--size", "768")
    on = _release_job("--release", "on", "--size", "768")
    _check_the_job_shows_release(off)
    assert on["outcome"] == off["outcome"] == "success"
    assert on["output_bytes"] == off["output_bytes"]
    assert on["retained_beyond_outputs_bytes"] < 0.10 * off["retained_beyond_outputs_bytes"], (on, off)
    assert on["retained_beyond_outputs_bytes"] < 0.10 * on["peak_transient_bytes"], on


@pytest.mark.parametrize("ending", ["cancel", "error"])
def test_cancelled_or_failed_operation_releases_too(ending):
    args = ("--ending", ending, "--size", "768", "--frames", "3")
    off = _release_job("--release", "off", *args)
    on = _release_job("--release", "on", *args)
    expected = {"cancel": "cancelled", "error": "error"}[ending]
    assert on["outcome"] == off["outcome"] == expected
    _check_the_job_shows_release(off)
    assert on["retained_beyond_outputs_bytes"] < 0.10 * off["retained_beyond_outputs_bytes"], (on, off)
    assert on["retained_beyond_outputs_bytes"] < 0.10 * on["peak_transient_bytes"], on
    assert on["sessions_cached"] == 1, "on CPU the session (weights) stays cached"


def test_error_in_a_run_is_distinct_from_out_of_memory(conv):
    runtime = Runtime()
    with pytest.raises(InferenceError, match="conv.onnx failed on CPU"):
        with runtime.operation("bad shape") as op:
            op.run(op.session(conv, "cpu"), {"x": np.zeros((1, 5, 8, 8), np.float32)}, last=True)
    assert runtime.events.recent("operation_end")[-1]["outcome"] == "error"
    assert len(runtime.cached_sessions()) == 1, "a non-memory error keeps the session"


# ---- bad input --------------------------------------------------------------------------------


def test_missing_model_file_is_named(tmp_path, conv):
    runtime = Runtime()
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelFileError, match="not found: .*nope.onnx"):
        runtime.session(missing, "cpu")
    assert runtime.session(conv, "cpu").session is not None, "cache still usable"


def test_file_that_is_not_onnx_is_named(tmp_path):
    bad = tmp_path / "photo.onnx"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    with pytest.raises(ModelFileError, match="photo.onnx is a PNG image, not an ONNX model"):
        Runtime().session(bad, "cpu")


def test_truncated_onnx_file_is_named(tmp_path, conv):
    data = conv.read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    runtime = Runtime()
    with pytest.raises(ModelFileError, match="cut.onnx"):
        runtime.session(cut, "cpu")
    assert runtime.cached_sessions() == []
    assert runtime.session(conv, "cpu") in runtime.cached_sessions()


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cpu:1", "vulkan", ""])
def test_unknown_device_string_is_named(conv, device):
    if device == "":  # an empty --device is a mistake, not 'auto'
        with pytest.raises(DeviceSpecError, match="The device is empty. Use one of"):
            Runtime().session(conv, device)
        return
    with pytest.raises(DeviceSpecError, match=repr(device)):
        Runtime().session(conv, device)


def test_the_device_strings_come_from_the_device_table():
    """A device is one row of providers.DEVICES: its name, its aliases and its index rule are what
    parse_device accepts, and the refusal lists exactly the table's names."""
    from lean_image_ai.runtime.providers import DEVICES, parse_device

    for row in DEVICES:
        for name in (row.kind, *row.aliases):
            assert parse_device(name.upper()).kind == row.kind
            if row.takes_index:
                assert str(parse_device(f"{name}:3")) == f"{row.kind}:3"
            else:
                with pytest.raises(DeviceSpecError, match="take an index"):
                    parse_device(f"{name}:1")
    with pytest.raises(DeviceSpecError) as refused:
        parse_device("vulkan")
    listed = set(re.findall(r"'([a-z]+)(?::N)?'", str(refused.value).split("Use one of:")[1]))
    assert listed == {"auto", *(row.kind for row in DEVICES)}


def test_unavailable_provider_is_a_distinct_error(conv):
    runtime = Runtime(available_providers=lambda: [CPU])
    with pytest.raises(ProviderUnavailableError, match="DmlExecutionProvider"):
        runtime.session(conv, "directml")


# ---- events, snapshots, probe -----------------------------------------------------------------


def test_events_are_json_log_records_and_bounded(conv, caplog):
    runtime = Runtime()
    with caplog.at_level(logging.INFO, logger="lean_image_ai.runtime"):
        run_op(runtime, conv, [frame()])
    payloads = [json.loads(r.getMessage()) for r in caplog.records if r.name == "lean_image_ai.runtime"]
    kinds = [p["event"] for p in payloads]
    assert kinds == ["operation_start", "session_create", "memory_release", "job_memory", "operation_end"]
    release = payloads[2]
    assert release["reason"] == "operation_complete" and release["shrink"] == "cpu:0"
    assert (
        release["before"]["rss_bytes"] > 0 and release["after"]["rss_bytes"] > 0 and release["seconds"] >= 0
    )
    for _ in range(600):
        runtime.events.emit("filler")
    assert len(runtime.events.recent()) == 500


def test_memory_snapshot_never_raises():
    snap = memory_snapshot(gpu_device_id=0)
    assert snap["rss_bytes"] > 0
    assert "available" in snap["gpu"]
    if not snap["gpu"]["available"]:
        assert snap["gpu"]["error"]


def test_release_probe_bytes_match_their_builder():
    assert release_probe_model().SerializeToString() == RELEASE_PROBE_MODEL


def test_importing_the_package_does_not_import_bpy():
    code = (
        "import sys, lean_image_ai, lean_image_ai.runtime, lean_image_ai.models; print('bpy' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_auto_on_a_machine_without_a_usable_gpu_quietly_means_cpu(conv):
    """onnxruntime-gpu lists CUDA even without a GPU; 'auto' must not try it (no fallback noise)."""
    from lean_image_ai.runtime.measure.memory import nvidia_gpu_count

    if nvidia_gpu_count() != 0:
        pytest.skip("a GPU is visible (or NVML is not installed): nothing to check here")
    factory = RecordingFactory()
    runtime = Runtime(session_factory=factory)
    handle = runtime.session(conv, "auto")
    assert factory.calls[0]["providers"] == [(CPU, {})]
    assert handle.fallback_warning is None and not runtime.events.recent("provider_fallback")


RELEASE_EVENT_JOB = r"""
import gc, json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from onnx_builders import conv_model
from lean_image_ai.runtime import Runtime, mark_last
from lean_image_ai.runtime.measure.memory import peak_rss_bytes, process_rss_bytes, reset_peak_rss

if not reset_peak_rss() or peak_rss_bytes() is None:
    print(json.dumps({"unsupported": True}))
    sys.exit(0)
runtime = Runtime()
handle = runtime.session(conv_model(sys.argv[2]), "cpu")
frames = [np.random.default_rng(i).random((1, 3, 384, 384), dtype=np.float32) for i in range(2)]
gc.collect()
measured_before = process_rss_bytes()
reset_peak_rss()
outputs = []
with runtime.operation("measured") as op:
    for image, last in mark_last(frames):
        outputs.append(op.run(handle, {"x": image}, last=last)["y"])
release = runtime.events.recent("memory_release")[-1]
print(json.dumps({
    "shrink": handle.shrink, "reason": release["reason"], "measured_before": measured_before,
    "peak": peak_rss_bytes(), "before": release["before"]["rss_bytes"],
    "after": release["after"]["rss_bytes"], "output_bytes": sum(o.nbytes for o in outputs),
}))
"""


def test_release_event_compares_memory_before_the_job_with_after_release(tmp_path):
    """The release event's `before` is the RSS just before the job's first run and its `after`
    is taken once the arena was shrunk: so `after - before` is what the job kept, its outputs
    plus under 10% of the job's own peak growth. A fresh process (the arena and the heap are
    process-wide); ratios of figures measured in that one run only."""
    proc = subprocess.run(
        [sys.executable, "-c", RELEASE_EVENT_JOB, str(REPO / "tests"), str(tmp_path / "conv.onnx")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    job = json.loads(proc.stdout.strip().splitlines()[-1])
    if job.get("unsupported"):
        pytest.skip("this platform has no resettable peak RSS (Linux /proc/self/clear_refs)")
    assert job["shrink"] == "cpu:0" and job["reason"] == "operation_complete"
    transient = job["peak"] - job["measured_before"]
    # precondition: the job grew far beyond what it keeps (the 32-channel intermediates)
    assert transient > 4 * job["output_bytes"], job
    assert abs(job["before"] - job["measured_before"]) < 0.10 * transient, "`before`: before the first run"
    assert job["after"] - job["before"] - job["output_bytes"] < 0.10 * transient, job


class _PassThroughFactory(RecordingFactory):
    """Reports CUDA but is a real CPU session that really receives the run options."""

    def __call__(self, model_path, session_options, providers):
        session = super().__call__(model_path, session_options, providers)
        session.reported_providers = None  # the wrapper now passes run_options through ...
        session.get_providers = lambda: ["CUDAExecutionProvider", CPU]  # ... yet reports CUDA
        session.get_provider_options = lambda: {"CUDAExecutionProvider": {"device_id": "0"}}
        return session


def test_a_shrink_entry_the_session_rejects_is_dropped_and_the_run_still_succeeds(conv):
    """The real ORT error for an entry naming a missing arena must not fail the user's job."""
    factory = _PassThroughFactory()
    runtime = Runtime(session_factory=factory, available_providers=lambda: ["CUDAExecutionProvider", CPU])
    handle, outputs = run_op(runtime, conv, [frame(), frame(1)], device="cuda")
    assert factory.sessions[0].shrink_entries == ["", "gpu:0", ""], "tried once, then ran without"
    assert outputs[1].shape == (1, 3, 32, 32)
    unsupported = runtime.events.recent("release_unsupported")
    assert unsupported and "Did not find an arena based allocator" in unsupported[0]["detail"]
    assert handle.shrink == ""
    _, again = run_op(runtime, conv, [frame()], device="cuda")
    assert factory.sessions[0].shrink_entries[-1] == "", "later jobs run exactly as before"


def test_gpu_index_beyond_the_visible_gpus_is_an_error(conv, monkeypatch):
    """cuda:99 used to run on CPU and exit 0. The count is this machine's real one (none here)."""
    count = core.visible_cuda_count()
    if count is None:
        pytest.skip("the GPU count cannot be known here")
    runtime = Runtime(available_providers=lambda: ["CUDAExecutionProvider", CPU])
    with pytest.raises(DeviceSpecError) as info:
        runtime.session(conv, "cuda:99")
    msg = str(info.value)
    assert "'cuda:99'" in msg and f"{count} NVIDIA GPU(s) are visible" in msg and "'auto' or 'cpu'" in msg
    assert runtime.cached_sessions() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(core, "nvidia_gpu_count", lambda: 4)  # four GPUs, all hidden by the mask
    with pytest.raises(DeviceSpecError, match="visible: none.*CUDA_VISIBLE_DEVICES"):
        runtime.session(conv, "cuda:1")
    assert runtime.session(conv, "cpu").session is not None, "the next job works"
