"""preload_dlls() prints instead of raising: a CUDA session's real providers decide whether the
libraries loaded, and the event names the library that failed (real onnxruntime-gpu, no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

TESTS = Path(__file__).resolve().parent

# In a fresh process: an earlier test may have loaded NVIDIA's libraries into this one, and then
# preload_dlls() would find them by name.
JOB = r"""
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from onnx_builders import conv_model
from lean_image_ai.runtime import Runtime
from lean_image_ai.runtime.cuda import cuda_preload
runtime = Runtime()
handle = runtime.session(conv_model(Path(tempfile.mkdtemp()) / "conv.onnx"), "cuda:0")
print(json.dumps({
    "providers": handle.providers,
    "warning": handle.fallback_warning,
    "events": runtime.events.recent("cuda_preload_failed"),
    # the same printed failures are no one's fault once a session does get CUDA
    "blamed_if_cuda": cuda_preload.failure(runtime._preload, ["CUDAExecutionProvider", "CPUExecutionProvider"]),
}))
"""


def _site_has_cuda_wheels() -> bool:
    site = Path(ort.__file__).resolve().parents[1]
    return (site / "nvidia").is_dir()


def test_failed_preload_is_reported_when_the_cuda_session_lands_on_cpu():
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime build does not offer CUDA")
    if _site_has_cuda_wheels():
        pytest.skip("NVIDIA's CUDA wheels are installed here: preload_dlls has nothing to fail on")
    done = subprocess.run([sys.executable, "-c", JOB, str(TESTS)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report["providers"][0] == "CUDAExecutionProvider":
        pytest.skip("CUDA works on this machine: nothing to report")
    assert len(report["events"]) == 1, "preload_dlls() printed failures: the event must fire"
    event = report["events"][0]
    # what onnxruntime 1.31's preload_dlls() loads first for a CUDA 13 build, as the loader says it
    assert "libcublasLt.so.13" in event["libraries"]
    assert "cannot open shared object file" in event["libraries"]["libcublasLt.so.13"]
    assert event["providers"] == ["CPUExecutionProvider"] and event["model"] == "conv.onnx"
    assert "CUDA was requested" in report["warning"] and "libcublasLt.so.13" in report["warning"]
    assert report["blamed_if_cuda"] is None


def test_printed_failures_are_parsed_on_linux_and_windows_paths():
    """preload_dlls prints f"Failed to load {dll_path}: {e}" (onnxruntime 1.31 __init__.py): a
    Windows path has a drive colon and may hold spaces."""
    from lean_image_ai.runtime.cuda import cuda_preload

    printed = (
        "Failed to load /opt/site/nvidia/cu13/lib/libcublasLt.so.13: libcublasLt.so.13: cannot open shared object file\n"
        "Failed to load C:\\Program Files\\Blender\\nvidia\\cu13\\bin\\x86_64\\cudart64_13.dll: "
        "Could not find module 'cudart64_13.dll' (or one of its dependencies).\n"
        "Failed to load libcudnn.so.9: libcudnn.so.9: cannot open shared object file\n"
        "Please follow https://onnxruntime.ai/docs/install/#cuda-and-cudnn to install CUDA.\n"
    )
    lines, failed = cuda_preload.parse(printed)
    assert len(lines) == 4
    assert failed == {
        "libcublasLt.so.13": "libcublasLt.so.13: cannot open shared object file",
        "cudart64_13.dll": "Could not find module 'cudart64_13.dll' (or one of its dependencies).",
        "libcudnn.so.9": "libcudnn.so.9: cannot open shared object file",
    }
