"""The one job engine: no thread at all; Blender's main thread pumps each job from a timer.

Model jobs and model downloads both run through it. An operator built on operators/job_operator.py's ``ModalJobOperator``
splits its work in three:

  prepare(context, job)  main thread: read Blender data; returns the job's task: an object with
                         ``pump(budget) -> bool`` (True once over) and ``cancel()`` that leaves its
                         outcome in ``job`` (:class:`PumpedTask`: a batch whose model runs in the
                         worker process, models/worker/), or a plain callable ``work(job)``, run
                         inline at the first pump (:class:`InlineTask`: quick work only)
  pump                   main thread, from the modal timer (or a loop in background mode): the
                         task's share of work, reading and writing frames with bpy
  finish(context, job)   main thread, whatever the outcome: apply or report; returns the
                         operator's result set

With a UI, ``invoke`` starts a modal timer (progress bar, status text, Esc cancels) that pumps the
task. In background mode (``bpy.app.background``, headless scripts) Blender calls ``execute`` even
for 'INVOKE_DEFAULT', and modal operators get no timer events there: ``execute`` pumps in a loop.
Blender does not support Python threads (its "Gotchas: threading" page), and the model runs in
another process, so nothing here needs one.

Each lane (:data:`manager` for model jobs, :data:`downloads` for downloads) runs one job at a time
and refuses a second with a message naming the running one. Whatever ``prepare`` creates for the
job (an image loaded from a file, say) is registered with ``job.on_discard``: it is removed
whenever the job ends without being applied (failure, cancel, unregister), so Blender's data stays
as it was.
"""

from __future__ import annotations

import threading  # Event only: a job's cancel flag, which the batch it runs checks; never a thread
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import bpy

from ..runtime.errors import LeanImageError, OperationCancelled
from ..runtime.log import event_file
from ..runtime.measure.heap import trim_process_heap

JOIN_TIMEOUT = 30.0
EVENT_LOG_SETTLE_S = 2.0


@dataclass
class BlenderJob:
    """One job on Blender's side: its progress, cancel flag, task and outcome, kept by its lane."""

    name: str
    key: str = ""  # what the job works on (a catalog id for a download)
    cancel_event: threading.Event = field(default_factory=threading.Event)
    progress: float = 0.0
    stage: str = "starting"
    state: str = "running"  # running | finished | failed | cancelled
    result: object = None
    error: BaseException | None = None
    error_text: str = ""
    task: object = None  # what pumps the job (PumpedTask, InlineTask, or prepare's own)
    started: float = field(default_factory=time.monotonic)
    # Held by the job (not the operator) so that cancel_all() can tidy up without the operator:
    teardown: Callable[[], None] | None = None  # removes the modal timer, progress bar, status
    on_discard: list[Callable[[], None]] = field(default_factory=list)
    inputs: object = None  # what prepare() read for the job, for finish()

    def report(self, fraction: float, stage: str) -> None:
        self.progress, self.stage = fraction, stage

    def cancel(self) -> None:
        self.cancel_event.set()
        if self.state == "running":
            self.stage = "cancelling..."
        task = self.task
        if task is not None and hasattr(task, "cancel"):
            task.cancel()

    @property
    def done(self) -> bool:
        return self.state != "running"

    def discard(self) -> None:
        """Undo what was prepared for the job (main thread; once)."""
        callbacks, self.on_discard = self.on_discard, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a datablock the user already removed: nothing left to undo
                traceback.print_exc()

    def release(self) -> None:
        """Let go of what the job worked with once it is over: its task (which refers back to the
        job: a cycle only the collector would break, holding every array the task touched), what
        ``prepare`` read and a result that holds arrays. The lane keeps the job for the panel: its
        name, state, texts and figures."""
        self.task = self.inputs = self.teardown = None
        self.on_discard = []
        if _holds_arrays(self.result):
            self.result = None
        error, seen = self.error, set()
        while error is not None and id(error) not in seen:  # a traceback's frames hold their locals
            seen.add(id(error))
            error.__traceback__ = None
            error = error.__cause__ or error.__context__

    def mark_cancelled(self) -> None:
        """A job ended from outside before it was applied counts as cancelled, whatever its
        worker got to (a worker that did not stop in time included)."""
        if self.state in ("running", "finished"):
            self.state, self.error_text = "cancelled", f"{self.name} was cancelled; nothing was changed."


