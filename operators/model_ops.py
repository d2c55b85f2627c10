"""Model management operators: install (download), remove, register your own ONNX.

Installing runs on the job engine's download lane (operators/jobs.py): beside a model job, with
progress in the preferences' model list, Esc or the list's Cancel stops it and keeps the ``.part``
for a resume; in background mode it runs synchronously. The download, its checksum and the check of
a file to register run in a child process (``python -m lean_image_ai models install ID
--json-progress``, runtime/child_process.py), pumped from the job's timer: Blender's process starts
no thread and never imports onnxruntime for them. What is installed, and where, is the model
library's business (models/store/library.py).
"""

from __future__ import annotations

from pathlib import Path

import bpy
from bpy.props import EnumProperty, StringProperty

from ..models import families
from ..models.store import library, user_models
from ..models.worker import client as worker_client
from ..models.worker.remote_batch import in_process_runtime
from ..runtime.child_process import ChildTask
from ..runtime.errors import LeanImageError, user_path
from . import prefs
from .job_operator import ModalJobOperator
from .jobs import BlenderJob, downloads, manager, run_job
from .options import path_options


def child_job_task(job: BlenderJob, args: list[str], cancel_text: str) -> ChildTask:
    """``python -m lean_image_ai *args --json-progress`` as the job's task: its progress is the
    job's, the job's cancel stops it, and its outcome is left in the job when it ends."""
    return ChildTask([*args, "--json-progress"], report=job.report, cancelled=job.cancel_event.is_set,
                     cancel_text=cancel_text, on_over=lambda task: run_job(job, lambda _job: task.result()))  # fmt: skip


def _lookup(context, model_id: str):
    """(models folder, catalog, entry); LeanImageError when there is no such model."""
    folder = prefs.models_folder(context)
    known = library.catalog(folder)
    if not model_id:
        raise LeanImageError("No model chosen: set model_id to a catalog id.")
    try:
        return folder, known, known.get(model_id)
    except KeyError:
        ids = ", ".join(e.id for e in known.entries())
        raise LeanImageError(f"No model with id {model_id!r} in the catalog. Known ids: {ids}.") from None


class LEAN_IMAGE_AI_OT_install_model(ModalJobOperator, bpy.types.Operator):
    """Download a catalog model into the models folder (resumes a partial download)"""

    bl_idname = "lean_image_ai.install_model"
    bl_label = "Install Model"
    bl_options = {"INTERNAL"}

    lane = downloads
    job_title = "Install Model"
    redraw_areas = frozenset({"PREFERENCES"})

    model_id: StringProperty(name="Model", description="Catalog id of the model to install")

    def job_key(self) -> str:
        return self.model_id

    def prepare(self, context, job: BlenderJob):
        folder, _known, entry = _lookup(context, self.model_id)
        job.name, job.inputs = f"Install {entry.title}", entry
        if entry.is_user:
            raise LeanImageError(f"{entry.title} is your own file: there is nothing to download.")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LeanImageError(
                f"Cannot create the models folder {folder}: {exc}. Choose another one in the preferences."
            ) from exc
        # A file already in place (copied by hand, or from an earlier install) is only checked
        # against the catalog when there is no way to download a fresh one.
        offline = not bpy.app.online_access
        if entry.url and offline and library.status(entry, folder) != library.UNVERIFIED:
            raise LeanImageError(
                f"Online access is disabled (Preferences > System > Network > Allow Online Access; "
                f"headless: blender --online-mode), so {entry.title} cannot be downloaded from "
                f"{entry.url}. Enable it, or download the file yourself and save it as "
                f"{entry.filename!r} in {str(folder)!r}."
            )
        verify_only = offline and library.status(entry, folder) == library.UNVERIFIED
        part = library.installer.part_path(entry, folder)
        return child_job_task(
            job, ["models", "verify" if verify_only else "install", entry.id, "--models-dir", str(folder)],
            f"{job.name} was cancelled; what arrived is kept in {part} and Install resumes it.",
        )

    def finish(self, context, job: BlenderJob):
        if job.state == "finished":
            path, entry = Path(job.result["path"]), job.inputs
            self.report({"INFO"}, f"Installed {entry.title} ({library.format_bytes(path.stat().st_size)}) at {path}")
            return {"FINISHED"}
        level = "WARNING" if job.state == "cancelled" else "ERROR"
        self.report({level}, job.error_text or f"{job.name} did not finish.")
        return {"CANCELLED"}


class LEAN_IMAGE_AI_OT_cancel_download(bpy.types.Operator):
    """Stop the model download in progress (the partial file is kept; Install resumes it)"""

    bl_idname = "lean_image_ai.cancel_download"
    bl_label = "Cancel Download"
    bl_options = {"INTERNAL"}

    @classmethod
    def poll(cls, context):
        return downloads.running() is not None

    def execute(self, context):
        job = downloads.running()
        if job is None:
            return {"CANCELLED"}
        job.cancel()
        self.report({"INFO"}, f"Cancelling: {job.name}...")
        return {"FINISHED"}


