"""Jobs: model work on a worker thread, Blender data touched only on the main thread.

An operator built on `JobOperator` splits its work in three:
  gather(context)            main thread: read Blender data into plain Python/numpy
  work(inputs, job_options)  worker thread (or inline in background mode): models/ only, no bpy,
                             and nothing read from the operator itself (`self` is a Blender
                             struct: only `inputs` may be used)
  apply(context, inputs, result)  main thread: create images/meshes; the operator's UNDO flag
                             makes Blender push one undo step when it returns FINISHED.
With a UI, `invoke` starts the worker and a modal timer; Esc (or the panel's Cancel) sets the
job's cancel event, which the runtime checks before every model run. In background mode
(`bpy.app.background`, headless scripts) Blender calls `execute` even for 'INVOKE_DEFAULT', and
`execute` runs the same three steps synchronously.
One job runs at a time; a second request is refused with a message naming the running one.

Whatever gather creates for the job (say an image loaded from a file) can be registered in
`inputs["on_discard"]` (callables): they run on the main thread whenever the job ends without
applying (failure, cancellation, unregister), so a failed job leaves Blender's data as it was.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import bpy

from ..models.base import JobOptions
from ..runtime.errors import LeanImageError, OperationCancelled

TIMER_INTERVAL = 0.1
JOIN_TIMEOUT = 30.0


@dataclass
class Job:
    name: str
    cancel_event: threading.Event = field(default_factory=threading.Event)
    progress: float = 0.0
    stage: str = "starting"
    state: str = "running"  # running | finished | failed | cancelled
    result: object = None
    error: BaseException | None = None
    error_text: str = ""
    thread: threading.Thread | None = None
    started: float = field(default_factory=time.monotonic)
    # Set while a modal handler drives the job: removes its timer, progress bar and status text.
    # Held by the job (not the operator) so that cancel_all() can tidy up without the operator.
    teardown: Callable[[], None] | None = None
    inputs: dict | None = None

    def report(self, fraction: float, stage: str) -> None:
        self.progress, self.stage = fraction, stage

    def cancel(self) -> None:
        self.cancel_event.set()
        if self.state == "running":
            self.stage = "cancelling..."

    @property
    def done(self) -> bool:
        return self.state != "running"


class JobManager:
    """Process-wide: the one running job (what the panel shows and unregister cancels)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.current: Job | None = None
        self.last: Job | None = None

    def begin(self, name: str) -> Job:
        with self._lock:
            if self.current is not None and not self.current.done:
                raise JobBusyError(
                    f"'{self.current.name}' is still running ({self.current.stage}). "
                    "Wait for it to finish or cancel it (Esc, or Cancel in the Lean Image AI panel)."
                )
            self.current = Job(name)
            return self.current

    def end(self, job: Job) -> None:
        with self._lock:
            if self.current is job:
                self.current = None
            self.last = job

    def cancel_all(self, *, join_timeout: float = JOIN_TIMEOUT) -> None:
        """Cancel the current job, wait for its worker, and undo what the job left behind (its
        modal timer and progress bar, data gathered for it). Main thread only."""
        job = self.current
        if job is None:
            return
        job.cancel()
        if job.thread is not None and job.thread is not threading.current_thread():
            job.thread.join(join_timeout)
        if job.teardown is not None:
            job.teardown()
        if job.inputs is not None:  # never applied (even if its worker finished): keep nothing
            discard_inputs(job.inputs)
            job.inputs = None
        _mark_cancelled(job)
        self.end(job)


class JobBusyError(LeanImageError):
    pass


manager = JobManager()


def _mark_cancelled(job: Job) -> None:
    """A job ended from outside before its result was applied counts as cancelled, whatever
    its worker got to (a worker that did not stop in time included)."""
    if job.state in ("running", "finished"):
        job.state, job.error_text = "cancelled", f"{job.name} was cancelled; nothing was changed."


def discard_inputs(inputs: dict) -> None:
    """Run the job's `on_discard` callables once (main thread)."""
    callbacks = inputs.pop("on_discard", None) or ()
    for callback in callbacks:
        try:
            callback()
        except Exception:  # a datablock the user already removed: nothing left to undo
            traceback.print_exc()


