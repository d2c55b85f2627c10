"""The device table's release rules, per provider, on the real code path with the real onnxruntime.

CUDA, DirectML and CoreML devices cannot exist here: their sessions are real CPU sessions that
*report* that provider (the stand-in), and the factory records exactly what onnxruntime received
(provider list and options, session config entries and settings, each run's shrink entry).
The UNLOAD rule (DirectML, CoreML) is then exercised for real: the real session object is dropped,
its memory comes back, and the next job loads it again with identical results.
"""

from __future__ import annotations

import gc
import os
import weakref

import numpy as np
import onnxruntime as ort
import pytest
from lean_image_ai.runtime import Runtime, RuntimeSettings, mark_last, settings
from lean_image_ai.runtime.log import native_log
from lean_image_ai.runtime.measure.memory_report import format_job_memory
from lean_image_ai.runtime.onnx_inputs import all_inputs_static, declared_input_shapes
from lean_image_ai.runtime.providers import (
    COREML,
    CPU,
    CUDA,
    DEVICE_BY_KIND,
    DEVICES,
    DML,
    KEEP,
    SHRINK,
    SHRINK_CONFIG_KEY,
    UNLOAD,
    coreml_partition_warning,
    coreml_partitions,
    release_rule,
)
from onnx_builders import conv_model, sr_model, weights_model

SESSION_KEYS = (
    "session.use_env_allocators",
    "session.use_device_allocator_for_initializers",
    "ep.dml.disable_memory_arena",
)


def _entry(getter, key):
    try:
        return getter(key)
    except Exception:  # ORT raises for a key that was never set
        return None


class ReportingSession:
    """A real CPU session that reports another provider; records each run's shrink entry."""

    def __init__(self, real, factory):
        self.real, self.factory = real, factory

    def get_providers(self):
        return list(self.factory.reported)

    def get_provider_options(self):
        return self.factory.reported_options

    def get_inputs(self):
        return self.real.get_inputs()

    def get_outputs(self):
        return self.real.get_outputs()

    def run(self, names, feeds, run_options=None):
        entry = _entry(run_options.get_run_config_entry, SHRINK_CONFIG_KEY) if run_options else None
        self.factory.shrink_entries.append(entry or "")
        # the CPU session would refuse a gpu: entry: what was recorded is what a GPU session gets
        real_options = run_options if self.factory.reported[0] == CPU else ort.RunOptions()
        return self.real.run(names, feeds, real_options)


class ReportingFactory:
    """Records what InferenceSession() received; keeps only weak references to the sessions."""

    def __init__(self, reported=(CPU,), reported_options=None, on_create=None):
        self.reported = list(reported)
        self.reported_options = reported_options or {}
        self.on_create = on_create  # stands in for what ORT logs while it creates the session
        self.calls: list[dict] = []
        self.shrink_entries: list[str] = []
        self.alive: list[weakref.ref] = []

    def __call__(self, model_path, options, providers):
        self.calls.append(
            {
                "providers": providers,
                "config": {k: v for k in SESSION_KEYS if (v := _entry(options.get_session_config_entry, k))},
                "mem_pattern": options.enable_mem_pattern,
                "execution_mode": options.execution_mode,
                "log_severity_level": options.log_severity_level,
            }
        )
        if self.on_create:
            self.on_create()
        real = ort.InferenceSession(model_path, sess_options=options, providers=[CPU])
        self.alive.append(weakref.ref(real))
        return ReportingSession(real, self)


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conv_model(tmp_path_factory.mktemp("models") / "conv.onnx")


def frame(seed=0):
    return np.random.default_rng(seed).random((1, 3, 32, 32), dtype=np.float32)


def two_runs(runtime, model, device, **session_keywords):
    with runtime.operation("job") as op:
        handle = op.session(model, device, **session_keywords)
        outputs = [op.run(handle, {"x": f}, last=last)["y"] for f, last in mark_last([frame(), frame(1)])]
    return op, handle, outputs


# ---- the device table -----------------------------------------------------------------------------