class LEAN_IMAGE_AI_OT_remove_model(bpy.types.Operator):
    """Delete an installed model file, or unregister your own model (your file is kept)"""

    bl_idname = "lean_image_ai.remove_model"
    bl_label = "Remove Model"
    bl_options = {"INTERNAL"}

    model_id: StringProperty(name="Model", description="Catalog id of the model to remove")

    def execute(self, context):
        try:
            folder, known, entry = _lookup(context, self.model_id)
        except LeanImageError as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        download = downloads.running()
        if download is not None and download.key == entry.id:
            self.report({"ERROR"}, f"{entry.title} is downloading; cancel the download first.")
            return {"CANCELLED"}
        if entry.is_user:
            store = user_models.unregister(entry.id, folder)
            self.report(
                {"INFO"},
                f"Unregistered {entry.title}; your file {entry.path} was left in place (list saved in {store}).",
            )
            return {"FINISHED"}
        running = manager.running()
        if running is not None:
            self.report(
                {"ERROR"}, f"'{running.name}' is running and may be using this model; wait or cancel it first."
            )
            return {"CANCELLED"}
        dest = library.installer.model_path(entry, folder)
        worker_client.shared().ask("unload")  # its session of the file would keep it busy on Windows
        try:
            removed = library.remove(entry, folder, in_process_runtime())
        except OSError as exc:
            self.report({"ERROR"}, f"Could not delete {dest}: {exc}.")
            return {"CANCELLED"}
        if not removed:
            self.report({"WARNING"}, f"{entry.title} is not installed in {folder}; nothing was removed.")
            return {"CANCELLED"}
        self.report({"INFO"}, f"Removed {entry.title} ({dest}).")
        return {"FINISHED"}


FAMILY_ITEMS = tuple((f.id, f.title, f"A {f.title} model") for f in families.ALL)


class LEAN_IMAGE_AI_OT_register_user_model(ModalJobOperator, bpy.types.Operator):
    """Use your own ONNX file (e.g. another 4x upscaler) for one of the add-on's jobs; it is first
    checked to fit that job"""

    # the check is models/store/family_check.py's, run in a child (the docstring is the tooltip)

    bl_idname = "lean_image_ai.register_user_model"
    bl_label = "Register ONNX Model"
    bl_options = {"INTERNAL"}

    lane = downloads
    job_title = "Register Model"
    redraw_areas = frozenset({"PREFERENCES"})

    family: EnumProperty(name="Family", items=FAMILY_ITEMS, default="upscale")
    # SKIP_SAVE: a remembered path would skip the file browser on the next use
    filepath: StringProperty(name="ONNX File", subtype="FILE_PATH", options=path_options("SKIP_SAVE"))
    filter_glob: StringProperty(default="*.onnx", options={"HIDDEN"})

    def invoke(self, context, event):
        if self.filepath or bpy.app.background:
            return ModalJobOperator.invoke(self, context, event)
        context.window_manager.fileselect_add(self)
        return {"RUNNING_MODAL"}

    def execute(self, context):
        # after the file browser Blender calls execute: check the file under the modal timer
        if not bpy.app.background and context.window is not None:
            return self.start_modal(context)
        return ModalJobOperator.execute(self, context)

    def job_key(self) -> str:
        return f"register:{self.filepath}"

    def prepare(self, context, job: BlenderJob):
        if not self.filepath:
            raise LeanImageError("Choose the .onnx file to register.")
        path = user_path(bpy.path.abspath(self.filepath))
        if not path.is_file():
            raise LeanImageError(f"Cannot register {str(path)!r}: there is no file at that path.")
        folder = prefs.models_folder(context)
        job.name = f"Register {path.name}"
        # loading the file to check it imports onnxruntime: the child checks and saves it
        return child_job_task(
            job, ["models", "register", self.family, str(path), "--models-dir", str(folder)],
            f"{job.name} was cancelled; nothing was registered.",
        )

    def finish(self, context, job: BlenderJob):
        if job.state != "finished":
            level = "WARNING" if job.state == "cancelled" else "ERROR"
            self.report({level}, job.error_text or f"{job.name} did not finish.")
            return {"CANCELLED"}
        self.report({"WARNING"} if job.result["warning"] else {"INFO"}, job.result["text"])
        return {"FINISHED"}


def pre_unregister():
    """Stop a running download before its operator class goes away."""
    downloads.cancel_all()


classes = (
    LEAN_IMAGE_AI_OT_install_model,
    LEAN_IMAGE_AI_OT_cancel_download,
    LEAN_IMAGE_AI_OT_remove_model,
    LEAN_IMAGE_AI_OT_register_user_model,
)
