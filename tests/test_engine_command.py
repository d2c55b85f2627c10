"""The GPU engine's terminal command (runtime/cuda/engine_command.py, ui/cli/cli_gpu.py): quoted
for the shell, run by the add-on folder's path (no cd, no PYTHONPATH), its folder from --target or
LEAN_IMAGE_AI_GPU_RUNTIME_DIR (render nodes)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from lean_image_ai.runtime.cuda import engine_command, gpu_libraries
from lean_image_ai.runtime.paths import ADDON_ROOT


def test_the_command_quotes_paths_with_spaces_for_each_shell():
    posix = engine_command.install_command("/opt/blender 5/python/bin/python3.11", "/home/a b/gpu_runtime",
                                           root="/home/a b/ext/lean_image_ai", windows=False)  # fmt: skip
    assert shlex.split(posix) == ["/opt/blender 5/python/bin/python3.11", "/home/a b/ext/lean_image_ai", "gpu",
                                  "install", "--target", "/home/a b/gpu_runtime"]  # fmt: skip
    windows = engine_command.install_command(r"C:\Program Files\Blender\python\bin\python.exe",
                                             r"C:\Users\a b\gpu_runtime", root=r"C:\ext\lean_image_ai", windows=True)
    assert windows == (r'"C:\Program Files\Blender\python\bin\python.exe" "C:\ext\lean_image_ai" gpu install '
                       r'--target "C:\Users\a b\gpu_runtime"')  # fmt: skip


def _run(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    # a clean search path: the folder's own __main__.py must find the package
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, str(ADDON_ROOT), *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)  # fmt: skip


def test_the_add_on_folder_runs_by_its_path_from_any_folder(tmp_path):
    done = _run(["gpu", "install", "--help"], dict(os.environ), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--target FOLDER" in done.stdout and gpu_libraries.FOLDER_ENV in done.stdout


def test_without_a_target_the_folder_comes_from_the_environment_or_one_line_says_what_to_give(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != gpu_libraries.FOLDER_ENV}
    done = _run(["gpu", "remove"], env, tmp_path)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: No engine folder: give --target FOLDER (Blender's preferences show the command with its "
        f"folder), or set {gpu_libraries.FOLDER_ENV}."
    )
    env[gpu_libraries.FOLDER_ENV] = str(tmp_path / "farm_engine")
    done = _run(["gpu", "remove"], env, tmp_path)
    assert f"No GPU runtime is installed in {tmp_path / 'farm_engine'}" in done.stderr
    done = _run(["gpu-runtime", "remove"], env, tmp_path)  # the former name still works
    assert f"No GPU runtime is installed in {tmp_path / 'farm_engine'}" in done.stderr
