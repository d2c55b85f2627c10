"""Memory on request (bpy): Release now, Unload all, the leak check, the event log, the memory
picture, idle unload.

Release now keeps the sessions (weights stay loaded) and gives back arena memory; Unload all
drops the sessions. Both report what they freed, in the runtime's wording. The leak check runs
in the model worker like a model job (progress, Esc or Cancel) and says stable or growing
at the end. After each finished job the image "Lean Image AI Memory" shows its memory timeline
(runtime/measure/memory_plot.py); a cancelled or failed job changes no Blender data, that image included.
Idle unload is a Blender timer armed after each job, re-armed only while the model worker runs
(or, with LEAN_IMAGE_AI_IN_PROCESS, sessions are cached in this process), never in background
mode (there are no timers there and a script decides for itself); it ends the worker process
(models/worker/client.py), which gives everything back. "Free memory now" ends the worker at once
and says how much it held just before. The models, their sessions and the runtime are the
worker's: this process makes no Runtime; what it shows of the last job is
models/worker/host_record.py's.
"""

import bpy
import numpy as np

from ..models import families
from ..models.base import RunOptions
from ..models.worker import client as worker_client
from ..models.worker import host_record
from ..models.worker.remote_batch import in_process_runtime
from ..runtime.log import event_file
from ..runtime.measure import memory_plot
from ..runtime.measure.leak_check import MIN_RUNS, RUNS_REASON
from ..runtime.measure.memory_report import format_freed
from . import prefs, results
from .job_operator import ModalJobOperator
from .jobs import BlenderJob, PumpedTask, manager

IDLE_CHECK_MAX_S = 60.0  # the timer wakes at most once a minute, at least when the next session turns idle


def _busy(operator) -> bool:
    running = manager.running()
    if running is not None:
        operator.report({"ERROR"}, f"'{running.name}' is using the loaded models; wait or cancel it first.")
        return True
    return False


class LEAN_IMAGE_AI_OT_release_memory(bpy.types.Operator):
    """Give back the memory the runtime reserved but is not using; loaded models stay loaded"""

    bl_idname = "lean_image_ai.release_memory"
    bl_label = "Release Now"

    def execute(self, context):
        if _busy(self):
            return {"CANCELLED"}
        self.report({"INFO"}, _freed("Release now", "release", lambda runtime: runtime.release_now()))
        return {"FINISHED"}


class LEAN_IMAGE_AI_OT_unload_all(bpy.types.Operator):
    """Unload every loaded model: frees their weights and all inference memory (CPU and GPU)"""

    bl_idname = "lean_image_ai.unload_all"
    bl_label = "Unload All"

    def execute(self, context):
        if _busy(self):
            return {"CANCELLED"}
        self.report({"INFO"}, _freed("Unload all", "unload", lambda runtime: runtime.unload()))
        return {"FINISHED"}


def _freed(action: str, ask: str, in_process) -> str:
    """What Release now / Unload all freed: in the model worker, where the models are, and in
    this process's runtime where jobs run here (LEAN_IMAGE_AI_IN_PROCESS)."""
    in_worker = worker_client.shared().ask(ask)
    local = in_process_runtime()
    # where jobs run here, this process's runtime holds the models the user ran; a worker left from
    # before is still asked to give its memory back, but its figures are not the ones to show
    freed = in_process(local) if local is not None else in_worker
    if freed is None:
        return f"{action}: the model process is not running; no model is loaded."
    return format_freed(action, freed)


class LEAN_IMAGE_AI_OT_free_memory_now(bpy.types.Operator):
    """End the model process now: every byte it held (RAM, VRAM, the GPU's context) comes back"""

    bl_idname = "lean_image_ai.free_memory_now"
    bl_label = "Free Memory Now"

    def execute(self, context):
        if _busy(self):
            return {"CANCELLED"}
        self.report({"INFO"}, freed_text(worker_client.shared().free_now()))
        return {"FINISHED"}


def freed_text(freed: dict) -> str:
    if not freed.get("was_running"):
        return "Free memory now: the model process was not running; nothing to give back."
    parts = [f"{(freed.get('rss_bytes') or 0) / 2**20:.0f} MiB RAM"]
    if freed.get("vram_bytes"):
        parts.append(f"{freed['vram_bytes'] / 2**20:.0f} MiB VRAM")
    return f"Free memory now: the model process ended; {' and '.join(parts)} came back."


