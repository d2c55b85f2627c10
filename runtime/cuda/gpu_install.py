"""Installing the NVIDIA CUDA/cuDNN wheels with pip, all or nothing (bpy-free).

What is installed and where, and removing it, is runtime/cuda/gpu_libraries.py's; this module runs
pip and reads its output on a thread of its own, so it is loaded only where an install runs: the
command line (``python -m lean_image_ai gpu install``, which the user runs in a terminal; the
add-on never runs pip in Blender's process).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import GpuRuntimeError, OperationCancelled
from .gpu_install_lock import one_install_at_a_time
from .gpu_libraries import (
    _OLD_SUFFIX,
    _STAGING_SUFFIX,
    MARKER,
    STAGING_MARKER,
    Requirement,
    _beside,
    _check_ours,
    _remove_ours,
    _sha256_text,
    check_replaceable,
    parse_requirements,
)
from .pip_output import DOWNLOAD_SHARE, INSTALL_SHARE, normalized, pip_failure, progress_from_line


def install(target_dir: str | os.PathLike, requirements_file: str | os.PathLike, **options) -> Path:
    """Install the wheels of `requirements_file` into target_dir with pip; all or nothing.

    pip installs into a staging folder beside target_dir; only a complete, verified install is
    renamed into place (replacing an older one), so a failure, a cancel or a crash never leaves a
    half-filled folder that activate() would load from. Raises OperationCancelled when `cancel()`
    turns true (pip is terminated, the staging folder removed), GpuRuntimeError on failure, and
    at once when another process is installing into or removing target_dir (an OS lock,
    runtime/cuda/gpu_install_lock.py, is held for the whole install: staging, pip, marking it
    complete). Options: python, index_args, progress(fraction, stage), cancel(), poll_interval.
    """
    target = Path(target_dir).resolve()
    _beside(target, _STAGING_SUFFIX)  # the root of the file system is refused before any lock
    with one_install_at_a_time(target) as lock_fd:
        return _install(target, requirements_file, lock_fd=lock_fd, **options)


def _install(
    target_dir: Path,
    requirements_file: str | os.PathLike,
    *,
    python: str = sys.executable,
    index_args: Iterable[str] = (),
    progress: Callable[[float, str], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    poll_interval: float = 0.1,
    lock_fd: int | None = None,
) -> Path:
    target = Path(target_dir).resolve()
    requirements_file = Path(requirements_file).resolve()
    requirements = parse_requirements(requirements_file)
    report = progress or (lambda fraction, stage: None)
    cancelled = cancel or (lambda: False)
    staging = _beside(target, _STAGING_SUFFIX)
    check_replaceable(target)  # before pip downloads a gigabyte it could not put in place
    _remove_ours(staging, STAGING_MARKER)  # left by an install that was killed (its lock went with it)
    staging.mkdir()
    (staging / STAGING_MARKER).write_text("made by Lean Image AI's GPU runtime installer\n", encoding="utf-8")
    site = staging / "site"
    tmp = staging / "tmp"
    tmp.mkdir()
    command = [
        python, "-m", "pip", "install", "--target", str(site),
        "--no-deps", "--require-hashes", "--only-binary=:all:", "--no-input",
        "--disable-pip-version-check", "--progress-bar", "off", "--no-warn-script-location",
        # ~1 GB of wheels: a second copy in pip's cache would double what the artist gives up
        "--no-cache-dir",
        *index_args, "-r", str(requirements_file),
    ]  # fmt: skip
    env = dict(os.environ)
    for key in ("TMPDIR", "TEMP", "TMP"):  # pip's own temporary files go with the staging folder
        env[key] = str(tmp)
    env["PYTHONUNBUFFERED"] = "1"
    report(0.0, "starting pip")
    try:
        try:
            process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                text=True,
                errors="replace",
                creationflags=getattr(subprocess, "CREATE_NO_WINDOW", 0),  # no console flashing on Windows
                # pip holds the install's lock too: killed, this process leaves a pip that still
                # writes into the staging folder, and no other install may take it meanwhile
                pass_fds=(lock_fd,) if lock_fd is not None and os.name != "nt" else (),
            )
        except OSError as exc:
            raise GpuRuntimeError(f"Cannot run {python} to install the GPU libraries: {exc}.") from exc
        lines: list[str] = []
        output: queue.Queue = queue.Queue()

        def read():  # a reader thread, so cancel is seen while pip is silent in a long download
            for line in process.stdout:
                output.put(line.rstrip("\n"))
            output.put(None)

        reader = threading.Thread(target=read, name="lean_image_ai:pip-output", daemon=True)
        reader.start()
        state = {"done": 0, "seen": set()}
        finished = False
        while not finished:
            if cancelled():
                _terminate(process)
                reader.join(5)
                raise OperationCancelled("Installing the GPU libraries was cancelled; nothing was installed.")
            try:
                line = output.get(timeout=poll_interval)
            except queue.Empty:
                continue
            if line is None:
                finished = True
                continue
            lines.append(line)
            step = progress_from_line(line, requirements, state)
            if step is not None:
                report(*step)
        returncode = process.wait()
        reader.join(5)
        if returncode != 0:
            raise pip_failure(returncode, lines, python)
        if cancelled():
            raise OperationCancelled("Installing the GPU libraries was cancelled; nothing was installed.")
        report(DOWNLOAD_SHARE + INSTALL_SHARE, "checking")
        _check_installed(site, requirements)
        (site / MARKER).write_text(
            json.dumps(
                {
                    "requirements": requirements_file.name,
                    "requirements_sha256": _sha256_text(requirements_file),
                    "packages": {r.name: r.version for r in requirements},
                    "installed": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
                indent=1,
            ),
            encoding="utf-8",
        )
        _move_into_place(site, target)
    finally:
        # Never masks the real outcome; a staging folder Windows kept locked is removed by the next install.
        shutil.rmtree(staging, ignore_errors=True)
    report(1.0, "installed")
    return target


def _terminate(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _check_installed(site: Path, requirements: list[Requirement]) -> None:
    """pip said it succeeded; make sure each pinned distribution is really there."""
    have = {}
    for info in site.glob("*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        have[normalized(name)] = version
    wrong = [f"{r.name}=={r.version}" for r in requirements if have.get(normalized(r.name)) != r.version]
    if wrong:
        raise GpuRuntimeError(f"pip finished but did not install {', '.join(wrong)}; nothing was installed.")


def _move_into_place(site: Path, target: Path) -> None:
    old = _beside(target, _OLD_SUFFIX)
    _remove_ours(old, MARKER)
    if _check_ours(target, MARKER):
        try:
            target.rename(old)
        except OSError as exc:  # Windows: libraries of the old install are loaded in this Blender
            raise GpuRuntimeError(
                f"Cannot replace the GPU libraries in {target}: {exc}. Restart Blender, then install again."
            ) from exc
    site.rename(target)
    with contextlib.suppress(OSError):
        _remove_ours(old, MARKER)
