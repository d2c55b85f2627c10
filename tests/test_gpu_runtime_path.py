"""runtime/cuda/gpu_loading.activate(), the model process's entry to the GPU runtime: with the lean
zips the CPU onnxruntime is the extension's own, and onnxruntime-gpu lives in the GPU runtime
folder; activate() must make `import onnxruntime` find the folder's GPU build, and say so in one
line when it cannot (a CPU onnxruntime already imported, an install older than the lean rule).

Real parts: the CPU onnxruntime wheel the linux-x64 zip carries (from the build tool's wheel cache,
installed with pip) plays the extension's site-packages, and the GPU runtime folder holds this
venv's real onnxruntime-gpu package; each case runs in a fresh Python process."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import blender_helpers as bh  # noqa: E402
import build_extension as B  # noqa: E402
from lean_image_ai.runtime.cuda import gpu_libraries as G  # noqa: E402

CACHE = Path(os.environ.get("LEAN_IMAGE_AI_CACHE", Path.home() / ".cache" / "lean_image_ai")) / "wheels"

PROBE = """
import json, sys
from lean_image_ai.runtime.cuda import gpu_loading as L
folder, mode = sys.argv[1], sys.argv[2]
if mode == "import-first":
    import onnxruntime
result = L.activate(folder) if mode != "none" else None
import onnxruntime as ort
print(json.dumps({"package": ort.package_name, "file": ort.__file__, "error": result and result.error,
                  "on_path": result and result.on_path, "folder_on_path": folder in sys.path}))
"""


@pytest.fixture(scope="module")
def package_parent(tmp_path_factory) -> Path:
    return bh.package_search_dir(tmp_path_factory.mktemp("pkg"))


@pytest.fixture(scope="module")
def cpu_site(tmp_path_factory) -> Path:
    """A site-packages holding only the CPU onnxruntime of the linux-x64 zip (as Blender unpacks it)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        pytest.skip("the linux-x64 CPU wheel runs on x86-64 Linux")
    wheel, _ = B.read_pin(B.BUILD_BY_NAME["linux-x64"], f"{sys.version_info.major}.{sys.version_info.minor}")
    if not (CACHE / wheel).is_file():
        pytest.skip(f"{wheel} is not in {CACHE}: `tools/build_extension.py --build linux-x64` fetches it")
    site = tmp_path_factory.mktemp("cpu_site")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site),
         "--disable-pip-version-check", str(CACHE / wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return site


def _gpu_runtime(folder: Path, *, with_onnxruntime: bool = True) -> Path:
    """A complete GPU runtime install (its marker) holding this venv's onnxruntime-gpu package."""
    spec = importlib.util.find_spec("onnxruntime")
    origin = Path(spec.origin).parent if spec and spec.origin else None
    if origin is None or not list(origin.glob("capi/libonnxruntime_providers_cuda*")):
        pytest.skip("needs onnxruntime-gpu installed in this Python")
    folder.mkdir(parents=True)
    (folder / G.MARKER).write_text("{}")
    if with_onnxruntime:
        (folder / "onnxruntime").symlink_to(origin, target_is_directory=True)
    return folder


def _env(cpu_site: Path, package_parent: Path) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(cpu_site), str(package_parent)]))


def _probe(env: dict, folder: Path, mode: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, str(folder), mode], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_activate_makes_the_gpu_runtimes_onnxruntime_the_one_imported(cpu_site, package_parent, tmp_path):
    folder = _gpu_runtime(tmp_path / "gpu_runtime")
    plain = _probe(_env(cpu_site, package_parent), folder, "none")
    assert plain["package"] == "onnxruntime" and plain["file"].startswith(str(cpu_site))  # the zip's CPU build
    used = _probe(_env(cpu_site, package_parent), folder, "activate")
    assert used["package"] == "onnxruntime-gpu" and used["file"].startswith(str(folder) + os.sep)
    assert used["error"] is None and used["on_path"] and used["folder_on_path"]


def test_a_cpu_onnxruntime_imported_first_is_one_clear_line_and_the_path_is_left_alone(cpu_site, package_parent, tmp_path):
    folder = _gpu_runtime(tmp_path / "gpu_runtime")
    late = _probe(_env(cpu_site, package_parent), folder, "import-first")
    assert late["package"] == "onnxruntime" and not late["on_path"] and not late["folder_on_path"]
    assert f"was imported from {cpu_site / 'onnxruntime'} before the GPU runtime in {folder}" in late["error"]
    assert "\n" not in late["error"]


def test_an_install_without_onnxruntime_gpu_says_to_install_again(cpu_site, package_parent, tmp_path):
    folder = _gpu_runtime(tmp_path / "gpu_runtime", with_onnxruntime=False)
    old = _probe(_env(cpu_site, package_parent), folder, "activate")
    assert old["package"] == "onnxruntime" and not old["on_path"]
    assert f"The GPU runtime in {folder} has no onnxruntime-gpu" in old["error"] and "(Update)" in old["error"]


def test_doctor_with_the_gpu_runtime_reports_its_onnxruntime_gpu(cpu_site, package_parent, tmp_path):
    """What Blender's Run Doctor runs (Blender's Python and sys.path, `--gpu-runtime <folder>`)
    reports the onnxruntime a model process gets, not the zip's CPU build."""
    folder = _gpu_runtime(tmp_path / "gpu_runtime")
    env = _env(cpu_site, package_parent)
    proc = subprocess.run(
        [sys.executable, "-m", "lean_image_ai", "doctor", "--no-cuda-probe", "--gpu-runtime", str(folder)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"onnxruntime: onnxruntime-gpu {B.ORT_VERSION} from {folder / 'onnxruntime'}" in proc.stdout, proc.stdout
