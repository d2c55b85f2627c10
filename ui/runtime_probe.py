"""What onnxruntime offers here, asked once a session of a child process (bpy): whether it
imports, its providers, and which of them can run (runtime's ``runnable_providers``). The child
runs under the worker's Python (the Worker Python preference, else LEAN_IMAGE_AI_WORKER_PYTHON,
else Blender's own: models/worker/engine_python.py), so the menu offers what the worker can run.

Blender's process never imports onnxruntime (its native libraries, and a GPU provider's, would
stay loaded for the whole session): the device menu, the preferences' "Can run on" line and the
panel's import check read :func:`answer`, which is None until ``python -m lean_image_ai doctor
--providers`` has answered. With a UI the child is pumped by a ``bpy.app.timers`` timer (no
thread, no wait) and the areas are redrawn when it answers; in background mode, where timers do
not run, the first question waits for it.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

import bpy

from ..runtime.child_process import ChildTask
from ..runtime.errors import LeanImageError

POLL_S = 0.2
CPU_ONLY = ["CPUExecutionProvider"]

_state: dict = {"task": None, "answer": None}
on_answer: list[Callable[[], None]] = []  # told once the answer is in (caches built on the guess)


def answer() -> dict | None:
    """{"onnxruntime_error": str | None, "installed": [...], "runnable": [...]}; None while the
    child has not answered (it is started by the first question)."""
    if _state["answer"] is None:
        _start()
    return _state["answer"]


def runnable() -> list[str]:
    """The providers that can run here; CPU only until the child has answered."""
    known = answer()
    return list(known["runnable"]) if known and known["runnable"] else list(CPU_ONLY)


def installed() -> list[str]:
    known = answer()
    return list(known["installed"]) if known and known["installed"] else list(CPU_ONLY)


def onnxruntime_problem() -> str | None:
    """The import error's one line (what to do included); None when it imports or is not known yet."""
    known = answer()
    return known["onnxruntime_error"] if known else None


def _start() -> None:
    if _state["task"] is not None:
        return
    try:
        python, engine_args = _worker_engine()
        _state["task"] = ChildTask(["doctor", "--providers", *engine_args], python=python)
    except LeanImageError as exc:
        _settle({"onnxruntime_error": str(exc), "installed": [], "runnable": []})
        return
    if bpy.app.background:
        _poll(wait=True)
    elif not bpy.app.timers.is_registered(_poll):
        bpy.app.timers.register(_poll, first_interval=POLL_S)


def _worker_engine() -> tuple[str | None, list[str]]:
    """(the worker's interpreter, None for Blender's own; the child's engine arguments)."""
    from ..models.worker import engine_python
    from ..operators.prefs import get_prefs

    choice = engine_python.choose(getattr(get_prefs(), "worker_python", ""))
    if choice.source != "host":  # its own onnxruntime: the installed engine is built for Blender's Python
        return choice.path, []
    return None, _engine_args()


def _engine_args() -> list[str]:
    """The installed GPU engine, loaded by the child first as the worker loads it, so the device
    list offers what the worker can run."""
    from ..operators.prefs import gpu_runtime_folder
    from ..runtime.cuda import gpu_libraries

    try:
        folder = gpu_runtime_folder()
    except Exception:  # no user folder to look in: then nothing is installed there either
        return []
    return ["--gpu-runtime", str(folder)] if gpu_libraries.installed_version(folder) else []


def _poll(wait: bool = False):
    """The timer: None (stop) once the answer is in, else the seconds to the next look."""
    task = _state["task"]
    if task is None:
        return None
    if not wait and not task.pump(0.0):
        return POLL_S
    try:
        known = task.wait(POLL_S) if wait else task.result()  # wait: with its deadline for a silent child
    except LeanImageError as exc:
        known = {"onnxruntime_error": f"The runtime check could not run: {exc}", "installed": [], "runnable": []}
    _settle(known)
    return None


def _settle(known: dict) -> None:
    _state["answer"] = known
    for listener in list(on_answer):
        try:
            listener()
        except Exception:  # a cache that cannot be reset must not stop the others
            traceback.print_exc()
    for window in getattr(bpy.context.window_manager, "windows", ()):
        for area in window.screen.areas:
            area.tag_redraw()


def forget() -> None:
    """Stop a child still running and forget the answer (unregister; tests)."""
    if bpy.app.timers.is_registered(_poll):
        bpy.app.timers.unregister(_poll)
    task = _state["task"]
    if task is not None and not task.done:
        task.cancel()
    _state["task"] = _state["answer"] = None
