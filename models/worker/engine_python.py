"""Which Python runs the model worker (the *engine*), and whether it can (bpy-free, host-safe).

The worker may run under another interpreter than the host's: a studio's venv or conda
environment with onnxruntime-gpu, -directml, -openvino or plugin EP packages, on another Python
and numpy than Blender's. :func:`choose` picks it: the add-on preference, else
``LEAN_IMAGE_AI_WORKER_PYTHON`` (headless render nodes), else the host's own ``sys.executable``
(Blender's bundled Python with the zip's onnxruntime).

:func:`check` asks the candidate itself, in a child process with a deadline: its version and
whether numpy and onnxruntime import there. Nothing is imported here, no thread is started (the
child writes into a file; ``Popen.wait(timeout)`` waits on the process, where ``communicate``
would start reader threads on Windows), so Blender's process may call it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...runtime.errors import LeanImageError, printable

KILL_WAIT_S = 5.0  # a killed probe is reaped within this; Blender's process never waits longer

ENV_VAR = "LEAN_IMAGE_AI_WORKER_PYTHON"
MIN_VERSION = (3, 11)
CHECK_TIMEOUT_S = 30.0  # importing onnxruntime from a cold disk or a network share is slow
# Dropped from the candidate's environment: the host's search path (Blender's own site-packages,
# numpy built for its Python) must not shadow the candidate's own packages.
HOST_ONLY_VARIABLES = ("PYTHONPATH", "PYTHONHOME")

# What the candidate answers, as one JSON line; runs under any Python 3 (and says its version
# even under one too old for the worker).
PROBE = r"""
import json, sys
facts = {"version": list(sys.version_info[:3]), "executable": sys.executable}
for name in ("numpy", "onnxruntime"):
    try:
        module = __import__(name)
        facts[name] = {"version": getattr(module, "__version__", "?"), "file": getattr(module, "__file__", "")}
        if name == "onnxruntime":
            facts[name]["providers"] = list(module.get_available_providers())
    except Exception as exc:
        facts[name] = {"error": (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300]}
print(json.dumps(facts))
"""


class EnginePythonError(LeanImageError):
    """The chosen worker Python cannot run the worker; the message names what to install."""


@dataclass(frozen=True)
class EngineChoice:
    path: str
    source: str  # "preference", "environment" (LEAN_IMAGE_AI_WORKER_PYTHON) or "host"

    @property
    def described(self) -> str:
        return {
            "preference": "the add-on preference Worker Python",
            "environment": f"the environment variable {ENV_VAR}",
            "host": "this program's own Python",
        }[self.source]


@dataclass(frozen=True)
class EngineFacts:
    """What the chosen Python answered."""

    path: str
    version: tuple[int, ...]
    numpy: str
    onnxruntime: str
    onnxruntime_file: str
    providers: tuple[str, ...]

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


def choose(preference: str = "", environ=None) -> EngineChoice:
    """The interpreter to run the worker with: the preference, else the environment variable,
    else the host's own Python."""
    environ = os.environ if environ is None else environ
    if preference and preference.strip():
        return EngineChoice(str(Path(preference.strip()).expanduser()), "preference")
    named = environ.get(ENV_VAR, "").strip()
    if named:
        return EngineChoice(str(Path(named).expanduser()), "environment")
    return EngineChoice(sys.executable, "host")


def worker_python(preference: str = "", environ=None) -> str:
    """The path of the interpreter the worker runs under (:func:`choose`)."""
    return choose(preference, environ).path


def _fix() -> str:
    return (
        f"set the add-on preference Worker Python (or {ENV_VAR}) to a Python {MIN_VERSION[0]}.{MIN_VERSION[1]}+ "
        "with numpy and onnxruntime, or clear it to use Blender's own"
    )


def _install_hint(path: str, missing: list[str]) -> str:
    names = " ".join(missing)
    return (
        f'install {" and ".join(missing)} there: "{path}" -m pip install {names}'
        + (" (or onnxruntime-gpu, onnxruntime-directml, onnxruntime-openvino)" if "onnxruntime" in missing else "")
        + f", or {_fix()}."
    )


def _run_probe(path: str, timeout: float) -> str:
    """The candidate's answer (its stdout); raises EnginePythonError when it cannot give one."""
    env = {k: v for k, v in os.environ.items() if k not in HOST_ONLY_VARIABLES}
    env["PYTHONIOENCODING"] = "utf-8"
    with tempfile.TemporaryFile() as out:
        try:
            process = subprocess.Popen(
                [path, "-c", PROBE], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                creationflags=getattr(subprocess, "CREATE_NO_WINDOW", 0),
            )  # fmt: skip
        except OSError as exc:
            raise EnginePythonError(
                f"The worker Python {printable(path)} cannot be started ({exc.strerror or exc}): {_fix()}."
            ) from None
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):  # one that outlives its kill is left to the OS
                process.wait(timeout=KILL_WAIT_S)
            raise EnginePythonError(
                f"The worker Python {printable(path)} gave no answer in {timeout:.0f} s (a hung import?): {_fix()}."
            ) from None
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    if process.returncode != 0:
        last = (text.strip().splitlines() or ["no output"])[-1][:200]
        raise EnginePythonError(
            f"The worker Python {printable(path)} is not a Python that runs (exit code {process.returncode}: "
            f"{printable(last)}): {_fix()}."
        )
    return text


def _parse(path: str, text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        try:
            facts = json.loads(line)
        except ValueError:
            continue
        if isinstance(facts, dict) and "version" in facts:
            return facts
    raise EnginePythonError(f"The worker Python {printable(path)} gave no answer a Python gives: {_fix()}.")


def check(path: str, *, timeout: float = CHECK_TIMEOUT_S) -> EngineFacts:
    """Ask ``path`` in a child process; one line naming what to install when it cannot run the worker."""
    facts = _parse(path, _run_probe(path, timeout))
    version = tuple(int(part) for part in facts["version"])
    text = ".".join(map(str, version))
    if version[:2] < MIN_VERSION:
        raise EnginePythonError(
            f"The worker Python {printable(path)} is Python {text}; the worker needs Python "
            f"{MIN_VERSION[0]}.{MIN_VERSION[1]} or newer: install one (with numpy and onnxruntime: "
            f"python3 -m venv ENV, then ENV's pip install numpy onnxruntime) and {_fix()}."
        )
    missing = [name for name in ("numpy", "onnxruntime") if "error" in facts[name]]
    if missing:
        why = "; ".join(f"{name}: {facts[name]['error']}" for name in missing)
        raise EnginePythonError(
            f"The worker Python {printable(path)} (Python {text}) cannot import {' or '.join(missing)} "
            f"({printable(why)}): {_install_hint(path, missing)}"
        )
    ort = facts["onnxruntime"]
    return EngineFacts(path, version, facts["numpy"]["version"], ort["version"], ort["file"], tuple(ort["providers"]))


_checked: dict[tuple[str, int], EngineFacts] = {}


def checked(path: str, *, timeout: float = CHECK_TIMEOUT_S) -> EngineFacts:
    """:func:`check`, once per interpreter file as it is now (a venv rebuilt in place is asked again)."""
    try:
        stamp = Path(path).stat().st_mtime_ns
    except OSError:
        stamp = -1
    key = (path, stamp)
    if key not in _checked:
        _checked[key] = check(path, timeout=timeout)
    return _checked[key]


def forget() -> None:
    """Ask again (an engine installed into the chosen Python since)."""
    _checked.clear()
