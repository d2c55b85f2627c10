"""The "Lean Image AI" sidebar tab (N-panel) in the Image Editor and the 3D Viewport.

Both editors show the same panel and the same "Memory" sub-panel: the classes differ only in
``bl_space_type`` and share one draw function each (:func:`draw_main`, :func:`draw_memory`).
Drawing never raises: a section that fails shows its error as text instead.
"""

import time

import bpy

from ..models import families
from ..operators import options, prefs, shot_props
from ..operators.jobs import manager
from ..runtime import get_runtime, memory_snapshot
from ..runtime.log.diagnostics import onnxruntime_import_error
from ..runtime.measure import memory_plot
from . import preferences
from . import settings as scene_settings

CATEGORY = "Lean Image AI"
SNAPSHOT_TTL = 1.0  # seconds: NVML queries are not free and panels redraw often

_snapshot_cache = {"at": None, "gpu": None, "snap": None}


def cached_memory_snapshot(gpu_device_id, *, now=None) -> dict:
    """``memory_snapshot(gpu_device_id)``, re-read at most once per :data:`SNAPSHOT_TTL`."""
    now = time.monotonic() if now is None else now
    cache = _snapshot_cache
    if cache["snap"] is None or cache["gpu"] != gpu_device_id or now - cache["at"] >= SNAPSHOT_TTL:
        cache.update(at=now, gpu=gpu_device_id, snap=memory_snapshot(gpu_device_id))
    return cache["snap"]


def invalidate_memory_snapshot() -> None:
    _snapshot_cache.update(at=None, gpu=None, snap=None)


def _mb(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:.0f} MB"


def _operator(layout, idname, *, text, icon, **props):
    """``layout.operator`` with its properties set; a property the operator lacks is shown as an
    error row instead of breaking the panel."""
    op = layout.operator(idname, text=text, icon=icon)
    if op is None:  # operator not registered (partial install)
        return None
    for name, value in props.items():
        try:
            setattr(op, name, value)
        except (AttributeError, TypeError, ValueError) as exc:
            layout.label(text=f"{idname}: cannot set {name}: {exc}", icon="ERROR")
    return op


# ---- main panel -----------------------------------------------------------------------------


def draw_main(layout, context) -> None:
    """Everything of the main panel: the four actions, the job, the device."""
    preferences.draw_safely(layout, "Actions", _draw_actions, context)
    preferences.draw_safely(layout, "Job status", _draw_job, context)
    preferences.draw_safely(layout, "Device", _draw_device, context)


def _job_busy() -> bool:
    return manager.running() is not None


def _onnxruntime_problem() -> str | None:
    """Asked once per session: an import that failed stays failed until Blender restarts."""
    if "problem" not in _runtime_check:
        _runtime_check["problem"] = onnxruntime_import_error()
    return _runtime_check["problem"]


_runtime_check: dict = {}


def _draw_actions(layout, context) -> None:
    s = scene_settings.get_settings(context)
    if s is None:
        layout.label(text="Scene settings are not available (add-on not fully registered).", icon="ERROR")
        return
    problem = _onnxruntime_problem()
    if problem:
        preferences.wrapped_labels(layout, problem, width=60, icon="ERROR", alert=True)
    col = layout.column()
    col.enabled = not _job_busy() and not problem  # one job at a time; the operator refuses a second one anyway
    col.prop(s, "use_sequence", icon="SEQUENCE")
    if s.use_sequence:
        box = col.box()
        for name in ("sequence_source", "sequence_frames", "sequence_output", "skip_existing"):
            box.prop(s, name)
        for name in shot_props.NAMES:  # the shot: one depth range, aligned depth, one camera
            box.prop(s, name)
    for family in families.ALL:
        box = col.box()
        box.label(text=family.action, icon=family.icon)
        box.prop(s, f"{family.id}_model", text="")
        values = {option.name: getattr(s, option.name) for option in family.options}
        for name in values:
            box.prop(s, name)
        model_id, model_path = scene_settings.selected_model(s, family.id, context)
        if s.use_sequence:
            _operator(
                box,
                "lean_image_ai.process_sequence",
                text=f"{family.action} (Sequence)",
                icon=family.icon,
                family=family.id,
                **_sequence_source(s, context),
                frames=s.sequence_frames,
                output=s.sequence_output,
                skip_existing=s.skip_existing,
                model_id=model_id,
                model_path=model_path,
                **values,
                **{name: getattr(s, name) for name in shot_props.NAMES},
            )
            _shot_buttons(box, s, context, family, model_id, model_path, values)
            continue
        if not family.operator:  # a family without a single-image operator runs on sequences only
            box.label(text="Runs on image sequences: tick Sequence above.", icon="INFO")
            continue
        _operator(
            box,
            options.operator_idname(family),
            text=family.action,
            icon=family.icon,
            model_id=model_id,
            model_path=model_path,
            **values,
        )