class LEAN_IMAGE_AI_OT_leak_check(ModalJobOperator, bpy.types.Operator):
    """Run the same small job of a model family N times and say whether memory is stable or growing"""

    bl_idname = "lean_image_ai.leak_check"
    bl_label = "Leak Check"
    job_title = "Leak Check"  # on the model lane: it uses the loaded models, so never beside a job

    runs: bpy.props.IntProperty(name="Runs", description=f"How many times to run the job. {RUNS_REASON}",
                                default=30, min=MIN_RUNS, max=500)
    family: bpy.props.EnumProperty(
        name="Model Kind",
        description="Whose job is repeated (its installed model, or the embedded one)",
        items=[(f.id, f.title, f.produces) for f in families.ALL],
        default="upscale",
    )

    def prepare(self, context, job: BlenderJob):
        from ..models.worker.remote_call import leak_check_call
        from .model_job import model_worker

        device, budgets = prefs.configure_runtime(context)
        # in the model worker: the leak check measures the process whose runtime runs the model
        call = leak_check_call(self.family, device=device, folder=prefs.models_folder(context), budgets=budgets,
                               runs=self.runs, options=RunOptions(progress=job.report, cancel=job.cancel_event),
                               name=job.name, client=model_worker())
        return PumpedTask(job, call, lambda: call.result)

    def finish(self, context, job: BlenderJob):
        if job.state != "finished":
            self.report({"WARNING"} if job.state == "cancelled" else {"ERROR"}, job.error_text)
            return {"CANCELLED"}
        result = job.result
        self.report({"INFO"} if result.verdict == "stable" else {"WARNING"}, result.summary())
        return {"FINISHED"}


class LEAN_IMAGE_AI_OT_open_log_folder(bpy.types.Operator):
    """Open the folder of the add-on's event log (events.jsonl: every runtime decision, one JSON a line)"""

    bl_idname = "lean_image_ai.open_log_folder"
    bl_label = "Open Log Folder"

    def execute(self, context):
        log = event_file.current()
        folder = log.folder if log is not None else prefs.log_folder()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.report({"ERROR"}, f"Cannot create the log folder {folder}: {exc}")
            return {"CANCELLED"}
        bpy.ops.wm.path_open(filepath=str(folder))
        self.report({"INFO"}, f"Event log: {folder / event_file.LOG_NAME}")
        return {"FINISHED"}


# ---- the memory picture ------------------------------------------------------------------------

PLOT_IMAGE = "Lean Image AI Memory"


def update_plot_image():
    """Draw the last job's memory timeline into the image :data:`PLOT_IMAGE` (made on first use);
    None when no job has run yet."""
    rgba = _rendered_plot()
    return None if rgba is None else _plot_into_image(rgba)


def _rendered_plot():
    """The last job's memory timeline drawn (numpy only), or None when no job has run yet."""
    timeline = host_record.last_timeline
    return memory_plot.render(timeline) if timeline else None


def _plot_into_image(rgba):
    height, width = rgba.shape[:2]
    image = bpy.data.images.get(PLOT_IMAGE)
    if image is None:
        image = bpy.data.images.new(PLOT_IMAGE, width, height, alpha=True)
    elif tuple(image.size) != (width, height):
        image.scale(width, height)
    # Blender's first pixel row is the bottom one
    image.pixels.foreach_set((rgba[::-1].astype(np.float32) / 255.0).ravel())
    image.update()
    results.keep(image)  # packed again: the .blend and undo keep the picture of the last job
    return image


class LEAN_IMAGE_AI_OT_show_memory_plot(bpy.types.Operator):
    """Show the last job's memory over time (runs orange, release red) in an Image Editor"""

    bl_idname = "lean_image_ai.show_memory_plot"
    bl_label = "Show Memory Plot"

    def execute(self, context):
        image = update_plot_image()
        if image is None:
            self.report({"INFO"}, "No job has run yet: the memory plot appears after the first one.")
            return {"CANCELLED"}
        space = getattr(context, "space_data", None)
        editors = [space] if getattr(space, "type", "") == "IMAGE_EDITOR" else []
        screen = getattr(context, "screen", None)
        editors += [a.spaces.active for a in getattr(screen, "areas", ()) if a.type == "IMAGE_EDITOR"]
        if editors:
            editors[0].image = image
        where = "" if editors else " (open an Image Editor and pick it to see it)"
        legend = "; ".join(memory_plot.legend(host_record.last_timeline))
        self.report({"INFO"}, f"'{PLOT_IMAGE}'{where}: {legend}")
        return {"FINISHED"}


