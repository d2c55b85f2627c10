"""runtime/log/diagnostics.py against the real onnxruntime(-gpu) of this venv. The development machines
have no GPU: the CPU-only facts are asserted, and a CUDA request must come back as a fallback with
ORT's reason, not as a crash. On a machine with a working GPU the probe must say OK instead."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bh.import_package()
from lean_image_ai.runtime import get_runtime  # noqa: E402
from lean_image_ai.runtime.log import diagnostics  # noqa: E402
from lean_image_ai.runtime.measure import memory  # noqa: E402

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


@pytest.fixture(scope="module")
def report():
    return diagnostics.collect()


def _gpu_visible() -> bool:
    return bool(memory.nvidia_gpu_count())


def test_onnxruntime_facts(report):
    assert report.onnxruntime_error is None
    assert diagnostics.onnxruntime_import_error() is None
    assert report.onnxruntime_version == ort.__version__
    assert report.onnxruntime_location == os.path.dirname(os.path.abspath(ort.__file__))
    assert report.available_providers == ort.get_available_providers()
    assert CPU in report.available_providers
    text = diagnostics.format_report(report)
    assert ort.__version__ in text and report.onnxruntime_location in text


def test_report_is_plain_data(report):
    data = dataclasses.asdict(report)
    assert json.loads(json.dumps(data))["onnxruntime_version"] == ort.__version__


def test_nvml_absent_or_without_driver_is_said_plainly(report):
    if report.nvml.get("available"):
        assert isinstance(report.nvml["gpus"], list)
        pytest.skip("NVML works here: nothing to check about its absence")
    assert report.nvml["error"].startswith("NVML not available")
    assert "NVML not available" in diagnostics.format_report(report)


def test_cuda_libraries_listed_where_the_build_uses_cuda(report):
    if not report.build_cuda_version:
        assert "not a CUDA build" in report.cuda_libraries_note
        return
    names = [lib.name for lib in report.cuda_libraries]
    assert any("cudnn" in n for n in names) and any("cublas" in n for n in names)
    for lib in report.cuda_libraries:
        assert lib.where in ("nvidia wheel", "system search path", "not found", "given folder")
        assert (lib.path is not None) == (lib.where in ("nvidia wheel", "given folder"))
        if lib.path:
            assert Path(lib.path).is_file()


def test_cuda_request_without_a_gpu_reports_a_fallback_with_a_reason(report):
    if CUDA not in report.available_providers:
        assert report.cuda_probe.attempted is False and "CUDAExecutionProvider" in report.cuda_probe.fallback_reason
        return
    if _gpu_visible():
        pytest.skip("a GPU is visible: see the test below")
    probe = report.cuda_probe
    assert probe.attempted and not probe.ok
    assert probe.providers == [CPU]  # what the session really got
    assert probe.fallback_reason  # ORT's own words, e.g. which library could not be loaded
    assert any("CUDA" in m for m in probe.ort_messages), probe.ort_messages
    assert all("\x1b[" not in m for m in probe.ort_messages)
    line = next(ln for ln in diagnostics.format_report(report).splitlines() if ln.startswith("CUDA session"))
    assert "fell back to CPUExecutionProvider" in line and probe.fallback_reason in line


def test_cuda_probe_on_a_gpu_machine_is_ok(report):
    if not _gpu_visible() or CUDA not in report.available_providers:
        pytest.skip("no GPU here")
    assert report.cuda_probe.ok, report.cuda_probe


def test_probe_leaves_the_shared_cache_and_stderr_as_they_were():
    runtime = get_runtime()
    before = list(runtime.cached_sessions())
    fd2_before = os.fstat(2)
    diagnostics.collect()
    fd2_after = os.fstat(2)
    assert list(runtime.cached_sessions()) == before
    assert (fd2_before.st_dev, fd2_before.st_ino) == (fd2_after.st_dev, fd2_after.st_ino)


def test_without_onnxruntime_everything_is_one_readable_line(tmp_path):
    """A stock Blender without the bundled wheel: the UI greys its buttons out with this line."""
    search = bh.package_search_dir(tmp_path / "path")
    code = (
        "import json, sys\n"
        "sys.modules['onnxruntime'] = None  # import now raises ImportError\n"
        "from lean_image_ai.runtime.log import diagnostics\n"
        "report = diagnostics.collect()\n"
        "print(json.dumps({'error': diagnostics.onnxruntime_import_error(),\n"
        "                  'text': diagnostics.format_report(report),\n"
        "                  'probe': report.cuda_probe.attempted}))\n"
    )
    proc = bh.run_python(code, env=bh.isolated_blender_env(tmp_path / "u", pythonpath=[search]), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"].startswith("onnxruntime cannot be imported (ModuleNotFoundError:")
    assert "\n" not in out["error"]
    assert f"onnxruntime: {out['error']}" in out["text"].splitlines()
    assert out["probe"] is False


def test_doctor_names_the_device_a_job_really_gets_and_its_release_rule(report):
    session = report.session
    if _gpu_visible():
        pytest.skip("a GPU is visible: Auto may pick it")
    assert session["requested"] == "auto" and session["providers"][0] == CPU
    assert session["device"] == "CPU" and session["release_rule"] == "shrink"
    text = diagnostics.format_report(report)
    assert "A job on Auto runs on: CPU (CPUExecutionProvider); release rule: shrink: the arena shrinks" in text


def test_doctor_reads_the_bundled_wheels_from_the_zips_manifest(tmp_path):
    (tmp_path / "blender_manifest.toml").write_text(
        'id = "x"\nwheels = [\n  "./wheels/onnxruntime_directml-1.24.4-cp311-cp311-win_amd64.whl",\n]\n[build]\n'
    )
    assert diagnostics.bundled_wheels(str(tmp_path)) == ["onnxruntime_directml-1.24.4-cp311-cp311-win_amd64.whl"]
    assert diagnostics.bundled_wheels() == []  # a source checkout names no wheel
