"""Plugin execution providers (runtime/plugin_eps/): one device row each, registered with
onnxruntime's ``register_execution_provider_library`` in the process that runs models, offered only
where they find a device, and the doctor's one line when they cannot run.

No GPU is here: the WebGPU plugin's real library is registered by the real onnxruntime in a
Python 3.13 engine venv (it loads and finds no device); what onnxruntime would receive for a device
it found is recorded by an onnxruntime stand-in that keeps every argument."""

from __future__ import annotations

import json
import os
import subprocess
from types import SimpleNamespace

import pytest
from engine_pythons import engine_venv
from lean_image_ai.runtime import onnx_wire  # noqa: F401  (the runtime package, as the worker imports it)
from lean_image_ai.runtime.log import diagnostics
from lean_image_ai.runtime.log.report_text import format_report, next_step
from lean_image_ai.runtime.paths import ADDON_ROOT
from lean_image_ai.runtime.plugin_eps import registry
from lean_image_ai.runtime.plugin_eps.table import PLUGIN_BY_KIND, PLUGIN_EPS
from lean_image_ai.runtime.providers import (
    DEVICE_BY_KIND,
    NVIDIA_PROVIDERS,
    UNLOAD,
    ProviderChoices,
    parse_device,
    release_rule,
    resolve_providers,
)

WEBGPU = PLUGIN_BY_KIND["webgpu"]


@pytest.fixture(autouse=True)
def fresh_registry():
    registry.forget()
    yield
    registry.forget()


def test_each_plugin_is_a_device_row_that_unloads_and_takes_no_index():
    for plugin in PLUGIN_EPS:
        row = DEVICE_BY_KIND[plugin.kind]
        assert row.provider == plugin.provider and row.runtime_source == plugin.package
        assert release_rule([plugin.provider], cpu_arena=True) == UNLOAD  # no arena ORT can shrink
        assert parse_device(plugin.kind).kind == plugin.kind
    assert parse_device("tensorrt-rtx").kind == "rtx"
    assert "NvTensorRTRTXExecutionProvider" in NVIDIA_PROVIDERS  # offered only where the driver sees a GPU


class RecordingOrt:
    """onnxruntime as a plugin provider meets it, keeping every argument it is given."""

    def __init__(self, devices=(), refuse: Exception | None = None):
        self.calls: list[tuple] = []
        self._devices = list(devices)
        self._refuse = refuse

    def register_execution_provider_library(self, name, path):
        self.calls.append(("register_execution_provider_library", name, path))
        if self._refuse is not None:
            raise self._refuse

    def get_ep_devices(self):
        return list(self._devices)

    def InferenceSession(self, path, **kwargs):  # noqa: N802  (onnxruntime's name)
        self.calls.append(("InferenceSession", path, sorted(kwargs)))
        return SimpleNamespace(path=path)


class RecordingOptions:
    def __init__(self):
        self.added = []

    def add_provider_for_devices(self, devices, options):
        self.added.append((devices, options))


def _package(library: str, ep_name: str):
    return SimpleNamespace(get_library_path=lambda: library, get_ep_name=lambda: ep_name)


def test_what_onnxruntime_receives_for_a_webgpu_device(tmp_path):
    library = str(tmp_path / "libonnxruntime_providers_webgpu.so")
    gpu = SimpleNamespace(ep_name=WEBGPU.provider, device=SimpleNamespace(type="GPU"))
    other = SimpleNamespace(ep_name="CPUExecutionProvider", device=SimpleNamespace(type="CPU"))
    ort = RecordingOrt(devices=[other, gpu])
    packages = {WEBGPU.module: _package(library, WEBGPU.provider)}

    def importer(name):
        if name not in packages:
            raise ImportError(name)
        return packages[name]

    (status,) = registry.statuses(ort, importer=importer)
    assert ort.calls == [("register_execution_provider_library", "webgpu", library)]
    assert status.runnable and status.devices == 1
    assert registry.runnable_providers(ort) == [WEBGPU.provider]
    assert len(ort.calls) == 1  # registered once per process

    providers = resolve_providers(parse_device("webgpu"), ["CPUExecutionProvider", WEBGPU.provider], ProviderChoices())
    assert providers == [(WEBGPU.provider, {}), ("CPUExecutionProvider", {})]
    options = RecordingOptions()
    registry.inference_session(ort, "model.onnx", options, providers)
    assert options.added == [([gpu], {})]  # its own device only, its options as strings
    # no provider names: a plugin provider is chosen by its devices on the session options
    assert ort.calls[-1] == ("InferenceSession", "model.onnx", ["sess_options"])