def test_the_table_has_one_row_per_device_with_its_release_rule():
    assert [(d.kind, d.provider, d.label, d.takes_index, d.arena_device, d.release) for d in DEVICES] == [
        ("cuda", CUDA, "CUDA", True, "gpu", SHRINK),
        ("directml", DML, "DirectML", True, None, UNLOAD),
        ("coreml", COREML, "CoreML", False, None, UNLOAD),
        ("cpu", CPU, "CPU", False, "cpu", SHRINK),
        # the engine's plugin execution providers (runtime/plugin_eps/): they give nothing back while
        # a session lives, so their rule is unload; auto never picks them (the user names them)
        ("webgpu", "WebGpuExecutionProvider", "WebGPU", False, None, UNLOAD),
        ("openvino", "OpenVINOExecutionProvider", "OpenVINO", False, None, UNLOAD),
        ("rtx", "NvTensorRTRTXExecutionProvider", "TensorRT-RTX", False, None, UNLOAD),
    ]
    assert [d.kind for d in sorted(DEVICES, key=lambda d: 99 if d.auto_rank is None else d.auto_rank)] == [
        "cuda", "directml", "coreml", "cpu", "webgpu", "openvino", "rtx",
    ]  # fmt: skip
    assert release_rule([CPU], cpu_arena=False) == KEEP  # no shared arena: as before
    assert release_rule([DML, CPU], cpu_arena=False, keep_loaded=True) == KEEP
    assert release_rule(["TensorrtExecutionProvider", CUDA, CPU], cpu_arena=False) == KEEP


CUDA_OPTIONS = {
    "device_id": "0",
    "arena_extend_strategy": "kSameAsRequested",
    "cudnn_conv_use_max_workspace": "0",
    "cudnn_conv_algo_search": "HEURISTIC",
}


@pytest.mark.parametrize(
    "device, available, reported, settings, providers, config, shrink, rule",
    [
        ("cpu", [CPU], [CPU], {}, [(CPU, {})], {"session.use_env_allocators": "1"}, ["", "cpu:0"], SHRINK),
        ("cpu", [CPU], [CPU], {"cpu_arena": False}, [(CPU, {})], {}, ["", ""], KEEP),
        (
            "cuda:0", [CUDA, CPU], [CUDA, CPU], {}, [(CUDA, CUDA_OPTIONS), (CPU, {})],
            {"session.use_device_allocator_for_initializers": "1"}, ["", "gpu:0"], SHRINK,
        ),
        (
            "directml", [DML, CPU], [DML, CPU], {}, [(DML, {"device_id": "0"}), (CPU, {})],
            {"ep.dml.disable_memory_arena": "1"}, ["", ""], UNLOAD,
        ),
        (
            "coreml", [COREML, CPU], [COREML, CPU], {}, "coreml", {}, ["", ""], UNLOAD,
        ),
    ],
)  # fmt: skip
def test_recorded_options_per_provider(
    conv, tmp_path, device, available, reported, settings, providers, config, shrink, rule
):
    """Spec: CPU, DirectML, CoreML or another provider that does not declare support: no shrink
    configuration is submitted and inference runs as before. CUDA (and CPU with the runtime's
    arena): the shrink entry on the last run only."""
    factory = ReportingFactory(reported, {CUDA: {"device_id": "0"}} if reported[0] == CUDA else {})
    settings = RuntimeSettings(coreml_cache_dir=str(tmp_path / "coreml"), **settings)
    runtime = Runtime(settings, session_factory=factory, available_providers=lambda: available)
    op, handle, outputs = two_runs(runtime, conv, device)
    if providers == "coreml":
        providers = [
            (
                COREML,
                {
                    "ModelFormat": "MLProgram",
                    "MLComputeUnits": "ALL",
                    "RequireStaticInputShapes": "0",
                    "ModelCacheDirectory": str(tmp_path / "coreml"),
                },
            ),
            (CPU, {}),
        ]
        assert (tmp_path / "coreml").is_dir()
    call = factory.calls[0]
    assert call["providers"] == providers
    assert call["config"] == config
    # no memory pattern on DirectML (ORT's DirectML notes) nor in the shared CPU arena (each input
    # shape would otherwise hold its working memory twice: runtime/core.py)
    assert call["mem_pattern"] is (reported[0] != DML and "session.use_env_allocators" not in config)
    assert call["execution_mode"] == ort.ExecutionMode.ORT_SEQUENTIAL
    # ORT's own lines are kept, not printed (ERROR and up); CoreML's summary of a graph in one piece
    # (or none) is logged at INFO, so CoreML sessions log at INFO into the same capture
    assert call["log_severity_level"] == (1 if reported[0] == COREML else native_log.SESSION_LOG_SEVERITY)
    assert factory.shrink_entries == shrink
    assert handle.release == rule
    assert outputs[1].shape == (1, 3, 32, 32) and np.isfinite(outputs[1]).all()
    assert bool(runtime.events.recent("memory_release")) is (rule == SHRINK)
    assert (handle.session is None) is (rule == UNLOAD)  # only the unload rule drops the session
    assert any(f"release rule: {handle.device_label}: {rule}" in line for line in op.memory["lines"])


