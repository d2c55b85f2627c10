"""``python -m lean_image_ai doctor`` in a child process, for a host that must neither import
onnxruntime itself for it nor wait (Blender's preferences): :func:`start` returns at once and the
host calls :func:`poll` from its own timer until the report is there. No thread: the child writes
into files that are read once it has ended.

The child is started by runtime/child_process.py's :func:`spawn` under the worker's Python
(``python``, the caller's choice): the host's own (``sys.executable``, with the host's ``sys.path``:
an extension's wheels live in Blender's extension site-packages) or another interpreter with its own
onnxruntime, so the report is about the onnxruntime the worker's sessions get.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..child_process import command as child_command
from ..child_process import host_environment, new_folder, spawn
from ..paths import ADDON_ROOT

TIME_LIMIT_S = 180.0  # a CUDA probe that hangs (a wedged driver) must not leave the button busy
KILL_WAIT_S = 5.0  # after SIGKILL; a process in an uninterruptible sleep is left behind, never waited on


@dataclass
class DoctorRun:
    process: subprocess.Popen
    folder: Path  # the child's output files (and, for a checkout, the package link)
    started: float = field(default_factory=time.monotonic)
    text: str | None = None  # the report once the child has ended
    ok: bool = False

    @property
    def running(self) -> bool:
        return self.text is None


def command(gpu_runtime: str | os.PathLike | None = None, worker_python: str = "",
            python: str | None = None) -> list[str]:  # fmt: skip
    return child_command(*_args(gpu_runtime, worker_python), python=python)


def _args(gpu_runtime, worker_python: str = "") -> list[str]:
    args = ["doctor", "--gpu-runtime", str(gpu_runtime)] if gpu_runtime else ["doctor"]
    return args + (["--worker-python", worker_python] if worker_python else [])


def start(gpu_runtime: str | os.PathLike | None = None, *, root: Path = ADDON_ROOT, worker_python: str = "",
          python: str | None = None) -> DoctorRun:  # fmt: skip
    """The doctor run by ``python`` (the worker's interpreter; the host's own when None)."""
    folder = new_folder("doctor")
    try:
        process = spawn(_args(gpu_runtime, worker_python), folder, root=Path(root), python=python)
    except Exception:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return DoctorRun(process, folder)


def poll(run: DoctorRun, *, now: float | None = None) -> bool:
    """True once the report is in ``run.text`` (the child ended, or was stopped at the time limit)."""
    if not run.running:
        return True
    now = time.monotonic() if now is None else now
    if run.process.poll() is None:
        if now - run.started < TIME_LIMIT_S:
            return False
        stop(run, f"The doctor gave no answer in {TIME_LIMIT_S:.0f} s and was stopped (a GPU driver that hangs?).")
        return True
    out = (run.folder / "stdout.txt").read_text(encoding="utf-8", errors="replace").strip()
    err = (run.folder / "stderr.txt").read_text(encoding="utf-8", errors="replace").strip()
    run.ok = run.process.returncode == 0
    if not out:  # it could not even start (a broken install): its own words are the report
        out = f"The doctor ended with exit code {run.process.returncode}: " + (err[-2000:] or "no output")
    run.text = out
    shutil.rmtree(run.folder, ignore_errors=True)
    return True


__all__ = ["DoctorRun", "command", "host_environment", "poll", "start", "stop"]


def stop(run: DoctorRun, text: str = "The doctor was stopped.") -> None:
    if run.process.poll() is None:
        run.process.kill()
        try:
            run.process.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            text += f" It did not end when killed (process {run.process.pid}, left running)."
    if run.running:
        run.text = text
    shutil.rmtree(run.folder, ignore_errors=True)
