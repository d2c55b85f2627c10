"""Installing and removing NVIDIA's CUDA/cuDNN libraries for onnxruntime-gpu (bpy).

Install runs on the job engine's download lane (operators/jobs.py), beside a model job: progress
in the preferences' GPU runtime box, Esc or the box's Cancel (``lean_image_ai.cancel_download``)
stops pip and nothing is left; in background mode it runs synchronously. It runs in a child
process (``python -m lean_image_ai gpu-runtime install --json-progress``, runtime/child_process.py)
pumped from the job's timer, so pip's output reader is no thread of Blender's. pip is Blender's own
(``sys.executable`` inside Blender) with its usual configuration and PIP_* environment variables.
What is installed, and how it is loaded, is the runtime's business (runtime/cuda/gpu_libraries.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import bpy
from bpy.props import StringProperty

from ..runtime import get_runtime
from ..runtime.cuda import gpu_libraries
from ..runtime.errors import LeanImageError, user_path
from ..runtime.log import doctor_process
from . import prefs
from .jobs import Job, WorkerOperator, downloads, manager
from .model_ops import child_job_task
from .options import path_options

JOB_KEY = "gpu_runtime"  # the download lane's key for this job (the preferences draw by it)
DOCTOR_TEXT = "Lean Image AI doctor"  # the Text Editor datablock that keeps the last report


def _requirements(path_property: str) -> Path:
    if path_property:
        path = user_path(bpy.path.abspath(path_property))
        if not path.is_file():
            raise LeanImageError(f"No requirements file at {path}.")
        return path
    shipped = prefs.gpu_requirements()
    if shipped is None:
        raise LeanImageError(
            f"This add-on zip has no CUDA libraries for {sys.platform} / Python "
            f"{sys.version_info.major}.{sys.version_info.minor}: CUDA is offered on Linux and Windows x64 "
            "with the zip built for this Blender version."
        )
    return shipped


def _install_description() -> str:
    size = prefs.gpu_runtime_size_text()
    return "Download onnxruntime-gpu with NVIDIA's CUDA 13 and cuDNN 9 libraries" + (f" ({size})" if size else "") + (
        " so models can run on an NVIDIA GPU"
    )


class LEAN_IMAGE_AI_OT_install_gpu_runtime(WorkerOperator, bpy.types.Operator):
    bl_idname = "lean_image_ai.install_gpu_runtime"
    bl_label = "Install GPU Runtime"
    bl_description = _install_description()  # the size the box shows, from the same requirement file
    bl_options = {"INTERNAL"}

    lane = downloads
    job_title = "Install GPU runtime"
    redraw_areas = frozenset({"PREFERENCES"})

    requirements: StringProperty(
        name="Requirements",
        description="Pinned requirements file to install from. Empty: the one this zip ships for this platform",
        subtype="FILE_PATH",
        options=path_options("SKIP_SAVE"),
    )

    def job_key(self) -> str:
        return JOB_KEY

    def prepare(self, context, job: Job):
        requirements = _requirements(self.requirements)
        if not bpy.app.online_access:
            raise LeanImageError(
                "Online access is disabled (Preferences > System > Network > Allow Online Access; "
                "headless: blender --online-mode), so the GPU libraries cannot be downloaded."
            )
        folder = prefs.gpu_runtime_folder(create_parent=True)
        # A folder the add-on did not make is named now, not after a gigabyte of download.
        gpu_libraries.check_replaceable(folder)
        job.inputs = (folder, requirements)
        return child_job_task(
            job, ["gpu-runtime", "install", "--target", str(folder), "--requirements", str(requirements)],
            "Installing the GPU libraries was cancelled; nothing was installed.",
        )

    def finish(self, context, job: Job):
        if job.state != "finished":
            level = "WARNING" if job.state == "cancelled" else "ERROR"
            self.report({level}, job.error_text or f"{job.name} did not finish.")
            return {"CANCELLED"}
        folder = Path(job.result["folder"])
        # Sessions made before (a CUDA request that fell back to CPU) would be reused as they are.
        if manager.running() is None:
            get_runtime().clear("gpu runtime installed")
        # Loaded by the process that runs the models, before its first CUDA session: never here.
        self.report({"INFO"}, f"Installed {gpu_libraries.installed_version(folder)} in {folder}.")
        return {"FINISHED"}


class LEAN_IMAGE_AI_OT_remove_gpu_runtime(bpy.types.Operator):
    """Delete the downloaded CUDA/cuDNN libraries (models then run on the CPU until they are installed again)"""

    bl_idname = "lean_image_ai.remove_gpu_runtime"
    bl_label = "Remove GPU Runtime"
    bl_options = {"INTERNAL"}

    def execute(self, context):
        download = downloads.running()
        if download is not None and download.key == JOB_KEY:
            self.report({"ERROR"}, "The GPU runtime is being installed; cancel that first.")
            return {"CANCELLED"}
        running = manager.running()
        if running is not None:
            self.report({"ERROR"}, f"'{running.name}' may be running on the GPU; wait or cancel it first.")
            return {"CANCELLED"}
        folder = prefs.gpu_runtime_folder()
        # CUDA sessions hold the libraries: drop every session before their files go.
        get_runtime().clear("gpu runtime removed")
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
    """What onnxruntime, the GPU and its CUDA/cuDNN libraries look like to this Blender: the report
    of python -m lean_image_ai doctor (also kept in the Text Editor)"""

    bl_idname = "lean_image_ai.run_doctor"
    bl_label = "Run Doctor"
    bl_options = {"INTERNAL"}

    def execute(self, context):
        if doctor_running():
            self.report({"WARNING"}, "The doctor is already running; its report comes here when it ends.")
            return {"CANCELLED"}
        folder = prefs.gpu_runtime_folder()
        try:
            doctor["run"] = doctor_process.start(folder if gpu_libraries.installed_version(folder) else None)
        except OSError as exc:
            self.report({"ERROR"}, f"Could not start {sys.executable} for the doctor: {exc}")
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


classes = (LEAN_IMAGE_AI_OT_install_gpu_runtime, LEAN_IMAGE_AI_OT_remove_gpu_runtime, LEAN_IMAGE_AI_OT_run_doctor)
