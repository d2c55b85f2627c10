"""Memory on request (bpy): Release now, Unload all, the leak check, and idle unload.

Release now keeps the sessions (weights stay loaded) and gives back arena memory; Unload all
drops the sessions. Both report what they freed, in the runtime's wording. Idle unload is a
Blender timer armed after each job, re-armed only while sessions are cached, never in
background mode (there are no timers there and a script decides for itself).
"""

import bpy

from ..runtime import get_runtime
from ..runtime.leak_check import leak_check
from ..runtime.memory_report import format_freed
from . import prefs
from .jobs import manager

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
        freed = get_runtime().release_now()
        self.report({"INFO"}, format_freed("Release now", freed))
        return {"FINISHED"}


class LEAN_IMAGE_AI_OT_unload_all(bpy.types.Operator):
    """Unload every loaded model: frees their weights and all inference memory (CPU and GPU)"""

    bl_idname = "lean_image_ai.unload_all"
    bl_label = "Unload All"

    def execute(self, context):
        if _busy(self):
            return {"CANCELLED"}
        freed = get_runtime().unload()
        self.report({"INFO"}, format_freed("Unload all", freed))
        return {"FINISHED"}


class LEAN_IMAGE_AI_OT_leak_check(bpy.types.Operator):
    """Run the same small upscale N times and say whether memory is stable or growing"""

    bl_idname = "lean_image_ai.leak_check"
    bl_label = "Leak Check"

    runs: bpy.props.IntProperty(name="Runs", default=30, min=8, max=500)

    def execute(self, context):
        if _busy(self):
            return {"CANCELLED"}
        from ..models.leak_job import family_job

        job = family_job("upscale", device=prefs.device_string(prefs.get_prefs(context)))
        result = leak_check(job, runs=self.runs)
        self.report({"INFO"} if result.verdict == "stable" else {"WARNING"}, result.summary())
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
    runtime = get_runtime()
    if limit <= 0 or manager.running() is not None:
        return IDLE_CHECK_MAX_S if runtime.cached_sessions() and limit > 0 else None
    runtime.unload_idle(limit)
    handles = runtime.cached_sessions()
    if not handles:
        return None  # nothing cached: the next job arms it again
    import time

    soonest = min(limit - (time.time() - h.last_used) for h in handles)
    return max(1.0, min(IDLE_CHECK_MAX_S, soonest))


def arm_idle_unload() -> bool:
    """Start the idle timer after a job (UI only); True when it is (now) registered."""
    if bpy.app.background or idle_seconds() <= 0 or not get_runtime().cached_sessions():
        return False
    if not bpy.app.timers.is_registered(idle_tick):
        bpy.app.timers.register(idle_tick, first_interval=IDLE_CHECK_MAX_S, persistent=True)
    return True


def _after_job(job) -> None:
    arm_idle_unload()


def post_register():
    if _after_job not in manager.on_end:
        manager.on_end.append(_after_job)


def pre_unregister():
    if _after_job in manager.on_end:
        manager.on_end.remove(_after_job)
    if bpy.app.timers.is_registered(idle_tick):
        bpy.app.timers.unregister(idle_tick)


classes = (LEAN_IMAGE_AI_OT_release_memory, LEAN_IMAGE_AI_OT_unload_all, LEAN_IMAGE_AI_OT_leak_check)
