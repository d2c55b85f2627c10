"""The preferences' GPU engine box, the Worker Python and the doctor (bpy).

The engine (onnxruntime-gpu with NVIDIA's CUDA/cuDNN libraries) is installed by the user in a
terminal: the box shows the exact command for this machine with a Copy button and the download's
size, and sees the engine at the next redraw once its folder is complete (no restart: the folder
is read at each draw, and the device list is asked again). The add-on never runs pip.
"""

import sys

from ..models.worker import engine_python
from ..operators import gpu_ops
from ..operators.prefs import gpu_requirements, gpu_runtime_folder, gpu_runtime_size_text
from ..runtime.cuda import gpu_libraries  # never gpu_loading: only the model worker loads the libraries
from . import runtime_probe
from .layout_text import draw_safely, wrapped_labels

_seen: dict = {}  # "engine", "worker_python": what the last draw saw (the device list was asked with it)


def draw_gpu_runtime(layout, context) -> None:
    """Installed or not (and the command that installs it), Remove."""
    draw_safely(layout, "GPU engine box", _draw_gpu_runtime, context)


def _draw_gpu_runtime(layout, context) -> None:
    requirements = gpu_requirements()
    if requirements is None:
        return  # no CUDA build for this platform / Python (macOS): nothing to offer
    box = layout.box()
    box.label(text="GPU Engine (NVIDIA CUDA 13 + cuDNN 9)", icon="MEMORY")
    folder = gpu_runtime_folder()
    version = gpu_libraries.installed_version(folder)
    if "engine" in _seen and _seen["engine"] != version:
        runtime_probe.forget()  # installed (or removed) from a terminal: ask the device list again
    _seen["engine"] = version
    if version:
        _draw_gpu_installed(box, folder, version, requirements)
        box.operator("lean_image_ai.remove_gpu_runtime", text="Remove", icon="TRASH")
    else:
        size = gpu_runtime_size_text()
        wrapped_labels(box, "Not installed: models run on the CPU. To run them on an NVIDIA GPU, run this "
                       f"command in a terminal ({size or 'size unknown'} download; Blender may stay open):")
        _draw_command(box)


def _draw_command(box) -> None:
    col = box.column(align=True)
    wrapped_labels(col, gpu_ops.install_command(), width=110)
    row = box.row()
    row.operator("lean_image_ai.copy_engine_command", icon="COPYDOWN")
    if sys.platform == "win32":
        row.label(text="Paste it into Command Prompt (cmd)")


def _draw_gpu_installed(box, folder, version: str, requirements) -> None:
    box.label(text=f"Installed: {version}", icon="CHECKMARK")
    wrapped_labels(box, f"Folder: {folder}")
    if not gpu_libraries.is_current(folder, requirements):
        wrapped_labels(box, "This add-on version pins other library versions; to update them, run:", icon="INFO")
        _draw_command(box)


def draw_worker_python(layout, prefs) -> None:
    draw_safely(layout, "Worker Python", _draw_worker_python, prefs)


def _draw_worker_python(layout, prefs) -> None:
    box = layout.box()
    row = box.row()
    row.prop(prefs, "worker_python")
    row.operator("lean_image_ai.check_worker_python", text="Check", icon="VIEWZOOM")
    choice = engine_python.choose(prefs.worker_python)
    if "worker_python" in _seen and _seen["worker_python"] != choice.path:
        runtime_probe.forget()  # another interpreter: the device list is its onnxruntime's
    _seen["worker_python"] = choice.path
    if choice.source == "host":
        box.label(text="Models run in Blender's own Python, with the runtime this zip brings.")
        return
    wrapped_labels(box, f"Models run in {choice.path} (from {choice.described}).")
    last = gpu_ops.worker_python_check
    if last["path"] == choice.path and last["text"]:
        wrapped_labels(box, last["text"], icon="CHECKMARK" if last["ok"] else "ERROR", alert=not last["ok"])


def draw_doctor(layout) -> None:
    """The doctor's box: its button, and its last report (what the command line's prints)."""
    draw_safely(layout, "Doctor", _draw_doctor)


def _draw_doctor(layout) -> None:
    box = layout.box()
    row = box.row()
    row.label(text="Doctor: why the GPU is or is not used: Python, onnxruntime, providers, libraries", icon="INFO")
    sub = row.row()
    sub.enabled = not gpu_ops.doctor_running()
    sub.operator("lean_image_ai.run_doctor", text="Run Doctor", icon="VIEWZOOM")
    run = gpu_ops.doctor["run"]
    if run is None:
        return
    if run.running:
        box.label(text="Running python -m lean_image_ai doctor...", icon="SORTTIME")
        return
    col = box.column(align=True)
    col.alert = not run.ok
    for line in run.text.splitlines():
        wrapped_labels(col, line, width=110)
    box.label(text=f"Also in the Text Editor: {gpu_ops.DOCTOR_TEXT}")
