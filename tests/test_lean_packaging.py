"""The lean packaging (issue 30, item 7): every zip carries a CPU-capable onnxruntime and stays under
extensions.blender.org's 200 MB; onnxruntime-gpu comes only with the opt-in GPU runtime download
(gpu_requirements/), which only a model process puts on its path (runtime/cuda/gpu_loading.activate)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import build_extension as B  # noqa: E402

CACHE = Path(os.environ.get("LEAN_IMAGE_AI_CACHE", Path.home() / ".cache" / "lean_image_ai")) / "wheels"


def _distribution(wheel_name: str) -> str:
    return Path(wheel_name).name.split("-")[0].replace("_", "-").lower()


@pytest.mark.parametrize("build", B.BUILDS, ids=lambda b: b.name)
@pytest.mark.parametrize("python", sorted(B.PYTHONS))
def test_no_zip_manifest_names_a_gpu_provider_the_lean_rule_leaves_to_the_download(build, python):
    """The manifest the build writes into each zip, from the committed pins: its `wheels` list
    holds one wheel, never onnxruntime-gpu; a CUDA platform's zip offers onnxruntime-gpu through
    its GPU runtime requirements instead (same version as the tests run, same Python)."""
    wheel, _ = B.read_pin(build, python)
    text = B.manifest_for((B.REPO_ROOT / "blender_manifest.toml").read_text(), build, python, wheel)
    wheels = tomllib.loads(text)["wheels"]
    assert wheels == [f"./wheels/{wheel}"]
    assert not {_distribution(w) for w in wheels} & set(B.OPT_IN_ONLY), wheels
    if build.gpu_runtime:
        requirements = (B.GPU_REQUIREMENTS_DIR / B.gpu_requirements_name(build.platform, python)).read_text()
        cp = "cp" + python.replace(".", "")
        assert f"onnxruntime-gpu=={B.ORT_VERSION} --hash=sha256:" in requirements
        assert f"onnxruntime_gpu-{B.ORT_VERSION}-{cp}-{cp}-" in requirements


def test_a_build_that_bundles_onnxruntime_gpu_is_refused():
    gpu = B.Build("linux-x64", "linux-x64", "onnxruntime-gpu", B.ORT_VERSION, "manylinux_2_28_x86_64", ("x86_64",))
    with pytest.raises(SystemExit, match="only the opt-in GPU runtime download"):
        B.check_lean(gpu)
    for build in B.BUILDS:
        B.check_lean(build)


def test_the_size_check_deletes_a_zip_over_200_mb_and_keeps_one_at_the_limit(tmp_path):
    assert B.MAX_ZIP_BYTES == 200 * 1000 * 1000
    at_limit, over = tmp_path / "at.zip", tmp_path / "over.zip"
    for path, size in ((at_limit, B.MAX_ZIP_BYTES), (over, B.MAX_ZIP_BYTES + 1)):
        with open(path, "wb") as f:
            f.truncate(size)  # sparse: the size is real, the disk is not used
    B.check_zip_size(at_limit)
    assert at_limit.stat().st_size == B.MAX_ZIP_BYTES
    with pytest.raises(SystemExit) as refused:
        B.check_zip_size(over)
    message = str(refused.value)
    assert "over.zip is 200.0 MB, over the 200 MB limit" in message and "\n" not in message
    assert not over.exists()


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(B.REPO_ROOT / "tools" / "build_extension.py"), *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_the_linux_zip_is_lean_and_the_build_refuses_one_over_its_limit(tmp_path):
    """End to end through Blender's own CLI from the pinned wheel in the shared wheel cache (never
    downloaded here): a limit below the zip's size fails the build with one line and leaves no
    zip; the default limit passes, and the zip carries the CPU onnxruntime and the GPU runtime's
    requirements (onnxruntime-gpu among them)."""
    build = B.BUILD_BY_NAME["linux-x64"]
    wheel, _ = B.read_pin(build, "3.11")
    if not (CACHE / wheel).is_file():
        pytest.skip(f"{wheel} is not in {CACHE}: `tools/build_extension.py --build linux-x64` fetches it")
    common = ("--build", build.name, "--python", "3.11", "--output-dir", str(tmp_path), "--wheels-dir", str(CACHE))
    refused = _tool(*common, "--max-zip-mb", "1")
    assert refused.returncode != 0
    assert "MB, over the 1 MB limit" in refused.stderr and "so it was deleted" in refused.stderr, refused.stderr
    assert not list(tmp_path.glob("*.zip"))
    made = _tool(*common)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    (result,) = json.loads(made.stdout.strip().splitlines()[-1])["zips"]
    assert result["validated"] and result["size"] <= B.MAX_ZIP_BYTES
    with zipfile.ZipFile(result["path"]) as zf:
        names = zf.namelist()
        requirements = zf.read("gpu_requirements/linux-x64-cp311.txt").decode()
    assert [n for n in names if n.endswith(".whl")] == [f"wheels/{wheel}"]
    assert _distribution(wheel) == "onnxruntime"
    assert f"onnxruntime-gpu=={B.ORT_VERSION}" in requirements