def _holds_arrays(result) -> bool:
    """Whether ``result`` is or directly holds a buffer of pixels (a numpy array, say)."""
    values = result if isinstance(result, list | tuple) else [result]
    for value in values:
        fields = getattr(value, "__dict__", None) or {}
        if hasattr(value, "__array_interface__") or any(hasattr(v, "__array_interface__") for v in fields.values()):
            return True
    return False


class JobBusyError(LeanImageError):
    pass


def _settle_event_log() -> None:
    """The job's events written before Blender gets control back (here: Blender's event log has
    no writer thread, runtime/log/event_file.py)."""
    log = event_file.current()
    if log is not None:
        log.flush(timeout=EVENT_LOG_SETTLE_S)


class JobLane:
    """One lane of jobs, one at a time: the running one (``current``) and the outcome of the latest (``last``).
    Main thread only (Blender's), like everything of the job engine: no lock."""

    def __init__(self, busy_hint: str):
        self._busy_hint = busy_hint
        self.current: BlenderJob | None = None
        self.last: BlenderJob | None = None
        self.on_end: list[Callable[[BlenderJob], object]] = []  # called on the main thread after a job ends

    def begin(self, name: str, key: str = "") -> BlenderJob:
        if self.current is not None and not self.current.done:
            raise JobBusyError(f"'{self.current.name}' is still running ({self.current.stage}). {self._busy_hint}")
        self.current = BlenderJob(name, key)
        return self.current

    def running(self) -> BlenderJob | None:
        job = self.current
        return job if job is not None and not job.done else None

    def end(self, job: BlenderJob) -> None:
        """End ``job`` whole (see :meth:`ending`)."""
        self.ending(job).run_all()

    def ending(self, job: BlenderJob) -> JobEnd:
        """End ``job`` now (the lane free, ``last`` the job, for the panel and the next job) and
        return the rest of its end, which :class:`JobEnd` runs a step a call: the ``on_end``
        listeners, the job's arrays let go, the heap trimmed, the event log written."""
        if self.current is job:
            self.current = None
        self.last = job
        return JobEnd([*(partial(_tell, listener, job) for listener in list(self.on_end)),
                       job.release,
                       trim_process_heap,  # the job's frames were freed just before; glibc would keep their pages
                       _settle_event_log])

    def cancel_all(self, *, join_timeout: float = JOIN_TIMEOUT) -> None:
        """Cancel the current job, wait for its worker, and undo what it left behind (its modal
        timer and progress bar, data prepared for it). Main thread only."""
        job = self.current
        if job is None:
            return
        stop(job, join_timeout)
        self.end(job)


class JobEnd:
    """The rest of a job's end, one step per :meth:`step` (issue #37 item 3: together the steps held
    Blender's main thread 0.05-0.1 s in the job's last call, on top of making its result). A step
    that returns a callable has that run as the next step (a listener's second half)."""

    def __init__(self, steps: list[Callable[[], object]]):
        self._steps = deque(steps)

    def step(self) -> bool:
        """Run the next step; True once none is left."""
        if self._steps:
            more = self._steps.popleft()()
            if callable(more):
                self._steps.appendleft(more)
        return not self._steps

    def run_all(self) -> None:
        while not self.step():
            pass


def _tell(listener: Callable[[BlenderJob], object], job: BlenderJob):
    """One ``on_end`` listener; its answer, when callable, is the step after it."""
    try:
        more = listener(job)
    except Exception:  # a listener (e.g. the idle timer) must never break a job's end
        traceback.print_exc()
        return None
    return partial(_run_guarded, more) if callable(more) else None