# ---- idle unload ------------------------------------------------------------------------------


def idle_seconds(context=None) -> float:
    return 60.0 * max(0, int(getattr(prefs.get_prefs(context), "idle_unload_minutes", 0) or 0))


def idle_tick():
    """The timer: unload what has been idle long enough; the next wake-up, or None to stop."""
    try:
        limit = idle_seconds()
    except Exception:
        return None
    local, worker = in_process_runtime(), worker_client.shared()
    if limit <= 0 or manager.running() is not None:
        return IDLE_CHECK_MAX_S if (_local_sessions(local) or worker.running) and limit > 0 else None
    if local is not None:
        local.unload_idle(limit)
    if worker.check_alive():  # a worker stopped while idle is ended here, not at the next job's deadline
        worker.check_idle(limit)  # the worker's end is what gives its memory back
    handles = _local_sessions(local)
    if not handles and not worker.running:
        return None  # nothing cached: the next job arms it again
    import time

    waits = [limit - (time.time() - h.last_used) for h in handles]
    worker_wait = worker.idle_wait(limit)  # the client decides when its worker ends
    if worker_wait is not None:
        waits.append(worker_wait)
    return max(1.0, min(IDLE_CHECK_MAX_S, min(waits, default=IDLE_CHECK_MAX_S)))


def _local_sessions(local) -> list:
    """Sessions cached in this process (only where jobs run here, LEAN_IMAGE_AI_IN_PROCESS)."""
    return local.cached_sessions() if local is not None else []


def arm_idle_unload() -> bool:
    """Start the idle timer after a job (UI only); True when it is (now) registered."""
    if bpy.app.background or idle_seconds() <= 0:
        return False
    if not _local_sessions(in_process_runtime()) and not worker_client.shared().running:
        return False
    if not bpy.app.timers.is_registered(idle_tick):
        bpy.app.timers.register(idle_tick, first_interval=IDLE_CHECK_MAX_S, persistent=True)
    return True


def _after_job(job):
    """The lane's listener: the idle timer armed and the memory picture drawn; the picture is put
    into its image by the step this returns, a call of its own (operators/jobs.py's JobEnd)."""
    arm_idle_unload()
    # the picture shows the job the Memory panel reports, cancelled or failed too; only a finished
    # job makes it anew (a CANCELLED operator adds no image)
    if job.state == "finished" or _plot_exists():
        rgba = _rendered_plot()
        if rgba is not None:
            return lambda: _plot_into_image(rgba)
    return None


def _plot_exists() -> bool:
    try:
        return bpy.data.images.get(PLOT_IMAGE) is not None
    except AttributeError:  # Blender's data is out of reach (a job cancelled by a file load)
        return False


def post_register():
    if _after_job not in manager.on_end:
        manager.on_end.append(_after_job)
    # written from this timer, not a writer thread (Blender does not support Python threads)
    event_file.start(host_record.events, prefs.log_folder())  # the folder is made by the first write
    if not bpy.app.timers.is_registered(_drain_event_log):
        bpy.app.timers.register(_drain_event_log, first_interval=EVENT_LOG_DRAIN_S, persistent=True)


EVENT_LOG_DRAIN_S = 1.0


def _drain_event_log():
    event_file.drain()
    return EVENT_LOG_DRAIN_S


def pre_unregister():
    if _after_job in manager.on_end:
        manager.on_end.remove(_after_job)
    if bpy.app.timers.is_registered(_drain_event_log):
        bpy.app.timers.unregister(_drain_event_log)
    event_file.stop()
    if bpy.app.timers.is_registered(idle_tick):
        bpy.app.timers.unregister(idle_tick)
    worker_client.stop_shared()  # the add-on goes: so does its model process


classes = (
    LEAN_IMAGE_AI_OT_release_memory,
    LEAN_IMAGE_AI_OT_unload_all,
    LEAN_IMAGE_AI_OT_free_memory_now,
    LEAN_IMAGE_AI_OT_leak_check,
    LEAN_IMAGE_AI_OT_open_log_folder,
    LEAN_IMAGE_AI_OT_show_memory_plot,
)
