"""End to end, for real: the linux-x64 zip built with the real onnxruntime-gpu wheel works in a stock
Blender whose Python has no onnxruntime, Pillow or psutil, and leaves nothing behind when removed.

Needs PyPI (the wheel and bpy are downloaded once, then reused): without it the test fails with
pip's message rather than skipping, because a zip that was never tried is the bug this guards.

Caches (override the root with LEAN_IMAGE_AI_CACHE): ``<root>/wheels`` for the build tool's
downloads, ``<root>/stock-bpy-5.0.1`` for a venv holding only ``bpy==5.0.1`` and what it pulls in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

CACHE = Path(os.environ.get("LEAN_IMAGE_AI_CACHE", Path.home() / ".cache" / "lean_image_ai"))
BPY_VERSION = "5.0.1"
JOB_SCRIPT = Path(__file__).with_name("stock_blender_job.py")


def _stock_python() -> Path:
    """A venv with only bpy (and its own requirements); built once, into place by rename."""
    venv = CACHE / f"stock-bpy-{BPY_VERSION}"
    python = venv / "bin" / "python"
    if (venv / ".complete").is_file() and python.is_file():
        return python
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = CACHE / f"{venv.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(partial)], check=True)
    proc = subprocess.run(
        [str(partial / "bin" / "python"), "-m", "pip", "install", "-q", f"bpy=={BPY_VERSION}"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"pip install bpy=={BPY_VERSION} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    (partial / ".complete").write_text(BPY_VERSION)
    shutil.rmtree(venv, ignore_errors=True)
    # Renamed whole so a killed run never leaves a half venv in place; its console scripts keep
    # the old path in their shebangs, but this test only ever starts bin/python by path.
    partial.rename(venv)
    return python


@pytest.fixture(scope="module")
def timings() -> dict:
    return {}


@pytest.fixture(scope="module")
def built(tmp_path_factory, timings) -> dict:
    out = tmp_path_factory.mktemp("stock_zip")
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable, str(bh.REPO_ROOT / "tools" / "build_extension.py"),
            "--platform", "linux-x64", "--python", "3.11",
            "--output-dir", str(out), "--wheels-dir", str(CACHE / "wheels"),
        ],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    timings["build_s"] = time.perf_counter() - started
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["zips"]) == 1, report
    return report["zips"][0]


@pytest.fixture(scope="module")
def stock_run(built, tmp_path_factory, timings) -> dict:
    started = time.perf_counter()
    python = _stock_python()
    timings["stock_venv_s"] = time.perf_counter() - started
    root = tmp_path_factory.mktemp("stock_blender")
    work = root / "work"
    work.mkdir()
    env = bh.isolated_blender_env(root)
    started = time.perf_counter()
    proc = subprocess.run(
        [str(python), str(JOB_SCRIPT), built["path"], str(work)],
        capture_output=True, text=True, env=env, cwd=str(work), timeout=600,
    )  # fmt: skip
    timings["blender_job_s"] = time.perf_counter() - started
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert "error" not in result, result["error"] + proc.stderr[-4000:]
    result["root"] = str(root)
    result["console"] = proc.stdout + proc.stderr
    print(f"\nstock Blender e2e timings: {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
    return result


def test_zip_carries_exactly_the_onnxruntime_wheel_and_the_license(built):
    with zipfile.ZipFile(built["path"]) as zf:
        names = zf.namelist()
        manifest = zf.read("blender_manifest.toml").decode()
    wheels = [n for n in names if n.endswith(".whl")]
    assert len(wheels) == 1 and Path(wheels[0]).name.startswith("onnxruntime_gpu-"), wheels
    assert "-cp311-cp311-manylinux" in wheels[0]
    assert [w["name"] for w in built["wheels"]] == [Path(wheels[0]).name]
    assert "LICENSE" in names
    assert not any("numpy" in n.lower() for n in names)
    assert not any(n.endswith(".png") and "/" not in n for n in names), names
    assert 'blender_version_max = "5.1.0"' in manifest  # cp311: Blender 4.2 to 5.0 only


def test_stock_blender_lacks_what_the_addon_must_bring(stock_run):
    assert stock_run["python"] == [3, 11] and stock_run["bpy"] == BPY_VERSION
    assert all(stock_run["missing_before"].values()), stock_run["missing_before"]


def test_upscale_runs_in_stock_blender_with_the_bundled_onnxruntime(stock_run):
    assert stock_run["install"] == ["FINISHED"] and stock_run["enabled"] is True
    assert stock_run["upscale"] == ["FINISHED"]
    ext = Path(stock_run["extensions_dir"]).resolve()
    assert ext.is_relative_to(Path(stock_run["root"]).resolve())  # the temporary user folders
    # Blender unpacks extension wheels into one site-packages under the user extensions folder.
    site = ext / ".local" / "lib" / "python3.11" / "site-packages"
    assert stock_run["site_packages"] == [str(site)]
    assert Path(stock_run["onnxruntime_file"]).resolve().is_relative_to(site)
    assert Path(stock_run["addon_file"]).resolve() == ext / "user_default" / "lean_image_ai" / "__init__.py"
    assert "onnxruntime" in stock_run["site_entries_installed"]
    assert not any(stock_run["imported"].values()), stock_run["imported"]
    assert stock_run["rss_bytes"] and stock_run["rss_bytes"] > 0  # RSS without psutil

    assert stock_run["output_size"] == [96, 64]  # 2x of 48x32
    assert stock_run["pixels_finite"]
    low, high = stock_run["pixels_range"]
    assert 0.0 <= low <= high <= 1.0
    # Each 2x2 block of a bicubic x2 averages back to its source pixel, to 8-bit rounding and ringing.
    assert stock_run["pooled_max_abs_diff"] < 0.05


def test_uninstall_leaves_nothing_behind(stock_run):
    assert stock_run["uninstall"] == ["FINISHED"]
    assert stock_run["enabled_after"] is False
    assert stock_run["addon_dir_exists_after"] is False
    assert stock_run["site_entries_after"] == []
    assert stock_run["left_under_extensions"] == []


def test_auto_device_skips_cuda_quietly_without_an_nvidia_driver(stock_run):
    """No nvidia-ml-py in a stock Blender: the driver's NVML library itself says there is no GPU."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("an NVIDIA driver is installed here")
    except OSError:
        pass
    assert "CUDAExecutionProvider" not in stock_run["console"], stock_run["console"][-3000:]
    assert "libcublas" not in stock_run["console"]