def _shot_buttons(box, s, context, family, model_id, model_path, values) -> None:
    """Preview Frame (this frame, no file), and for MoGe-2 the shot as meshes under one camera."""
    shot = {name: getattr(s, name) for name in shot_props.NAMES}
    common = dict(**_sequence_source(s, context), model_id=model_id, model_path=model_path, **values, **shot)
    row = box.row(align=True)
    _operator(row, "lean_image_ai.preview_frame", text="Preview Frame", icon="HIDE_OFF", family=family.id, **common)
    if "camera" in family.shot:
        _operator(row, "lean_image_ai.reconstruct_shot", text="Reconstruct Shot", icon="CAMERA_DATA", frames=s.sequence_frames, **common)


def _sequence_source(settings, context) -> dict:
    if settings.sequence_source:
        return {"source": settings.sequence_source}
    space = getattr(context, "space_data", None)
    image = getattr(space, "image", None) if getattr(space, "type", "") == "IMAGE_EDITOR" else None
    return {"image_name": image.name} if image is not None else {}


_STATE_ICONS = {"finished": "CHECKMARK", "failed": "ERROR", "cancelled": "CANCEL", "running": "SORTTIME"}


def _draw_job(layout, context) -> None:
    box = layout.box()
    job = manager.current
    if job is not None and not job.done:
        box.label(text=f"Running: {job.name}", icon="SORTTIME")
        text = f"{job.stage} ({job.progress:.0%})"
        row = box.row()
        try:
            row.progress(factor=float(job.progress), type="BAR", text=text)
        except (AttributeError, TypeError):  # Blender before 4.0 has no progress widget
            row.label(text=text)
        _operator(row, "lean_image_ai.cancel_job", text="Cancel", icon="CANCEL")
    last = manager.last
    if last is not None:
        box.label(text=f"Last job: {last.name}: {last.state}", icon=_STATE_ICONS.get(last.state, "INFO"))
        if last.error_text:
            preferences.wrapped_labels(box, last.error_text, width=60, alert=last.state == "failed")
    elif job is None:
        box.label(text="No job has run yet.")


def _draw_device(layout, context) -> None:
    box = layout.box()
    box.label(text=f"Device setting: {prefs.device_string(prefs.get_prefs(context))}", icon="PREFERENCES")
    handles = get_runtime().cached_sessions()
    if not handles:
        box.label(text="No model loaded.")
    for handle in handles:
        box.label(text=f"{handle.model_name}: {handle.device_label}")
        if handle.fallback_warning:
            hinted = prefs.with_gpu_runtime_hint(handle.fallback_warning)
            preferences.wrapped_labels(box, hinted, width=60, icon="ERROR", alert=True)


# ---- memory sub-panel -----------------------------------------------------------------------


def dashboard_gpu_device_id(context=None) -> int:
    """The GPU the dashboard watches: a loaded CUDA session's, else the preferred CUDA index."""
    for handle in get_runtime().cached_sessions():
        if handle.gpu_device_id is not None:
            return handle.gpu_device_id
    chosen = prefs.get_prefs(context)
    return max(0, int(getattr(chosen, "cuda_device_index", 0) or 0))


def draw_memory(layout, context) -> None:
    preferences.draw_safely(layout, "Memory stats", _draw_memory_stats, context)
    preferences.draw_safely(layout, "Last job's memory", _draw_last_job, context)
    preferences.draw_safely(layout, "Sessions", _draw_sessions, context)


def _draw_memory_stats(layout, context) -> None:
    snap = cached_memory_snapshot(dashboard_gpu_device_id(context))
    col = layout.column(align=True)
    col.label(text=f"Blender process memory (RSS): {_mb(snap.get('rss_bytes'))}")
    gpu = snap.get("gpu") or {}
    if gpu.get("available"):
        col.label(text=f"GPU {gpu.get('device_id', 0)}: {gpu.get('name')}")
        col.label(
            text=f"Used {_mb(gpu.get('used_bytes'))} of {_mb(gpu.get('total_bytes'))}, free {_mb(gpu.get('free_bytes'))}"
        )
        col.label(text=f"This process on the GPU: {_mb(gpu.get('process_used_bytes'))}")
    else:
        col.label(text=f"GPU memory: not readable here ({gpu_unavailable_reason(gpu)}); inference is unaffected")


