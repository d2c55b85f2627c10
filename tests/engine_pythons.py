"""Other Pythons for the worker's engine (tests): pyenv's interpreters, and one venv made once
per machine in ~/.cache/lean_image_ai with numpy and onnxruntime (plus the WebGPU plugin EP, a
real plugin library that registers on a machine without a GPU and then finds no device)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CACHE = Path.home() / ".cache" / "lean_image_ai"
ENGINE_PACKAGES = ("numpy", "onnxruntime==1.31.1", "onnxruntime-ep-webgpu==0.4.0")


def pyenv_python(line: str) -> str:
    """pyenv's bare Python of that line (no numpy, no onnxruntime): skipped where absent."""
    env_name = f"LEAN_IMAGE_AI_PYTHON{line.replace('.', '')}"
    candidates = [os.environ.get(env_name), *sorted(glob.glob(str(Path.home() / f".pyenv/versions/{line}.*/bin/python{line}")))]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    pytest.skip(f"no Python {line} here (pyenv, or {env_name})")


def engine_venv(line: str = "3.13") -> str:
    """A venv of Python ``line`` with ENGINE_PACKAGES, built once, moved into place whole."""
    venv = CACHE / f"engine-py{line.replace('.', '')}"
    python = venv / "bin" / "python"
    if (venv / ".complete").is_file() and python.is_file():
        return str(python)
    base = pyenv_python(line)
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = CACHE / f"{venv.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run([base, "-m", "venv", str(partial)], check=True)
    done = subprocess.run([str(partial / "bin" / "python"), "-m", "pip", "install", "-q", *ENGINE_PACKAGES],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise AssertionError(f"pip install {' '.join(ENGINE_PACKAGES)} failed:\n{done.stderr[-3000:]}")
    (partial / ".complete").write_text(" ".join(ENGINE_PACKAGES))
    shutil.rmtree(venv, ignore_errors=True)
    partial.rename(venv)  # only bin/python is started, by path: the scripts' shebangs do not matter
    return str(python)
