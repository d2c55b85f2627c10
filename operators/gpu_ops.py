"""The GPU engine in Blender (bpy): its terminal command copied, removed, the worker's Python
checked, and the doctor.

The add-on never installs Python packages (extensions.blender.org, "Be Self Contained"): the engine,
onnxruntime-gpu with NVIDIA's CUDA/cuDNN libraries, is installed by the user in a terminal with the
command the preferences show (``python FOLDER gpu install --target ...``, ui/cli/cli_gpu.py;
runtime/cuda/engine_command.py writes it). The preferences see it once its folder is complete, with
no restart: the next worker started loads it (runtime/cuda/gpu_loading.py), Blender never does.
"""

from __future__ import annotations

import sys

import bpy

from ..models.worker import client as worker_client
from ..models.worker import engine_python, host_record
from ..runtime.cuda import engine_command, gpu_libraries
from ..runtime.log import doctor_process
from . import prefs
from .jobs import manager

DOCTOR_TEXT = "Lean Image AI doctor"  # the Text Editor datablock that keeps the last report


def install_command() -> str:
    """The engine's install command for this machine: Blender's Python, the add-on folder, the
    folder the add-on loads the engine from."""
    return engine_command.install_command(sys.executable, prefs.gpu_runtime_folder())


class LEAN_IMAGE_AI_OT_copy_engine_command(bpy.types.Operator):
    """Copy the command that installs the GPU engine; paste it into a terminal (Command Prompt on Windows)"""

    bl_idname = "lean_image_ai.copy_engine_command"
    bl_label = "Copy Command"
    bl_options = {"INTERNAL"}

    def execute(self, context):
        context.window_manager.clipboard = install_command()
        self.report({"INFO"}, "Copied: paste it into a terminal; Blender sees the engine when it is installed.")
        return {"FINISHED"}


# The last check of the Worker Python preference: (path, one line), for the preferences to show.
worker_python_check: dict = {"path": None, "text": "", "ok": False}


def check_worker_python(path: str) -> engine_python.EngineFacts:
    """The preference's interpreter asked (once while it answers well); the line kept for the box."""
    worker_python_check["path"] = path
    try:
        facts = engine_python.checked(path)
    except engine_python.EnginePythonError as exc:
        worker_python_check.update(text=str(exc), ok=False)
        raise
    worker_python_check.update(
        text=f"Python {facts.version_text}, numpy {facts.numpy}, onnxruntime {facts.onnxruntime} "
        f"({', '.join(facts.providers)})", ok=True,
    )  # fmt: skip
    return facts


class LEAN_IMAGE_AI_OT_check_worker_python(bpy.types.Operator):
    """Ask the Worker Python (or LEAN_IMAGE_AI_WORKER_PYTHON) whether it can run the models: its version, numpy and onnxruntime"""

    bl_idname = "lean_image_ai.check_worker_python"
    bl_label = "Check Worker Python"
    bl_options = {"INTERNAL"}

    def execute(self, context):
        choice = engine_python.choose(getattr(prefs.get_prefs(context), "worker_python", ""))
        engine_python.forget()
        try:
            check_worker_python(choice.path)
        except engine_python.EnginePythonError as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        self.report({"INFO"}, f"{choice.path}: {worker_python_check['text']}")
        return {"FINISHED"}


class LEAN_IMAGE_AI_OT_remove_gpu_runtime(bpy.types.Operator):
    """Delete the downloaded CUDA/cuDNN libraries (models then run on the CPU until they are installed again)"""

    bl_idname = "lean_image_ai.remove_gpu_runtime"
    bl_label = "Remove GPU Runtime"
    bl_options = {"INTERNAL"}

    def execute(self, context):
        running = manager.running()
        if running is not None:
            self.report({"ERROR"}, f"'{running.name}' may be running on the GPU; wait or cancel it first.")
            return {"CANCELLED"}
        folder = prefs.gpu_runtime_folder()
        # the model worker loaded the libraries (Blender's process never does): it ends before their files go
        worker_client.shared().stop()
        host_record.worker_ended()
        try:
            removed = gpu_libraries.remove(folder)
        except gpu_libraries.GpuRuntimeError as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        if not removed:
            self.report({"WARNING"}, f"No GPU runtime is installed in {folder}; nothing was removed.")
            return {"CANCELLED"}
        self.report(
            {"INFO"}, f"Removed the GPU runtime from {folder}. Libraries already loaded stay until Blender restarts."
        )
        return {"FINISHED"}


# ---- doctor -----------------------------------------------------------------------------------
# The report of `python -m lean_image_ai doctor`, made by that command in a child process (Blender
# never imports onnxruntime for it, and never waits): a timer polls it. One run at a time.
doctor: dict = {"run": None}


def doctor_running() -> bool:
    run = doctor["run"]
    return run is not None and run.running


def poll_doctor():
    """The timer: None (stop) once the report is in, else the seconds to the next look."""
    run = doctor["run"]
    if run is None or not doctor_process.poll(run):
        return None if run is None else 0.25
    text = bpy.data.texts.get(DOCTOR_TEXT) or bpy.data.texts.new(DOCTOR_TEXT)
    text.from_string(run.text + "\n")
    for window in getattr(bpy.context.window_manager, "windows", ()):
        for area in window.screen.areas:
            if area.type == "PREFERENCES":
                area.tag_redraw()
    return None


class LEAN_IMAGE_AI_OT_run_doctor(bpy.types.Operator):
    """Why the GPU is or is not used: the worker's Python, onnxruntime, the providers that can run and why others
    cannot, and the one thing to do next (python -m lean_image_ai doctor; also kept in the Text Editor)"""

    bl_idname = "lean_image_ai.run_doctor"
    bl_label = "Run Doctor"
    bl_options = {"INTERNAL"}

    def execute(self, context):
        if doctor_running():
            self.report({"WARNING"}, "The doctor is already running; its report comes here when it ends.")
            return {"CANCELLED"}
        folder = prefs.gpu_runtime_folder()
        preference = getattr(prefs.get_prefs(context), "worker_python", "")
        choice = engine_python.choose(preference)
        python = None if choice.source == "host" else choice.path  # the report is about the worker's onnxruntime
        engine = folder if python is None and gpu_libraries.installed_version(folder) else None
        try:
            doctor["run"] = doctor_process.start(engine, worker_python=preference, python=python)
        except OSError as exc:
            self.report({"ERROR"}, f"Could not start {python or sys.executable} for the doctor: {exc}")
            return {"CANCELLED"}
        if not bpy.app.timers.is_registered(poll_doctor):
            bpy.app.timers.register(poll_doctor, first_interval=0.25)
        return {"FINISHED"}


def pre_unregister():
    # A timer Blender holds after an uninstall keeps this module, and bpy, alive (ui/prop_callbacks.py)
    if bpy.app.timers.is_registered(poll_doctor):
        bpy.app.timers.unregister(poll_doctor)
    if doctor["run"] is not None:
        doctor_process.stop(doctor["run"])
        doctor["run"] = None


classes = (
    LEAN_IMAGE_AI_OT_copy_engine_command,
    LEAN_IMAGE_AI_OT_check_worker_python,
    LEAN_IMAGE_AI_OT_remove_gpu_runtime,
    LEAN_IMAGE_AI_OT_run_doctor,
)