def run_work(work: Callable, job: Job, inputs) -> None:
    """The worker body: `work` is the operator's bound `work`, looked up on the main thread.
    Everything it touches is numpy/models/runtime, never bpy."""
    options = JobOptions(device=inputs.get("device", "auto"), progress=job.report, cancel=job.cancel_event)
    try:
        result = work(inputs, options)
    except OperationCancelled as exc:
        job.error, job.error_text, job.state = exc, str(exc), "cancelled"
    except LeanImageError as exc:
        job.error, job.error_text, job.state = exc, str(exc), "failed"
    except Exception as exc:  # a bug: keep the traceback for the console, a short line for the user
        traceback.print_exc()
        job.error, job.error_text, job.state = exc, f"Unexpected error: {type(exc).__name__}: {exc}", "failed"
    else:
        # result before state: the main thread reads the result once it sees the state change
        job.result = result
        if job.cancel_event.is_set():  # cancelled after the last run: still nothing is applied
            job.error_text, job.state = f"{job.name} was cancelled; nothing was changed.", "cancelled"
        else:
            job.state = "finished"


def modal_events_available(context) -> bool:
    """Whether Blender delivers timer events to modal handlers: never in background mode.

    (Blender itself calls `execute` for 'INVOKE_DEFAULT' in background mode; this guards direct
    `invoke` calls from scripts. Tests replace it to drive the modal path with stand-ins.)"""
    return not bpy.app.background


class _ModalTeardown:
    """Removes a modal job's timer, progress bar and status text; safe to call twice."""

    def __init__(self, window_manager, timer, workspace):
        self.window_manager, self.timer, self.workspace = window_manager, timer, workspace

    def __call__(self) -> None:
        timer, self.timer = self.timer, None
        if timer is None:
            return
        try:
            self.window_manager.event_timer_remove(timer)
            self.window_manager.progress_end()
            if self.workspace is not None:
                self.workspace.status_text_set(None)
        except ReferenceError:  # the window manager went away (file load): its timers with it
            pass