def test_a_plugin_library_that_does_not_load_is_one_line_with_what_it_needs(tmp_path):
    import onnxruntime

    not_a_library = tmp_path / "libonnxruntime_providers_webgpu.so"
    not_a_library.write_bytes(b"not an ELF file")

    def importer(name):
        if name != WEBGPU.module:
            raise ImportError(name)
        return _package(str(not_a_library), WEBGPU.provider)

    (status,) = registry.statuses(onnxruntime, importer=importer)  # the real onnxruntime refuses it
    assert not status.runnable
    assert status.problem.startswith("onnxruntime-ep-webgpu is installed but its library did not load (")
    assert "\n" not in status.problem and WEBGPU.needs in status.problem


def test_the_real_webgpu_plugin_in_a_python_313_engine_loads_and_finds_no_device_here(tmp_path):
    """The real package's library, registered by the real onnxruntime 1.31.1 of a 3.13 venv with
    numpy 2; this machine has no GPU, so it is installed but not offered, and the doctor says why."""
    python = engine_venv("3.13")
    code = (
        "import json, onnxruntime\n"
        "from lean_image_ai.runtime.plugin_eps import registry\n"
        "from lean_image_ai.runtime import installed_providers\n"
        "(s,) = registry.statuses(onnxruntime)\n"
        "print(json.dumps({'library': s.library, 'provider': s.provider, 'devices': s.devices,"
        " 'problem': s.problem, 'installed': installed_providers()}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(_package_parent(tmp_path))
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["library"].endswith("onnxruntime_ep_webgpu/libonnxruntime_providers_webgpu.so")
    assert facts["provider"] == WEBGPU.provider
    assert facts["devices"] == 0
    assert facts["problem"].startswith("onnxruntime-ep-webgpu loaded but finds no device")
    assert WEBGPU.provider not in facts["installed"]  # not offered: it cannot run here
    doctor = subprocess.run([python, str(ADDON_ROOT), "doctor", "--no-cuda-probe"], capture_output=True,
                            text=True, env=env, timeout=180)  # fmt: skip
    assert doctor.returncode == 0, doctor.stderr
    assert "Python: 3.13." in doctor.stdout
    assert f"onnxruntime-ep-webgpu: cannot run: {facts['problem']}" in doctor.stdout
    assert doctor.stdout.strip().splitlines()[-1] == f"Next: {facts['problem']}"


def _package_parent(tmp_path):
    parent = tmp_path / "search"
    parent.mkdir()
    (parent / "lean_image_ai").symlink_to(ADDON_ROOT, target_is_directory=True)
    return parent


# ---- the doctor's one thing to do next ---------------------------------------------------------------


def _session(device: str) -> dict:
    return {"device": device, "providers": [f"{device}ExecutionProvider"], "release_rule": "shrink", "release_text": "-"}


def _report(**changes):
    report = diagnostics.Report(python="3.11.7 (/blender/python)", platform="Linux", onnxruntime_version="1.31.1",
                                onnxruntime_package="onnxruntime-gpu", build_cuda_version="13.0",
                                available_providers=["CUDAExecutionProvider", "CPUExecutionProvider"], cuda_offered=True,
                                session=_session("CPU"))  # fmt: skip
    for name, value in changes.items():
        setattr(report, name, value)
    return report


GPU = {"available": True, "driver_version": "550.54", "cuda_driver_version": "12.4",
       "gpus": [{"index": 0, "name": "RTX", "total_bytes": 8 << 30, "free_bytes": 7 << 30}]}  # fmt: skip
FELL_BACK = diagnostics.CudaProbe(attempted=True, providers=["CPUExecutionProvider"], fallback_reason="x")


def test_a_driver_too_old_for_the_onnxruntime_build_says_update_the_driver():
    step = next_step(_report(nvml=GPU, cuda_probe=FELL_BACK))
    assert step == ("the NVIDIA driver supports CUDA 12.4 but this onnxruntime needs CUDA 13.0: "
                    "update the NVIDIA driver")  # fmt: skip


def test_a_missing_libcudart_says_install_the_engine_again():
    libraries = [diagnostics.CudaLibrary("libcudart.so.13", None, "not found"),
                 diagnostics.CudaLibrary("libcudnn.so.9", "/x/libcudnn.so.9", "nvidia wheel")]  # fmt: skip
    step = next_step(_report(nvml={**GPU, "cuda_driver_version": "13.1"}, cuda_probe=FELL_BACK, cuda_libraries=libraries))
    assert step == "libcudart.so.13 not found: install the GPU engine again (gpu install), which brings them"


def test_a_gpu_with_the_cpu_onnxruntime_says_install_the_engine_and_a_working_one_nothing():
    cpu_only = _report(nvml=GPU, available_providers=["CPUExecutionProvider"], cuda_offered=False,
                       onnxruntime_package="onnxruntime")
    assert next_step(cpu_only).startswith("an NVIDIA GPU is here but this onnxruntime has no CUDA: install the GPU engine")
    working = _report(nvml=GPU, cuda_probe=diagnostics.CudaProbe(attempted=True, ok=True), session=_session("CUDA"))
    assert next_step(working) == "nothing: models run on CUDA"
    assert format_report(working).splitlines()[-1] == "Next: nothing: models run on CUDA"