def gpu_unavailable_reason(gpu: dict) -> str:
    """One readable phrase for NVML's failure (its raw error stays in the console/event log)."""
    error = str(gpu.get("error") or "")
    if not error:
        return "not queried"
    if "ModuleNotFound" in error or "No module named" in error:
        return "nvidia-ml-py is not installed"
    if "LibraryNotFound" in error or "NVML Shared Library Not Found" in error or "Driver Not Loaded" in error:
        return "no NVIDIA driver"
    return error.split(":", 1)[0] or "NVML error"


def _draw_last_job(layout, context) -> None:
    job = get_runtime().last_job_memory
    col = layout.column(align=True)
    if job is None:
        col.label(text="Last job: none yet (each job reports what it grew and gave back).")
        return
    for line in job["lines"]:
        col.label(text=line)
    timeline = get_runtime().last_timeline
    if timeline:
        col = layout.column(align=True)
        for line in memory_plot.legend(timeline):
            col.label(text=line)
        _operator(layout, "lean_image_ai.show_memory_plot", text="Show Memory Plot", icon="IMAGE_DATA")


def _draw_sessions(layout, context) -> None:
    handles = get_runtime().cached_sessions()
    col = layout.column(align=True)
    col.label(text=f"Cached sessions: {len(handles)}")
    now = time.time()
    for h in handles:
        size = h.weights_bytes("vram" if h.gpu_device_id is not None else "ram") or h.file_bytes
        col.label(
            text=f"  {h.model_name}: {h.device_label} ({h.providers[0]}), used {now - h.last_used:.0f} s ago, ~{_mb(size)}"
        )
    row = layout.row(align=True)
    row.enabled = not _job_busy()
    sub = row.row(align=True)
    _operator(sub, "lean_image_ai.release_memory", text="Release Now", icon="FILE_REFRESH")
    sub = row.row(align=True)
    sub.enabled = bool(handles)
    _operator(sub, "lean_image_ai.unload_all", text="Unload All", icon="TRASH")
    row = layout.row(align=True)
    row.operator_menu_enum("lean_image_ai.leak_check", "family", text="Leak Check", icon="VIEWZOOM")
    _operator(row, "lean_image_ai.open_log_folder", text="Open Log Folder", icon="FILE_FOLDER")


# ---- classes ----------------------------------------------------------------------------------


class _MainPanel:
    bl_label = "Lean Image AI"
    bl_region_type = "UI"
    bl_category = CATEGORY

    def draw(self, context):
        draw_main(self.layout, context)


class _MemoryPanel:
    bl_label = "Memory"
    bl_region_type = "UI"
    bl_category = CATEGORY
    bl_options = {"DEFAULT_CLOSED"}

    def draw(self, context):
        draw_memory(self.layout, context)


class LEAN_IMAGE_AI_PT_image_editor(_MainPanel, bpy.types.Panel):
    bl_idname = "LEAN_IMAGE_AI_PT_image_editor"
    bl_space_type = "IMAGE_EDITOR"


class LEAN_IMAGE_AI_PT_view3d(_MainPanel, bpy.types.Panel):
    bl_idname = "LEAN_IMAGE_AI_PT_view3d"
    bl_space_type = "VIEW_3D"


class LEAN_IMAGE_AI_PT_image_editor_memory(_MemoryPanel, bpy.types.Panel):
    bl_idname = "LEAN_IMAGE_AI_PT_image_editor_memory"
    bl_space_type = "IMAGE_EDITOR"
    bl_parent_id = LEAN_IMAGE_AI_PT_image_editor.bl_idname


class LEAN_IMAGE_AI_PT_view3d_memory(_MemoryPanel, bpy.types.Panel):
    bl_idname = "LEAN_IMAGE_AI_PT_view3d_memory"
    bl_space_type = "VIEW_3D"
    bl_parent_id = LEAN_IMAGE_AI_PT_view3d.bl_idname


classes = (
    LEAN_IMAGE_AI_PT_image_editor,
    LEAN_IMAGE_AI_PT_view3d,
    LEAN_IMAGE_AI_PT_image_editor_memory,
    LEAN_IMAGE_AI_PT_view3d_memory,
)