def test_dml_and_coreml_sessions_run_as_before_when_kept_loaded(conv):
    factory = ReportingFactory([DML, CPU])
    runtime = Runtime(
        RuntimeSettings(keep_models_loaded_on_dml_coreml=True),
        session_factory=factory,
        available_providers=lambda: [DML, CPU],
    )
    op, handle, _ = two_runs(runtime, conv, "directml")
    assert handle.session is not None and runtime.cached_sessions() == [handle]
    assert op.unloaded is None and factory.shrink_entries == ["", ""]
    assert any("'Keep models loaded on DirectML/CoreML' is on" in line for line in op.memory["lines"])
    two_runs(runtime, conv, "directml")
    assert len(factory.calls) == 1, "the kept session is reused"


# ---- the UNLOAD rule, for real ------------------------------------------------------------------------


def test_unload_rule_drops_the_session_gives_memory_back_and_the_next_job_reloads(tmp_path):
    model = weights_model(tmp_path / "weights.onnx", n=2048)  # 16 MB of weights
    x = np.random.default_rng(3).standard_normal((1, 2048)).astype(np.float32)
    factory = ReportingFactory([DML, CPU])
    runtime = Runtime(session_factory=factory, available_providers=lambda: [DML, CPU])

    def job():
        with runtime.operation("job") as op:
            handle = op.session(model, "directml")
            y = op.run(handle, {"x": x}, last=True)["y"]
        return op, handle, y

    op, handle, first = job()
    gc.collect()
    assert handle.session is None and handle.evicted and runtime.cached_sessions() == []
    assert factory.alive[0]() is None, "the real InferenceSession is gone"
    assert op.unloaded["sessions"] == 1 and op.unloaded["action"] == "release rule: unload after the job"
    loaded = handle.load_growth.get("ram")
    if loaded:  # RSS is readable here: what unloading gave back against what loading took (same run)
        assert op.unloaded["by"]["ram"] >= 0.5 * loaded, (op.unloaded, loaded)
    assert op.memory["released"] is True
    assert [e["reason"] for e in runtime.events.recent("session_evict")] == [
        "release rule: unload after the job"
    ]

    op2, handle2, second = job()
    assert len(factory.calls) == 2 and handle2 is not handle, "the next job loads the model again"
    assert np.array_equal(first, second)
    assert op2.memory["loaded_models"] == ["weights.onnx"]


def test_keep_loaded_from_the_environment(monkeypatch):
    monkeypatch.setenv("LEAN_IMAGE_AI_KEEP_MODELS_LOADED_ON_DML_COREML", "1")
    assert settings.settings_from_environment().keep_models_loaded_on_dml_coreml is True
    monkeypatch.delenv("LEAN_IMAGE_AI_KEEP_MODELS_LOADED_ON_DML_COREML")
    assert settings.settings_from_environment().keep_models_loaded_on_dml_coreml is False


# ---- CoreML options and its partition report --------------------------------------------------------


def test_coreml_compute_units_and_static_shapes_make_their_own_session(conv, tmp_path):
    factory = ReportingFactory([COREML, CPU])
    settings = RuntimeSettings(
        coreml_compute_units="CPUAndNeuralEngine",
        coreml_cache_dir=str(tmp_path),
        keep_models_loaded_on_dml_coreml=True,
    )
    runtime = Runtime(settings, session_factory=factory, available_providers=lambda: [COREML, CPU])
    two_runs(runtime, conv, "coreml")
    two_runs(runtime, conv, "coreml", static_shapes=True)
    options = [call["providers"][0][1] for call in factory.calls]
    assert [(o["MLComputeUnits"], o["RequireStaticInputShapes"]) for o in options] == [
        ("CPUAndNeuralEngine", "0"),
        ("CPUAndNeuralEngine", "1"),
    ]
    assert len(runtime.cached_sessions()) == 2


def test_unknown_coreml_compute_units_are_named():
    with pytest.raises(ValueError, match="CPUAndNeuralEngine"):  # refused where the setting enters
        RuntimeSettings(coreml_compute_units="GPU")


# ORT's own summary line, as onnxruntime 1.32.0's macOS binary spells it
# (strings of onnxruntime_pybind11_state.so; WARNING when the graph is cut into several pieces)
PARTITION_LINE = (
    "2026-08-10 12:43:05.311041 [W:onnxruntime:, coreml_execution_provider.cc:137 GetCapability] "
    "CoreMLExecutionProvider::GetCapability, number of partitions supported by CoreML: {p} "
    "number of nodes in the graph: {n} number of nodes supported by CoreML: {s}\n"
)


