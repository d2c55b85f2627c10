"""What the "Memory" sub-panel and its "Details" sub-panel draw (ui/panels.py holds the classes).

Blender does not wrap labels and the sidebar is narrow: the Memory panel says each thing in one
short line (at most :data:`LINE`), the full report (the same words as the command line and the
event log) is in Details, wrapped.
"""

import time

from ..models.worker import client as worker_client
from ..models.worker import host_record
from ..models.worker.remote_batch import in_process_runtime
from ..operators import prefs
from ..operators.jobs import manager
from ..runtime.measure import memory_plot
from ..runtime.measure.memory import memory_snapshot
from ..runtime.measure.memory_report import mb
from . import preferences

LINE = 60  # characters a label may take in the sidebar's default width
SNAPSHOT_TTL = 1.0  # seconds: NVML queries are not free and panels redraw often
SHORT_FIGURE = {"ram": "RAM", "vram": "GPU"}

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


def short(text: str, width: int = LINE) -> str:
    """``text`` cut to ``width`` characters at a word, with an ellipsis when cut."""
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut[width // 2 :] else cut).rstrip(" ,;:") + "…"


def _mb(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:.0f} MiB"


def loaded_sessions() -> list:
    """Sessions cached in this process: only where jobs run here (LEAN_IMAGE_AI_IN_PROCESS); the
    model worker's are its own (:func:`worker_models`)."""
    local = in_process_runtime()
    return local.cached_sessions() if local is not None else []


def worker_models() -> list[str]:
    """The models the model worker holds, as its last status said."""
    worker = worker_client.shared()
    return list(worker.status.get("models", ())) if worker.running else []


def dashboard_gpu_device_id(context=None) -> int:
    """The GPU the dashboard watches: a loaded CUDA session's, else the preferred CUDA index."""
    for handle in loaded_sessions():
        if handle.gpu_device_id is not None:
            return handle.gpu_device_id
    chosen = prefs.get_prefs(context)
    return max(0, int(getattr(chosen, "cuda_device_index", 0) or 0))


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


# ---- the Memory panel: one short line per thing --------------------------------------------


def draw_memory(layout, context) -> None:
    preferences.draw_safely(layout, "Model process", _draw_worker, context)
    preferences.draw_safely(layout, "Memory stats", _draw_memory_stats, context)
    preferences.draw_safely(layout, "Last job's memory", _draw_last_job_summary, context)
    preferences.draw_safely(layout, "Sessions", _draw_sessions_summary, context)


def _draw_worker(layout, context) -> None:
    """The model process in one line (not running / ready, its model and memory / running a job)
    and the button that ends it."""
    worker = worker_client.shared()
    row = layout.row(align=True)
    row.label(text=short(worker.state()))
    sub = row.row(align=True)
    sub.enabled = worker.running and manager.running() is None
    _button(sub, "lean_image_ai.free_memory_now", text="Free Memory Now", icon="X")


def _draw_memory_stats(layout, context) -> None:
    snap = cached_memory_snapshot(dashboard_gpu_device_id(context))
    col = layout.column(align=True)
    col.label(text=f"Blender process memory (RSS): {_mb(snap.get('rss_bytes'))}")
    gpu = snap.get("gpu") or {}
    if gpu.get("available"):
        col.label(text=short(f"GPU {gpu.get('device_id', 0)}: {gpu.get('name')}"))
        col.label(
            text=f"Used {_mb(gpu.get('used_bytes'))} of {_mb(gpu.get('total_bytes'))}, free {_mb(gpu.get('free_bytes'))}"
        )
        col.label(text=f"This process on the GPU: {_mb(gpu.get('process_used_bytes'))}")
    else:
        col.label(text=short(f"GPU memory: not readable ({gpu_unavailable_reason(gpu)})"))
        col.label(text="Jobs run as usual.")


def _draw_last_job_summary(layout, context) -> None:
    job = host_record.last_job_memory
    col = layout.column(align=True)
    if job is None:
        col.label(text="Last job: none yet")
        return
    col.label(text=short(f"Last job: {job.get('operation', '?')} ({job.get('outcome', '?')})"))
    if job.get("worker_ended"):  # Free Memory Now or the idle end: what it kept went with the process
        col.label(text="The model process has ended: nothing is kept now.", icon="INFO")
        return
    for figure in job.get("figures") or ():
        name = SHORT_FIGURE.get(figure.get("figure"), figure.get("figure", "?"))
        col.label(
            text=short(
                f"{name}: grew {mb(figure.get('grew'))}, gave back {mb(figure.get('gave_back'))}, "
                f"kept {mb(figure.get('kept'))}"
            )
        )
    col.label(text="The full report is under Details.", icon="INFO")


def _draw_sessions_summary(layout, context) -> None:
    handles, names = loaded_sessions(), worker_models()
    col = layout.column(align=True)
    col.label(text=f"Models loaded: {len(handles) + len(names)}")
    for h in handles:
        col.label(text=short(f"{h.model_name}: {h.device_label}, ~{_mb(_size(h))}"))
    for name in names:
        col.label(text=short(f"{name}: in the model process"))
    row = layout.row(align=True)
    row.enabled = manager.running() is None
    sub = row.row(align=True)
    _button(sub, "lean_image_ai.release_memory", text="Release Now", icon="FILE_REFRESH")
    sub = row.row(align=True)
    sub.enabled = bool(handles or names)
    _button(sub, "lean_image_ai.unload_all", text="Unload All", icon="TRASH")


def _size(handle):
    return handle.weights_bytes("vram" if handle.gpu_device_id is not None else "ram") or handle.file_bytes


def _button(layout, idname, **kw):
    return layout.operator(idname, **kw)


# ---- the Details panel: the full report, wrapped ---------------------------------------------


def draw_details(layout, context) -> None:
    preferences.draw_safely(layout, "Memory report", _draw_report, context)
    preferences.draw_safely(layout, "Session details", _draw_session_details, context)


def _draw_report(layout, context) -> None:
    job = host_record.last_job_memory
    if job is None:
        preferences.wrapped_labels(layout, "No job yet: each job reports what it grew and gave back.", width=LINE)
        return
    col = layout.column(align=True)
    for line in job["lines"]:
        _wrapped_line(col, line)
    timeline = host_record.last_timeline
    if timeline:
        col = layout.column(align=True)
        for line in memory_plot.legend(timeline):
            _wrapped_line(col, line)
        _button(layout, "lean_image_ai.show_memory_plot", text="Show Memory Plot", icon="IMAGE_DATA")


def _wrapped_line(layout, line: str) -> None:
    """A report line over as many labels as it needs, its indentation kept on the first."""
    indent = line[: len(line) - len(line.lstrip())]
    preferences.wrapped_labels(layout, indent + line.strip(), width=LINE)


def _draw_session_details(layout, context) -> None:
    handles = loaded_sessions()
    col = layout.column(align=True)
    now = time.time()
    for h in handles:
        col.label(text=short(f"{h.model_name}: {h.device_label}"))
        col.label(text=short(f"    {h.providers[0]}, used {now - h.last_used:.0f} s ago, ~{_mb(_size(h))}"))
    row = layout.row(align=True)
    row.operator_menu_enum("lean_image_ai.leak_check", "family", text="Leak Check", icon="VIEWZOOM")
    _button(row, "lean_image_ai.open_log_folder", text="Open Log Folder", icon="FILE_FOLDER")
