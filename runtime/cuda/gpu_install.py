"""Installing the NVIDIA CUDA/cuDNN wheels with pip, all or nothing (bpy-free).

What is installed and where, and removing it, is runtime/cuda/gpu_libraries.py's; this module runs
pip and reads its output on a thread of its own, so it is loaded only where an install runs: the
command line (``python -m lean_image_ai gpu install``), which Blender starts as a child process.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import OperationCancelled
from .gpu_libraries import (
    _OLD_SUFFIX,
    _STAGING_SUFFIX,
    MARKER,
    STAGING_MARKER,
    GpuRuntimeError,
    Requirement,
    _beside,
    _check_ours,
    _normalized,
    _remove_ours,
    _sha256_text,
    check_replaceable,
    parse_requirements,
)

# Share of the progress bar for each phase. pip reports no byte progress that every pip version
# prints the same way, so downloads advance per wheel, weighted by the sizes the file records.
_DOWNLOAD_SHARE = 0.9
_INSTALL_SHARE = 0.08

_COLLECTING = re.compile(r"^\s*(?:Collecting|Processing|Obtaining)\s+(\S+)")



def _progress_from_line(line: str, requirements: list[Requirement], state: dict) -> tuple[float, str] | None:
    """(fraction, stage) for one line of pip's output, or None when the line says nothing new."""
    sized = all(r.size for r in requirements)  # by bytes when every size is known, else per wheel
    weight = {_normalized(r.name): r.size if sized else 1 for r in requirements}
    total = sum(weight.values())
    collecting = _COLLECTING.match(line)
    if collecting:
        spec = collecting.group(1)
        name = _normalized(re.split(r"[=<>~!\[ ]", Path(spec).name.split("-")[0] if spec.endswith(".whl") else spec)[0])
        if name in weight and name not in state["seen"]:
            # the previous wheel is complete once pip moves on to the next one
            state["done"] += state.pop("current_weight", 0)
            state["seen"].add(name)
            state["current_weight"] = weight[name]
            return _DOWNLOAD_SHARE * state["done"] / total, f"downloading {name} ({len(state['seen'])}/{len(requirements)})"
        return None
    if line.startswith("Installing collected packages"):
        state["done"] += state.pop("current_weight", 0)
        return _DOWNLOAD_SHARE, "installing"
    return None


def _pip_failure(returncode: int, lines: list[str], python: str) -> GpuRuntimeError:
    text = "\n".join(lines)
    tail = " | ".join(ln.strip() for ln in lines[-6:] if ln.strip())
    if "No module named pip" in text:
        return GpuRuntimeError(
            f"The Python at {python} has no pip, so the GPU libraries cannot be installed. Run "
            f"'{python} -m ensurepip' once, then install again."
        )
    if "DO NOT MATCH THE HASHES" in text:
        return GpuRuntimeError(
            "A downloaded GPU library does not match the checksum this add-on version expects, so "
            f"nothing was installed (pip: {tail}). Check pip's index settings, or update the add-on."
        )
    return GpuRuntimeError(
        f"pip could not install the GPU libraries (exit {returncode}); nothing was installed. "
        f"Check the network and pip's settings. pip said: {tail or 'nothing'}"
    )


def install(
    target_dir: str | os.PathLike,
    requirements_file: str | os.PathLike,
    *,
    python: str = sys.executable,
    index_args: Iterable[str] = (),
    progress: Callable[[float, str], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    poll_interval: float = 0.1,
) -> Path:
    """Install the wheels of `requirements_file` into target_dir with pip; all or nothing.

    pip installs into a staging folder beside target_dir; only a complete, verified install is
    renamed into place (replacing an older one), so a failure, a cancel or a crash never leaves a
    half-filled folder that activate() would load from. Raises OperationCancelled when `cancel()`
    turns true (pip is terminated, the staging folder removed), GpuRuntimeError on failure.
    """
    target = Path(target_dir).resolve()
    requirements_file = Path(requirements_file).resolve()
    requirements = parse_requirements(requirements_file)
    report = progress or (lambda fraction, stage: None)
    cancelled = cancel or (lambda: False)
    staging = _beside(target, _STAGING_SUFFIX)
    check_replaceable(target)  # before pip downloads a gigabyte it could not put in place
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_ours(staging, STAGING_MARKER)  # left by a Blender that was killed mid-install
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
            step = _progress_from_line(line, requirements, state)
            if step is not None:
                report(*step)
        returncode = process.wait()
        reader.join(5)
        if returncode != 0:
            raise _pip_failure(returncode, lines, python)
        if cancelled():
            raise OperationCancelled("Installing the GPU libraries was cancelled; nothing was installed.")
        report(_DOWNLOAD_SHARE + _INSTALL_SHARE, "checking")
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
        have[_normalized(name)] = version
    wrong = [f"{r.name}=={r.version}" for r in requirements if have.get(_normalized(r.name)) != r.version]
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
