"""Model management operators: install (download), remove, register your own ONNX, clear sessions.

Downloads are not model jobs: they never touch the runtime, so they run beside a model job
instead of waiting for it. They have their own one-at-a-time state (:data:`downloads`), which
the preferences' model list draws (progress, Cancel). With a UI, ``install_model`` downloads on
a worker thread under a modal timer (Esc or the list's Cancel stops it and keeps the ``.part``
for a resume); in background mode it downloads synchronously.

The catalog is ``ui.preferences.get_catalog(context)`` (built-ins plus the user's registered
files), looked up on that module at call time so tests can swap it.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import bpy
from bpy.props import EnumProperty, StringProperty

from ..models import installer
from ..models.catalog import FAMILIES
from ..runtime import get_runtime
from ..runtime.errors import LeanImageError, ModelFileError, OperationCancelled
from ..ui import preferences
from .jobs import manager as job_manager

TIMER_INTERVAL = 0.2
JOIN_TIMEOUT = 10.0
# Cancel is checked between chunks: small enough that Esc answers quickly on a slow line.
DOWNLOAD_CHUNK_SIZE = 256 * 1024


# ---- download state (bpy-free; the worker thread only writes plain attributes) ---------------


@dataclass
class Download:
    entry_id: str
    title: str
    done: int = 0
    total: int | None = None
    stage: str = "connecting"
    state: str = "running"  # running | finished | failed | cancelled
    error_text: str = ""
    path: Path | None = None
    verify_only: bool = False  # the file is there: only check it against the catalog
    cancel_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    started: float = field(default_factory=time.monotonic)

    def report(self, done: int, total: int | None) -> None:
        self.done, self.total = done, total
        self.stage = "verifying" if total and done >= total else "downloading"

    def cancel(self) -> None:
        self.cancel_event.set()
        if self.state == "running":
            self.stage = "cancelling"

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0

    @property
    def finished(self) -> bool:
        """The worker is done, whatever the outcome (``done`` is the byte count)."""
        return self.state != "running"


class DownloadBusyError(LeanImageError):
    pass


class DownloadManager:
    """The one download in progress (``current``) and the outcome of the latest (``last``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.current: Download | None = None
        self.last: Download | None = None

    def begin(self, entry) -> Download:
        with self._lock:
            running = self.current
            if running is not None and not running.finished:
                raise DownloadBusyError(
                    f"{running.title} is still downloading ({preferences.format_bytes(running.done)}). "
                    "Wait for it to finish or cancel it in the add-on preferences."
                )
            self.current = Download(entry.id, entry.title)
            return self.current

    def end(self, download: Download) -> None:
        with self._lock:
            if self.current is download:
                self.current = None
            self.last = download

    def cancel_all(self, *, join_timeout: float = JOIN_TIMEOUT) -> None:
        download = self.current
        if download is None:
            return
        download.cancel()
        if download.thread is not None and download.thread is not threading.current_thread():
            download.thread.join(join_timeout)
        self.end(download)


downloads = DownloadManager()


def run_download(download: Download, entry, models_dir) -> None:
    """The worker body (no bpy): the installer, with the outcome written into ``download``."""
    try:
        if download.verify_only:
            download.stage = "verifying"
            download.path = installer.verify_installed(entry, models_dir, cancel=download.cancel_event.is_set)
            download.done = download.total = download.path.stat().st_size
        else:
            download.path = installer.install(
                entry,
                models_dir,
                progress=download.report,
                cancel=download.cancel_event.is_set,
                chunk_size=DOWNLOAD_CHUNK_SIZE,
            )
        download.state = "finished"
    except OperationCancelled as exc:
        download.error_text, download.state = str(exc), "cancelled"
    except LeanImageError as exc:
        download.error_text, download.state = str(exc), "failed"
    except Exception as exc:  # a bug: traceback to the console, one line for the user
        traceback.print_exc()
        download.error_text = f"Unexpected error while installing {entry.title}: {type(exc).__name__}: {exc}"
        download.state = "failed"


def _lookup(operator, context, model_id: str):
    """(catalog, entry) or None after reporting why."""
    catalog = preferences.get_catalog(context)
    if not model_id:
        operator.report({"ERROR"}, "No model chosen: set model_id to a catalog id.")
        return None
    try:
        return catalog, catalog.get(model_id)
    except KeyError:
        known = ", ".join(e.id for e in catalog.entries())
        operator.report({"ERROR"}, f"No model with id {model_id!r} in the catalog. Known ids: {known}.")
        return None


def _job_running() -> str | None:
    job = job_manager.current
    return job.name if job is not None and not job.done else None


def _redraw_preferences(context) -> None:
    wm = getattr(context, "window_manager", None)
    for window in getattr(wm, "windows", ()):
        for area in window.screen.areas:
            if area.type == "PREFERENCES":
                area.tag_redraw()


# ---- operators --------------------------------------------------------------------------------


class LEAN_IMAGE_AI_OT_install_model(bpy.types.Operator):
    """Download a catalog model into the models folder (resumes a partial download)"""

    bl_idname = "lean_image_ai.install_model"
    bl_label = "Install Model"
    bl_options = {"INTERNAL"}

    model_id: StringProperty(name="Model", description="Catalog id of the model to install")

    _download: Download | None = None
    _timer = None

    def _start(self, context):
        """(download, entry, models_dir) or a set to return after reporting why not."""
        found = _lookup(self, context, self.model_id)
        if found is None:
            return {"CANCELLED"}
        _catalog, entry = found
        if entry.is_user:
            self.report({"INFO"}, f"{entry.title} is your own file: there is nothing to download.")
            return {"CANCELLED"}
        try:
            models_dir = preferences.get_models_dir(context)
        except OSError as exc:
            self.report(
                {"ERROR"}, f"Cannot create the models folder: {exc}. Choose another one in the preferences."
            )
            return {"CANCELLED"}
        # A file already in place (copied by hand, or from an earlier install) is only checked
        # against the catalog when there is no way to download a fresh one.
        verify_only = preferences.model_status(entry, models_dir) == preferences.UNVERIFIED and (
            entry.url is None or not bpy.app.online_access
        )
        if entry.url and not verify_only and not bpy.app.online_access:
            dest = installer.model_path(entry, models_dir)
            self.report(
                {"ERROR"},
                f"Online access is disabled (Preferences > System > Network > Allow Online Access; "
                f"headless: blender --online-mode), so {entry.title} cannot be downloaded from "
                f"{entry.url}. Enable it, or download the file yourself and save it as "
                f"{dest.name!r} in {str(models_dir)!r}.",
            )
            return {"CANCELLED"}
        try:
            download = downloads.begin(entry)
        except DownloadBusyError as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        download.verify_only = verify_only
        return download, entry, models_dir

    def execute(self, context):
        started = self._start(context)
        if isinstance(started, set):
            return started
        download, entry, models_dir = started
        try:
            run_download(download, entry, models_dir)
        finally:
            downloads.end(download)
        return self._finish(download)

    def invoke(self, context, event):
        if bpy.app.background:
            return self.execute(context)
        started = self._start(context)
        if isinstance(started, set):
            return started
        download, entry, models_dir = started
        download.thread = threading.Thread(
            target=run_download,
            args=(download, entry, models_dir),
            name=f"lean_image_ai:install:{entry.id}",
            daemon=True,
        )
        download.thread.start()
        self._download = download
        wm = context.window_manager
        self._timer = wm.event_timer_add(TIMER_INTERVAL, window=context.window)
        wm.modal_handler_add(self)
        return {"RUNNING_MODAL"}

    def modal(self, context, event):
        download = self._download
        if event.type == "ESC" and event.value == "PRESS":
            download.cancel()
        if event.type != "TIMER":
            return {"PASS_THROUGH"}
        _redraw_preferences(context)
        if not download.finished:
            return {"RUNNING_MODAL"}
        self._stop_timer(context)
        downloads.end(download)
        _redraw_preferences(context)
        return self._finish(download)

    def cancel(self, context):
        """Called by Blender when the modal operator is stopped from outside (file load, quit)."""
        if self._download is not None:
            self._download.cancel()
            if self._download.thread is not None:
                self._download.thread.join(JOIN_TIMEOUT)
            downloads.end(self._download)
        self._stop_timer(context)

    def _stop_timer(self, context):
        if self._timer is not None:
            context.window_manager.event_timer_remove(self._timer)
            self._timer = None

    def _finish(self, download: Download):
        if download.state == "finished":
            size = preferences.format_bytes(download.path.stat().st_size) if download.path else "?"
            self.report({"INFO"}, f"Installed {download.title} ({size}) at {download.path}")
            return {"FINISHED"}
        level = {"cancelled": "WARNING"}.get(download.state, "ERROR")
        self.report({level}, download.error_text or f"Installing {download.title} did not finish.")
        return {"CANCELLED"}


class LEAN_IMAGE_AI_OT_cancel_download(bpy.types.Operator):
    """Stop the model download in progress (the partial file is kept; Install resumes it)"""

    bl_idname = "lean_image_ai.cancel_download"
    bl_label = "Cancel Download"
    bl_options = {"INTERNAL"}

    @classmethod
    def poll(cls, context):
        return downloads.current is not None and not downloads.current.finished

    def execute(self, context):
        download = downloads.current
        if download is None:
            return {"CANCELLED"}
        download.cancel()
        self.report({"INFO"}, f"Cancelling the download of {download.title}...")
        return {"FINISHED"}


class LEAN_IMAGE_AI_OT_remove_model(bpy.types.Operator):
    """Delete an installed model file, or unregister your own model (your file is kept)"""

    bl_idname = "lean_image_ai.remove_model"
    bl_label = "Remove Model"
    bl_options = {"INTERNAL"}

    model_id: StringProperty(name="Model", description="Catalog id of the model to remove")

    def execute(self, context):
        found = _lookup(self, context, self.model_id)
        if found is None:
            return {"CANCELLED"}
        catalog, entry = found
        current = downloads.current
        if current is not None and not current.finished and current.entry_id == entry.id:
            self.report({"ERROR"}, f"{entry.title} is downloading; cancel the download first.")
            return {"CANCELLED"}
        if entry.is_user:
            catalog.remove_user_model(entry.id)
            store = preferences.save_user_catalog(catalog, context)
            self.report(
                {"INFO"},
                f"Unregistered {entry.title}; your file {entry.path} was left in place (list saved in {store}).",
            )
            return {"FINISHED"}
        running = _job_running()
        if running:
            self.report(
                {"ERROR"}, f"'{running}' is running and may be using this model; wait or cancel it first."
            )
            return {"CANCELLED"}
        models_dir = preferences.get_models_dir(context, create=False)
        dest = installer.model_path(entry, models_dir)
        runtime = get_runtime()
        for handle in runtime.cached_sessions():
            if handle.model_path == dest.resolve():  # an open session would keep the file busy
                runtime.evict(handle, reason="model removed")
        try:
            removed = installer.remove(entry, models_dir)
        except OSError as exc:
            self.report({"ERROR"}, f"Could not delete {dest}: {exc}.")
            return {"CANCELLED"}
        if not removed:
            self.report({"WARNING"}, f"{entry.title} is not installed in {models_dir}; nothing was removed.")
            return {"CANCELLED"}
        self.report({"INFO"}, f"Removed {entry.title} ({dest}).")
        return {"FINISHED"}


FAMILY_ITEMS = tuple(
    (f, preferences.FAMILY_TITLES[f], f"A {preferences.FAMILY_TITLES[f]} model") for f in FAMILIES
)


def _tensor_summary(infos) -> str:
    def dims(shape):
        return "x".join("?" if d is None or isinstance(d, str) else str(d) for d in shape)

    return ", ".join(f"{t.name} {dims(t.shape)} {t.type.removeprefix('tensor(').rstrip(')')}" for t in infos)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def check_loadable(path: Path) -> tuple[str, str]:
    """Load ``path`` through the shared runtime on the CPU; returns (inputs, outputs) summaries.

    A session this check creates is evicted again (registering must not keep weights in
    memory); one that was already cached for a running scene is left alone.
    """
    runtime = get_runtime()
    before = {id(h) for h in runtime.cached_sessions()}
    handle = runtime.session(path, "cpu")
    try:
        return _tensor_summary(handle.inputs), _tensor_summary(handle.outputs)
    finally:
        if id(handle) not in before:
            runtime.evict(handle, reason="registration check")


class LEAN_IMAGE_AI_OT_register_user_model(bpy.types.Operator):
    """Use your own ONNX file (e.g. another 4x upscaler) as a model of the chosen family"""

    bl_idname = "lean_image_ai.register_user_model"
    bl_label = "Register ONNX Model"
    bl_options = {"INTERNAL"}

    family: EnumProperty(name="Family", items=FAMILY_ITEMS, default="upscale")
    # SKIP_SAVE: a remembered path would skip the file browser on the next use
    filepath: StringProperty(name="ONNX File", subtype="FILE_PATH", options={"SKIP_SAVE"})
    filter_glob: StringProperty(default="*.onnx", options={"HIDDEN"})

    def invoke(self, context, event):
        if self.filepath or bpy.app.background:
            return self.execute(context)
        context.window_manager.fileselect_add(self)
        return {"RUNNING_MODAL"}

    def execute(self, context):
        if not self.filepath:
            self.report({"ERROR"}, "Choose the .onnx file to register.")
            return {"CANCELLED"}
        path = Path(bpy.path.abspath(self.filepath)).expanduser()
        if not path.is_file():
            self.report({"ERROR"}, f"Cannot register {str(path)!r}: there is no file at that path.")
            return {"CANCELLED"}
        try:
            inputs, outputs = check_loadable(path)
        except ModelFileError as exc:
            detail = _first_line(exc.__cause__) if exc.__cause__ is not None else str(exc)
            self.report(
                {"ERROR"},
                f"Cannot register {path.name} as a {self.family} model: onnxruntime cannot load it as "
                f"an ONNX model ({detail}). Pick a complete, valid .onnx file.",
            )
            return {"CANCELLED"}
        except LeanImageError as exc:  # e.g. not enough memory to load it
            self.report({"ERROR"}, f"Cannot register {path.name} as a {self.family} model: {exc}")
            return {"CANCELLED"}
        except Exception as exc:
            self.report(
                {"ERROR"},
                f"Cannot register {path.name}: onnxruntime could not load it ({_first_line(exc)}).",
            )
            return {"CANCELLED"}
        catalog = preferences.get_catalog(context)
        try:
            entry = catalog.add_user_model(self.family, path)
            store = preferences.save_user_catalog(catalog, context)
        except (LeanImageError, ValueError, OSError) as exc:
            self.report({"ERROR"}, f"Cannot register {path.name}: {exc}")
            return {"CANCELLED"}
        self.report(
            {"INFO"},
            f"Registered {entry.title} as a {self.family} model (inputs: {inputs}; outputs: {outputs}); "
            f"saved in {store}.",
        )
        return {"FINISHED"}


class LEAN_IMAGE_AI_OT_clear_sessions(bpy.types.Operator):
    """Drop every loaded model session: frees model weights and inference memory (CPU and GPU)"""

    bl_idname = "lean_image_ai.clear_sessions"
    bl_label = "Free Loaded Models"
    bl_options = {"INTERNAL"}

    def execute(self, context):
        running = _job_running()
        if running:
            self.report({"ERROR"}, f"'{running}' is using the loaded models; wait or cancel it first.")
            return {"CANCELLED"}
        runtime = get_runtime()
        count = len(runtime.cached_sessions())
        runtime.clear("user request")
        self.report({"INFO"}, f"Dropped {count} cached model session{'s' if count != 1 else ''}.")
        return {"FINISHED"}


def pre_unregister():
    """Stop a running download before its operator class goes away."""
    downloads.cancel_all()


classes = (
    LEAN_IMAGE_AI_OT_install_model,
    LEAN_IMAGE_AI_OT_cancel_download,
    LEAN_IMAGE_AI_OT_remove_model,
    LEAN_IMAGE_AI_OT_register_user_model,
    LEAN_IMAGE_AI_OT_clear_sessions,
)
