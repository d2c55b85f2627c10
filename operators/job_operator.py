"""Blender's modal job operators (bpy): the base every operator that runs a job shares
(:class:`ModalJobOperator`), which starts the job on its lane, pumps its task from a modal timer
(a loop in background mode) and shows its progress. The job, its lanes and its tasks are
operators/jobs.py's (see its module doc for prepare / pump / finish)."""

from __future__ import annotations

import traceback

import bpy

from ..runtime.errors import LeanImageError
from .jobs import BlenderJob, JobBusyError, JobEnd, JobLane, as_task, manager, record_failure, stop

TIMER_INTERVAL = 0.1


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


class ModalJobOperator:
    """Base (a mixin) of Blender's operators that run one job from a modal timer (see module doc)."""

    lane: JobLane = manager
    job_title = "Lean Image AI"
    redraw_areas = frozenset({"IMAGE_EDITOR", "VIEW_3D"})

    _job: BlenderJob | None = None
    _end: JobEnd | None = None  # once the job is applied: the rest of its end, a step per timer call
    _outcome: set | None = None  # finish()'s answer, returned once the end is over
    _teardown = None  # the job's timer, progress bar and status, removed once the end is over
    _start_steps: list | None = None  # a start left to the first timer calls (read_first)

    def prepare(self, context, job: BlenderJob):
        raise NotImplementedError

    def finish(self, context, job: BlenderJob) -> set:
        raise NotImplementedError

    def job_key(self) -> str:
        return ""

    def read_first(self, context):
        """A step ``(context, job)`` the modal start leaves to the first timer call, or None: Blender's
        decode of a source it has not read yet (0.06-0.13 s of its main thread for a 2048x2048 image,
        0.07-0.23 s at 3840x2160, bench/start_parts.py). The start then only claims the lane and
        returns; the first timer call runs the step and the next prepares the job. Errors found then
        are the job's, reported as it ends; what the step made for the job it registers with
        ``job.on_discard``."""
        return None

    def pump(self, context, job: BlenderJob, budget: float) -> bool:
        """The task's share of work on the main thread; True once the job is over."""
        return job.done or job.task.pump(budget)

    # -- synchronous path (background mode, scripts, and `execute` calls) ----------------------
    def execute(self, context):
        job = self._begin(context)
        if job is None:
            return {"CANCELLED"}
        try:
            try:
                while not self.pump(context, job, 0.5):
                    pass
            except BaseException:
                job.cancel()
                raise
            return self.finish(context, job)
        finally:
            job.discard()  # finish() empties it when it applied the job
            self.lane.end(job)

    # -- modal path (interactive Blender) --------------------------------------------------------
    def invoke(self, context, event):
        if bpy.app.background:
            return self.execute(context)
        return self.start_modal(context)

    def start_modal(self, context):
        """Start the job under a modal timer; what ``invoke`` does when Blender has a UI."""
        first = self.read_first(context)
        job = self._begin(context) if first is None else self._claim()
        if job is None:
            return {"CANCELLED"}
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
            job.discard()
            job.state, job.error_text = "failed", f"Blender could not start the job ({problem})."
            self.lane.end(job)
            self.report({"ERROR"}, job.error_text)
            return {"CANCELLED"}
        self._job = job
        if first is not None:
            self._start_steps = [first, self._prepare_now]
            job.report(0.0, "reading the image")
        return {"RUNNING_MODAL"}

    def modal(self, context, event):
        job = self._job
        if job is None:  # defensive: a handler without a job has nothing to wait for
            return {"CANCELLED"}
        if self._end is not None:
            return self._end_step(context, event)
        if event.type == "ESC" and event.value == "PRESS":
            job.cancel()
            return {"RUNNING_MODAL"}  # Esc is ours while the job runs: no other tool gets it
        if event.type != "TIMER":
            return {"PASS_THROUGH"}
        try:
            over = self._start_step(context, job) if self._start_steps else self.pump(context, job, 0.05)
        except Exception as exc:  # noqa: BLE001 - a task that broke ends its job, never the modal loop
            record_failure(job, exc)
            over = True
        if not over:
            context.window_manager.progress_update(int(job.progress * 100))
            _set_status(context, f"{job.name}: {job.stage} ({job.progress:.0%}) - Esc to cancel")
            self._redraw(context)
            return {"RUNNING_MODAL"}
        if self.lane.current is not job and job.state == "cancelled":
            if job.teardown is not None:  # cancel_all() already ended it and discarded its data
                job.teardown()
            return {"CANCELLED"}
        return self._apply(context, job)

    def _apply(self, context, job: BlenderJob):
        """The job's outcome applied (or reported) in this call; the rest of its end in the next
        timer calls (:meth:`_end_step`), each small: Blender's main thread is never held long."""
        try:
            outcome = self.finish(context, job)
        except BaseException:
            job.discard()
            self.lane.end(job)
            if job.teardown is not None:
                job.teardown()
            raise
        job.discard()
        self._teardown = job.teardown  # the job lets go of it in its end
        self._end, self._outcome = self.lane.ending(job), outcome
        _set_status(context, f"{job.name}: finishing")
        self._redraw(context)
        return {"RUNNING_MODAL"}

    def _end_step(self, context, event):
        """One step of the applied job's end per timer event; then the operator ends with what
        finish() said. The job is over: Esc has nothing left to cancel and passes on."""
        if event.type != "TIMER":
            return {"PASS_THROUGH"}
        if not self._end.step():
            return {"RUNNING_MODAL"}
        self._close_end()
        self._redraw(context)
        return self._outcome

    def _close_end(self) -> None:
        end, self._end = self._end, None
        end.run_all()
        if self._teardown is not None:
            self._teardown()

    def cancel(self, context):
        """Blender calls this when the modal operator is stopped from outside (e.g. file load)."""
        job = self._job
        if job is None:
            return
        if self._end is not None:  # applied already: only its end is left, done now
            self._close_end()
            return
        stop(job)
        self.lane.end(job)

    # -- shared ----------------------------------------------------------------------------------
    def _claim(self) -> BlenderJob | None:
        """The lane claimed for a new job, or None after reporting why not."""
        try:
            return self.lane.begin(self.job_title, self.job_key())
        except JobBusyError as exc:
            self.report({"ERROR"}, str(exc))
            return None

    def _begin(self, context) -> BlenderJob | None:
        """Claim the lane and prepare the job (its ``task`` set), or None after reporting why not."""
        job = self._claim()
        if job is None:
            return None
        try:
            self._prepare_now(context, job)
            return job
        except LeanImageError as exc:
            job.state, job.error_text = "failed", str(exc)
        except Exception as exc:  # a bug: traceback to the console, a line to the user
            traceback.print_exc()
            job.state, job.error_text = "failed", f"Unexpected error: {type(exc).__name__}: {exc}"
        job.discard()
        self.lane.end(job)
        self.report({"ERROR"}, job.error_text)
        return None

    def _prepare_now(self, context, job: BlenderJob) -> None:
        job.task = as_task(job, self.prepare(context, job))

    def _start_step(self, context, job: BlenderJob) -> bool:
        """The next step of a start left to the timer calls (see :meth:`read_first`), one a
        call; True once the job is over: cancelled before it was prepared, or failed in a step
        (then it ends as a job whose task failed: ``finish`` reports it)."""
        if job.cancel_event.is_set():
            self._start_steps = None
            job.state, job.error_text = "cancelled", f"{job.name} was cancelled; nothing was changed."
            return True
        step = self._start_steps.pop(0)
        try:
            step(context, job)
        except Exception as exc:  # noqa: BLE001 - the job's outcome, as a task's failure is
            self._start_steps = None
            record_failure(job, exc)
            return True
        return False

    def _redraw(self, context):
        wm = getattr(context, "window_manager", None)
        screens = [w.screen for w in getattr(wm, "windows", ())] or [getattr(context, "screen", None)]
        for screen in screens:
            for area in getattr(screen, "areas", ()):
                if area.type in self.redraw_areas:
                    area.tag_redraw()


def _set_status(context, text):
    workspace = getattr(context, "workspace", None)
    if workspace is not None:
        workspace.status_text_set(text)


class BatchOperator(ModalJobOperator):
    """A ModalJobOperator whose task is a :class:`PumpedTask` (kept as a name the sequence operators share)."""