class JobOperator:
    """Mixin for bpy.types.Operator subclasses. Subclasses define gather/work/apply."""

    bl_options = {"REGISTER", "UNDO"}
    job_title = "Lean Image AI"

    _job: Job | None = None
    _inputs: dict | None = None

    # -- to override --------------------------------------------------------------------------
    def gather(self, context) -> dict:
        raise NotImplementedError

    def work(self, inputs: dict, options: JobOptions):
        raise NotImplementedError

    def apply(self, context, inputs: dict, result) -> str:
        """Create Blender data from the result; returns a one-line summary for the report.
        On failure it must remove what it created before raising."""
        raise NotImplementedError

    # -- synchronous path (background mode, scripts, and `execute` calls) ----------------------
    def execute(self, context):
        try:
            job = manager.begin(self.job_title)
        except JobBusyError as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        try:
            inputs = self._gather(context, job)
            if inputs is None:
                return {"CANCELLED"}
            job.inputs = inputs
            run_work(self.work, job, inputs)
            return self._finish(context, job, inputs)
        finally:
            manager.end(job)

    # -- modal path (interactive Blender) --------------------------------------------------------
    def invoke(self, context, event):
        if not modal_events_available(context):
            return self.execute(context)
        try:
            job = manager.begin(self.job_title)
        except JobBusyError as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        inputs = self._gather(context, job)
        if inputs is None:
            manager.end(job)
            return {"CANCELLED"}
        job.inputs = inputs
        wm = context.window_manager
        try:
            timer = wm.event_timer_add(TIMER_INTERVAL, window=context.window)
            job.teardown = _ModalTeardown(wm, timer, getattr(context, "workspace", None))
            wm.progress_begin(0, 100)
            handler_added = wm.modal_handler_add(self)
        except Exception as exc:  # no window to attach to, say: nothing may stay behind
            traceback.print_exc()
            handler_added, problem = False, f"{type(exc).__name__}: {exc}"
        else:
            problem = "no modal handler"
        if not handler_added:
            if job.teardown is not None:
                job.teardown()
            discard_inputs(inputs)
            job.state, job.error_text = "failed", f"Blender could not start the job ({problem})."
            manager.end(job)
            self.report({"ERROR"}, job.error_text)
            return {"CANCELLED"}
        self._job, self._inputs = job, inputs
        # bound here: the worker must not look anything up on the operator (a Blender struct)
        job.thread = threading.Thread(
            target=run_work, args=(self.work, job, inputs), name=f"lean_image_ai:{job.name}", daemon=True
        )
        job.thread.start()
        return {"RUNNING_MODAL"}

    def modal(self, context, event):
        job = self._job
        if job is None:  # defensive: a handler without a job has nothing to wait for
            return {"CANCELLED"}
        if event.type == "ESC" and event.value == "PRESS":
            job.cancel()
            return {"RUNNING_MODAL"}  # Esc is ours while the job runs: no other tool gets it
        if event.type != "TIMER":
            return {"PASS_THROUGH"}
        if not job.done:
            context.window_manager.progress_update(int(job.progress * 100))
            _set_status(context, f"{job.name}: {job.stage} ({job.progress:.0%}) - Esc to cancel")
            _redraw_panels(context)
            return {"RUNNING_MODAL"}
        if job.teardown is not None:
            job.teardown()
        _redraw_panels(context)
        try:
            if manager.current is not job and job.inputs is None:
                # cancel_all() already ended it (and discarded its inputs)
                return {"CANCELLED"}
            return self._finish(context, job, self._inputs)
        finally:
            manager.end(job)

    def cancel(self, context):
        """Blender calls this when the modal operator is cancelled from outside (e.g. file load)."""
        job = self._job
        if job is None:
            return
        job.cancel()
        if job.thread is not None:
            job.thread.join(JOIN_TIMEOUT)
        if job.teardown is not None:
            job.teardown()
        if job.inputs is not None:
            discard_inputs(job.inputs)
            job.inputs = None
        _mark_cancelled(job)
        manager.end(job)

    # -- shared ----------------------------------------------------------------------------------
    def _gather(self, context, job: Job) -> dict | None:
        try:
            return self.gather(context)
        except LeanImageError as exc:
            job.state, job.error_text = "failed", str(exc)
        except Exception as exc:  # a bug: traceback to the console, a line to the user
            traceback.print_exc()
            job.state, job.error_text = "failed", f"Unexpected error: {type(exc).__name__}: {exc}"
        self.report({"ERROR"}, job.error_text)
        return None

    def _finish(self, context, job: Job, inputs):
        job.inputs = None  # from here on this method owns the cleanup
        if job.state in ("cancelled", "failed"):
            discard_inputs(inputs)
            if job.state == "cancelled":
                self.report({"WARNING"}, job.error_text or f"{job.name} cancelled; nothing was changed.")
            else:
                self.report({"ERROR"}, job.error_text)
            return {"CANCELLED"}
        try:
            summary = self.apply(context, inputs, job.result)
        except Exception as exc:
            if not isinstance(exc, LeanImageError):
                traceback.print_exc()
            discard_inputs(inputs)
            text = (
                str(exc)
                if isinstance(exc, LeanImageError)
                else f"Unexpected error: {type(exc).__name__}: {exc}"
            )
            job.state, job.error_text = "failed", text
            self.report({"ERROR"}, text)
            return {"CANCELLED"}
        inputs.pop("on_discard", None)
        for warning in _all_warnings(job.result):
            self.report({"WARNING"}, warning)
        self.report({"INFO"}, summary)
        return {"FINISHED"}


def _all_warnings(result) -> list[str]:
    if isinstance(result, list):
        return [w for r in result for w in getattr(r, "warnings", None) or []]
    return list(getattr(result, "warnings", None) or [])


def _set_status(context, text):
    workspace = getattr(context, "workspace", None)
    if workspace is not None:
        workspace.status_text_set(text)


def _redraw_panels(context):
    screen = getattr(context, "screen", None)
    if screen is None:
        return
    for area in screen.areas:
        if area.type in {"IMAGE_EDITOR", "VIEW_3D"}:
            area.tag_redraw()


class LEAN_IMAGE_AI_OT_cancel_job(bpy.types.Operator):
    """Cancel the running Lean Image AI job (it stops before its next model run)"""

    bl_idname = "lean_image_ai.cancel_job"
    bl_label = "Cancel Lean Image AI Job"
    bl_description = "Cancel the running Lean Image AI job; nothing it was making is kept"
    bl_options = {"REGISTER"}

    def execute(self, context):
        job = manager.current
        if job is None or job.done:
            self.report({"INFO"}, "No Lean Image AI job is running.")
            return {"CANCELLED"}
        job.cancel()
        self.report({"INFO"}, f"Cancelling '{job.name}'...")
        return {"FINISHED"}


classes = (LEAN_IMAGE_AI_OT_cancel_job,)