def _run_guarded(step: Callable[[], object]) -> None:
    try:
        step()
    except Exception:  # as in _tell
        traceback.print_exc()


manager = JobLane("Wait for it to finish or cancel it (Esc, or Cancel in the Lean Image AI panel).")
downloads = JobLane("Wait for it to finish or cancel it in the add-on preferences.")


def stop(job: BlenderJob, join_timeout: float = JOIN_TIMEOUT) -> None:
    job.cancel()
    _pump_until_over(job, join_timeout)  # a batch's cancel ends or kills its worker within a second
    if job.teardown is not None:
        job.teardown()
    job.discard()
    job.mark_cancelled()


def run_job(job: BlenderJob, work: Callable[[BlenderJob], object]) -> None:
    """A plain task's body: runs ``work(job)`` and records the outcome in ``job``."""
    try:
        result = work(job)
    except Exception as exc:  # noqa: BLE001 - recorded as the job's outcome
        record_failure(job, exc)
    else:
        # result before state: the main thread reads the result once it sees the state change
        job.result = result
        if job.cancel_event.is_set():  # cancelled after the last step: still nothing is applied
            job.error_text, job.state = f"{job.name} was cancelled; nothing was changed.", "cancelled"
        else:
            job.state = "finished"


def record_failure(job: BlenderJob, exc: BaseException) -> None:
    if isinstance(exc, OperationCancelled):
        job.error, job.error_text, job.state = exc, str(exc), "cancelled"
    elif isinstance(exc, LeanImageError):
        job.error, job.error_text, job.state = exc, str(exc), "failed"
    else:  # a bug: the traceback to the console, a short line for the user
        traceback.print_exception(exc)
        job.error, job.error_text, job.state = exc, f"Unexpected error: {type(exc).__name__}: {exc}", "failed"


class InlineTask:
    """A plain callable ``work(job)`` as a task: it runs whole at the first pump, on the caller's
    thread (quick work; anything long belongs in a process)."""

    def __init__(self, job: BlenderJob, work: Callable[[BlenderJob], object]):
        self.job, self.work = job, work

    def pump(self, budget: float) -> bool:
        job = self.job
        if job.done:
            return True
        if job.cancel_event.is_set():  # stopped before it ran: it never runs
            job.error_text, job.state = f"{job.name} was cancelled; nothing was changed.", "cancelled"
        else:
            run_job(job, self.work)
        return True

    def cancel(self) -> None:  # the job's cancel_event is set already: work that looks at it stops
        pass


class PumpedTask:
    """A batch (models/worker/remote_batch.py's RemoteBatchRun, or a shot's TwoPassBatch of them)
    pumped here: frames read and written on this thread, the model in the worker process.
    ``result()`` gives the job's result once the batch is over; ``stage(result)``, when given, what
    the result still needs before ``finish`` applies it, as steps pumped like the batch (an object
    with ``pump(budget) -> bool``, or None: nothing): the packed file of a result image, written a
    band of rows per call so that no call of Blender's main thread does it whole (issue #37 item 3).
    ``before``: steps pumped the same way before the batch's first pump (the model's input converted
    from Blender's pixels). Nothing of Blender's data is made before ``finish``: a cancel during
    any of these steps leaves nothing."""

    def __init__(self, job: BlenderJob, batch, result: Callable[[], object] = lambda: None,
                 stage: Callable[[object], object] | None = None, before=None):
        self.job, self.batch, self.result, self.stage, self.before = job, batch, result, stage, before
        self._steps = self._staged = None

    def pump(self, budget: float) -> bool:
        job = self.job
        if job.done:
            return True
        if self.before is not None:
            return self._pump_before(budget)
        if self._steps is not None:
            return self._pump_steps(budget)
        try:
            if not self.batch.pump(budget):
                return False
            result = self.result()
            steps = self.stage(result) if self.stage is not None and not self._cancelled() else None
        except BaseException as exc:  # noqa: BLE001 - the outcome is the job's, reported by finish()
            record_failure(job, exc)
            return True
        if steps is None:
            return self._conclude(result)
        self._steps, self._staged = steps, result
        job.report(1.0, "making the result image")
        return False  # the steps start at the next call: this one has had the batch's share

    def _pump_before(self, budget: float) -> bool:
        try:
            if self._cancelled():  # the batch never started: nothing reached the worker
                self.before = None
                return self._conclude(None)
            if self.before.pump(budget):
                self.before = None
        except BaseException as exc:  # noqa: BLE001 - as in pump
            record_failure(self.job, exc)
            return True
        return False  # the batch starts at the next call

    def _pump_steps(self, budget: float) -> bool:
        try:
            if not self._cancelled() and not self._steps.pump(budget):
                return False
        except BaseException as exc:  # noqa: BLE001 - as above
            record_failure(self.job, exc)
            return True
        result, self._steps, self._staged = self._staged, None, None
        return self._conclude(result)

    def _cancelled(self) -> bool:
        return self.job.cancel_event.is_set() or getattr(self.batch.report, "cancelled", False)

    def _conclude(self, result) -> bool:
        job = self.job
        job.result = result
        if self._cancelled():
            job.error_text, job.state = f"{job.name} was cancelled; nothing was changed.", "cancelled"
        else:
            job.state = "finished"
        return True

    def cancel(self) -> None:
        self.batch.cancel()


