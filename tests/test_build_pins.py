"""tools/build_extension.py's builds and their onnxruntime pins (no download: the pin files are
committed, written by `--pin-onnxruntime` from the downloaded wheels)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import build_extension as B  # noqa: E402


def test_one_build_per_gpu_family_and_both_windows_zips_named_apart():
    assert [(b.name, b.platform, b.distribution, b.version, b.zip_suffix, b.gpu_runtime) for b in B.BUILDS] == [
        ("linux-x64", "linux-x64", "onnxruntime", B.ORT_VERSION, "", True),
        ("windows-x64-cuda", "windows-x64", "onnxruntime", B.ORT_VERSION, "-cuda", True),
        ("windows-x64-directml", "windows-x64", "onnxruntime-directml", "1.24.4", "-directml", False),
        ("macos-arm64", "macos-arm64", "onnxruntime", "1.32.0", "", False),
    ]
    assert [b.name for b in B.select_builds(["windows-x64"])] == ["windows-x64-cuda", "windows-x64-directml"]
    assert [b.name for b in B.select_builds(["linux-x64"])] == ["linux-x64"]  # the stock-Blender test's build
    assert "macOS 14" in B.BUILD_BY_NAME["macos-arm64"].note


@pytest.mark.parametrize("build", B.BUILDS, ids=lambda b: b.name)
@pytest.mark.parametrize("python", sorted(B.PYTHONS))
def test_every_build_and_python_has_a_hash_pinned_wheel(build, python):
    name, digest = B.read_pin(build, python)
    cp = "cp" + python.replace(".", "")
    assert name.startswith(f"{build.distribution.replace('-', '_')}-{build.version}-{cp}-{cp}-")
    assert all(marker in name for marker in build.markers) and re.fullmatch(r"[0-9a-f]{64}", digest)


def test_a_pin_of_another_version_is_refused(tmp_path, monkeypatch):
    build = B.BUILD_BY_NAME["windows-x64-directml"]
    text = B.pin_path(build, "3.11").read_text().replace("==1.24.4", "==1.23.0")
    monkeypatch.setattr(B, "PINS_DIR", tmp_path)
    B.pin_path(build, "3.11").write_text(text)
    with pytest.raises(SystemExit, match="run --pin-onnxruntime"):
        B.read_pin(build, "3.11")


def test_build_manifest_says_which_onnxruntime_and_stays_toml():
    manifest = (B.REPO_ROOT / "blender_manifest.toml").read_text()
    text = B.build_manifest_text(
        manifest,
        wheels=["w.whl"],
        platforms=["windows-x64"],
        python="3.11",
        note="onnxruntime-directml 1.24.4, any GPU",
    )
    data = tomllib.loads(text)
    assert data["wheels"] == ["./wheels/w.whl"] and data["platforms"] == ["windows-x64"]
    assert (
        "# Written by tools/build_extension.py for Python 3.11. onnxruntime: onnxruntime-directml 1.24.4"
        in text
    )


def test_directml_zip_builds_and_passes_blenders_validator(tmp_path):
    """The new Windows zip, end to end through Blender's own CLI (build + validate), from the
    pinned wheel in the shared wheel cache (tests/test_stock_blender.py's; never downloaded here)."""
    import json
    import os
    import subprocess
    import zipfile

    cache = Path(os.environ.get("LEAN_IMAGE_AI_CACHE", Path.home() / ".cache" / "lean_image_ai")) / "wheels"
    build = B.BUILD_BY_NAME["windows-x64-directml"]
    wheel, _ = B.read_pin(build, "3.11")
    if not (cache / wheel).is_file():
        pytest.skip(f"{wheel} is not in {cache}: `tools/build_extension.py --build windows-x64-directml` fetches it")
    proc = subprocess.run(
        [sys.executable, str(B.REPO_ROOT / "tools" / "build_extension.py"), "--build", build.name, "--python", "3.11",
         "--output-dir", str(tmp_path), "--wheels-dir", str(cache)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (made,) = json.loads(proc.stdout.strip().splitlines()[-1])["zips"]
    assert made["name"] == "lean_image_ai-0.1.0-py311-windows_x64-directml.zip" and made["validated"]
    with zipfile.ZipFile(made["path"]) as zf:
        names = zf.namelist()
        manifest = zf.read("blender_manifest.toml").decode()
    assert [n for n in names if n.endswith(".whl")] == [f"wheels/{wheel}"]
    assert not any(n.startswith("gpu_requirements/") for n in names), "no CUDA libraries for a DirectML zip"
    assert 'id = "lean_image_ai"' in manifest and "onnxruntime: onnxruntime-directml 1.24.4" in manifest