def test_coreml_partition_report_is_read_from_onnxruntimes_log(conv, tmp_path):
    def log_partitions():  # what ORT writes to file descriptor 2 while it partitions the graph
        os.write(2, PARTITION_LINE.format(p=39, n=327, s=112).encode())

    factory = ReportingFactory([COREML, CPU], on_create=log_partitions)
    runtime = Runtime(
        RuntimeSettings(coreml_cache_dir=str(tmp_path)),
        session_factory=factory,
        available_providers=lambda: [COREML, CPU],
    )
    handle = runtime.session(conv, "coreml")
    assert handle.partitions == {"partitions": 39, "nodes": 327, "coreml_nodes": 112}
    assert "CoreML runs 112 of 327 operators of conv.onnx (34%) in 39 piece(s)" in handle.partition_warning
    # the artist hears it as a fallback (the families pass fallback warnings on; the panel shows them)
    assert handle.fallback_warning == handle.partition_warning
    assert runtime.events.recent("provider_fallback")[-1]["message"] == handle.partition_warning


def test_directml_request_that_lands_on_cpu_is_named(conv):
    factory = ReportingFactory([CPU])  # what ORT reports when the DirectML device cannot be created
    runtime = Runtime(session_factory=factory, available_providers=lambda: [DML, CPU])
    handle = runtime.session(conv, "directml")
    assert handle.fallback_warning.startswith(
        "DirectML was requested for conv.onnx but the session runs on CPU"
    )
    # created without the shared CPU arena (DirectML was asked for): it runs as before, nothing to shrink
    assert handle.release == KEEP and handle.shrink == ""


def test_coreml_partition_warning_only_when_it_matters():
    def facts(p, n, s):
        return coreml_partitions([PARTITION_LINE.format(p=p, n=n, s=s)])

    assert coreml_partition_warning("m.onnx", facts(1, 300, 300)) is None
    assert coreml_partition_warning("m.onnx", facts(2, 300, 280)) is None
    assert "0 of 300" in coreml_partition_warning("m.onnx", facts(0, 300, 0))
    assert "in 30 piece(s)" in coreml_partition_warning("m.onnx", facts(30, 300, 280))
    assert coreml_partitions(["nothing about CoreML"]) is None


def test_job_report_names_the_rule_in_one_line():
    job = {
        "operation": "o", "outcome": "success", "devices": ["DirectML"], "figures": [], "released": True,
        "loaded_models": [], "live_output_bytes": 0, "release_rules": ["DirectML: unload (x)"],
    }  # fmt: skip
    assert format_job_memory(job)[-1] == "  release rule: DirectML: unload (x)"
    assert DEVICE_BY_KIND["directml"].release_text.startswith("the job's sessions are unloaded")


def test_coreml_static_shapes_follow_what_the_file_declares(conv, tmp_path):
    fixed = conv_model(tmp_path / "fixed.onnx", height=64, width=64)
    factory = ReportingFactory([COREML, CPU])
    runtime = Runtime(
        RuntimeSettings(coreml_cache_dir=str(tmp_path), keep_models_loaded_on_dml_coreml=True),
        session_factory=factory,
        available_providers=lambda: [COREML, CPU],
    )
    runtime.session(conv, "coreml")  # 1x3xHxW: on, CoreML would take none of it
    runtime.session(fixed, "coreml")  # 1x3x64x64: compiled once for that shape
    assert [c["providers"][0][1]["RequireStaticInputShapes"] for c in factory.calls] == ["0", "1"]


def test_declared_input_shapes_match_onnxruntimes_reading(conv, tmp_path):
    models = [
        conv,
        conv_model(tmp_path / "fixed.onnx", height=48, width=80),
        weights_model(tmp_path / "weights.onnx", n=1024),  # 4 MB of initializers skipped, not read
        sr_model(tmp_path / "sr.onnx"),
        sr_model(tmp_path / "sr_tile.onnx", tile=64),  # an upscaler with a fixed tile
    ]
    for model in models:
        declared = declared_input_shapes(model)
        session = ort.InferenceSession(str(model), providers=[CPU])
        assert declared == [tuple(d if isinstance(d, int) else None for d in i.shape) for i in session.get_inputs()]
    assert [all_inputs_static(m) for m in models] == [False, True, True, False, True]
    (tmp_path / "broken.onnx").write_bytes(b"\xff\xff\xff")
    assert all_inputs_static(tmp_path / "broken.onnx") is False