class OneByOne:
    """Steps pumped one after another, each made when its turn comes (a result made a part per timer
    call, issue #37 item 3): ``makers`` are ``(stage, make)`` pairs, ``make()`` giving an object with
    ``pump(budget) -> bool`` (pumped from this call on) or None (making it was the step);
    ``report(stage)`` hears which one runs. :meth:`of`: steps made already, pumped in turn."""

    def __init__(self, makers: list[tuple[str, Callable[[], object]]], report: Callable[[str], None] | None = None):
        self._makers, self._report = deque(makers), report
        self._current = None

    @classmethod
    def of(cls, steps) -> OneByOne:
        return cls([("", partial(_itself, step)) for step in steps])

    @classmethod
    def of_some(cls, steps):
        """``steps`` (None: no step) pumped as one: the one step itself, or None when there is none."""
        steps = [step for step in steps if step is not None]
        if len(steps) < 2:
            return steps[0] if steps else None
        return cls.of(steps)

    def pump(self, budget: float) -> bool:
        """Make or pump the next step; True once none is left."""
        if self._current is None and self._makers:
            stage, make = self._makers.popleft()
            if self._report is not None:
                self._report(stage)
            self._current = make()
            if self._current is None:
                return not self._makers
        if self._current is not None and self._current.pump(budget):
            self._current = None
        return self._current is None and not self._makers


def _itself(step):
    return step


def as_task(job: BlenderJob, prepared) -> object:
    """``prepare``'s answer as a task (see module doc)."""
    return prepared if hasattr(prepared, "pump") else InlineTask(job, prepared)


def _pump_until_over(job: BlenderJob, limit: float) -> None:
    deadline = time.monotonic() + limit
    while job.task is not None and time.monotonic() < deadline:
        try:
            if job.task.pump(0.05):
                return
        except Exception:  # ending anyway: the job is being stopped
            traceback.print_exc()
            return


class LEAN_IMAGE_AI_OT_cancel_job(bpy.types.Operator):
    """Cancel the running Lean Image AI job (it stops before its next model run)"""

    bl_idname = "lean_image_ai.cancel_job"
    bl_label = "Cancel Lean Image AI Job"
    bl_description = "Cancel the running Lean Image AI job; nothing it was making is kept"
    bl_options = {"REGISTER"}

    def execute(self, context):
        job = manager.running()
        if job is None:
            self.report({"INFO"}, "No Lean Image AI job is running.")
            return {"CANCELLED"}
        job.cancel()
        self.report({"INFO"}, f"Cancelling '{job.name}'...")
        return {"FINISHED"}


classes = (LEAN_IMAGE_AI_OT_cancel_job,)
