"""An operation: one job's model runs, and the release of the memory they grew when it ends."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from .errors import (
    InferenceError,
    InferenceOutOfMemoryError,
    MemoryBudgetError,
    ModelContractError,
    OperationCancelled,
    SessionClosedError,
    first_line,
)
from .measure.budget import JobBudget, elements, remember_working
from .measure.memory import figures, gpu_snapshot, memory_snapshot, trim_process_heap
from .measure.memory_report import format_job_memory, job_figures, mb
from .measure.timeline import Timeline
from .measure.unfinished import unfinished_bytes
from .oom import out_of_memory_resource
from .providers import (
    KEEP,
    RELEASE_RULES,
    SHRINK_CONFIG_KEY,
    UNLOAD,
    may_use_measured_gpu,
    parse_device,
    release_rule,
)
from .session import LIBRARY_RAM, SessionHandle, onnxruntime_module
from .session_run import bindable, copy_into, run_bound, without_frames
from .settings import MemoryBudgets

# ORT's answer when a shrink entry names a device the session has no arena for
_ARENA_NOT_FOUND = "Did not find an arena based allocator"


class Operation:
    """One business inference: a button press, a batch of frames, a headless call.

    Use as a context manager. Every model run goes through `run()`; the owner of the loop passes
    `last=True` on the final run of each session it used, and only that run carries the shrink
    entry. If the operation ends by cancellation or error (or without a final run), the memory
    it grew is given back on exit: the shared CPU arena by a probe run, a CUDA session's arena by
    evicting that session (the only way to free it without another model run). Sessions on a device
    without an ORT arena (DirectML, CoreML: the UNLOAD rule of providers.py's table) are unloaded
    when the job ends, however it ends, unless the artist keeps models loaded.
    """

    def __init__(self, runtime, name: str, *, cancel=None, budgets: MemoryBudgets | None = None):
        # runtime: the core.Runtime that made it; budgets: the job's own, passed with it (None: the
        # runtime's settings, which a script or the environment set)
        self.runtime = runtime
        self.name = name
        self._cancel = _as_cancel_check(cancel)
        self.runs = 0
        self._dirty: dict[int, SessionHandle] = {}  # by id(handle): ran since their last shrink
        self._finished: set[int] = set()
        self._started = None
        self.release_events: list[dict] = []
        self._before: dict[int, dict] = {}  # by id(handle): memory before its first run here
        self._held: dict[tuple, SessionHandle] = {}  # by cache key: the sessions this job uses
        self.timeline = Timeline()
        self._job_before: dict = {}  # figure -> memory at the job's start (VRAM: before its first CUDA session)
        self._loaded: list[SessionHandle] = []  # sessions this job created
        self._used: dict[int, SessionHandle] = {}
        self._live_output_bytes = 0
        self._results_held: Callable[[], int] | None = None  # the job's results still alive (bytes)
        self._owes_cpu_release = False  # its CPU release was put off (deferred_release.py)
        self._working_key = None  # (model, input shapes) of the largest run: what budget.py remembers
        self.budgets = runtime.settings.budgets() if budgets is None else budgets
        # the CUDA arena's cap for the sessions it creates: its VRAM budget, else the runtime's own
        self.gpu_mem_limit = runtime.settings.gpu_mem_limit_bytes if budgets is None else budgets.vram_bytes
        self.budget = JobBudget(runtime, self.timeline, self.budgets)  # checked before each load and new input shape
        self.memory: dict | None = None  # the job's memory report (memory_report), after the block
        self.unloaded: dict | None = None  # what the UNLOAD rule gave back (Runtime.unload_sessions)

    def __enter__(self):
        self._started = time.perf_counter()
        self._started_at = time.time()
        self.timeline.start()
        self.runtime.deferred.job_started()
        self._job_before["ram"] = self.timeline.mark("before")["ram"]
        self.runtime.events.emit("operation_start", operation=self.name)
        return self

    def session(self, model_path, device="auto", *, static_shapes: bool | None = None) -> SessionHandle:
        """The session for a model; the job keeps it until it ends, even if it is evicted meanwhile.
        ``static_shapes``: its inputs never change shape (see Runtime.session)."""
        request = parse_device(device)
        if "vram" not in self._job_before and may_use_measured_gpu(request):
            vram = figures({"gpu": gpu_snapshot(request.index or 0)})["vram"]
            if vram is not None:
                self._job_before["vram"] = vram
        self.budget.before_load(model_path, request, keep=list(self._held.values()))
        created = self.runtime.sessions_created
        handle = self.runtime.session(model_path, request, holder=self, static_shapes=static_shapes)
        if self.runtime.sessions_created != created:
            self._loaded.append(handle)
        self._held[handle.key] = handle
        return handle

    def held_session(self, key) -> SessionHandle | None:
        """The session this job already uses for a cache key, if it is still loaded."""
        handle = self._held.get(key)
        return handle if handle is not None and handle.session is not None else None

    @property
    def cancelled(self) -> bool:
        return self._cancel()

    def check_cancelled(self) -> None:
        if self._cancel():
            raise OperationCancelled(f"{self.name} was cancelled; nothing was written.")

    def run(
        self, handle: SessionHandle, feeds: dict, *, last: bool, output_names=None, out=None
    ) -> dict[str, np.ndarray]:
        """Run the model; `out` ({output name: C-contiguous array of its exact shape and dtype})
        binds those outputs to the caller's memory (IOBinding): the runtime writes them in place,
        nothing is left in the arena and nothing is copied. Other outputs are returned as copies."""
        session = self._session_to_run(handle)
        self.check_cancelled()
        shapes = tuple(tuple(getattr(v, "shape", ())) for v in feeds.values())
        self.budget.before_run(handle, shapes, keep=list(self._held.values()))  # raises before running
        meter = self.budget.meter(handle, shapes)
        release_now, defer, run_options = self._release_plan(handle, last)
        names = list(output_names) if output_names else [o.name for o in handle.outputs]
        self._count_run(handle, shapes)
        bound = bindable(handle, out)
        outputs, oom = self._invoke(handle, session, names, feeds, out if bound else None, release_now, run_options)
        del session  # this frame's own reference, before an out-of-memory session is dropped
        if oom is not None:
            self._out_of_memory(handle, *oom)
            raise self._out_of_memory_error(handle, *oom) from oom[1]
        release_now = release_now and bool(handle.shrink)  # no arena after all: runs as before
        self.budget.measured(meter)
        if not bound:
            # CPU outputs are views into arena regions; owning copies stop them pinning a region.
            # A provider without IOBinding here copies into the caller's arrays instead.
            targets = [(out or {}).get(name) for name in names]
            outputs = [copy_into(t, o, handle.cpu_arena) for t, o in zip(targets, outputs, strict=True)]
        self._live_output_bytes = sum(int(getattr(o, "nbytes", 0)) for o in outputs)
        self.timeline.mark(f"run {self.runs}")
        all_bound = bound and all(name in out for name in names)
        self._after_run(handle, last=last, release_now=release_now, defer=defer, all_bound=all_bound)
        return dict(zip(names, outputs, strict=True))

    def _session_to_run(self, handle: SessionHandle):
        """The handle's live session, held by this job from now on; raises when it cannot run."""
        if self._started is None:
            raise RuntimeError("Operation.run() called outside its `with` block")
        if id(handle) in self._finished:
            raise RuntimeError(f"{handle.model_name} already made its final run in operation {self.name!r}")
        if self._held.get(handle.key) is not handle:
            self.runtime.hold(handle, self)  # a handle from runtime.session(): this job uses it now
            self._held[handle.key] = handle
        if handle.session is None:  # dropped for good (out of memory, or a forced eviction)
            raise SessionClosedError(
                f"{handle.model_name} was unloaded ({handle.evict_reason or 'evicted'}) while "
                f"{self.name} was running; nothing was written. Run the job again: it loads the "
                "model anew.",
                model=handle.model_name,
            )
        return handle.session

    def _release_plan(self, handle: SessionHandle, last: bool):
        """(release in this run, put the CPU release off, the run's options): only the final run
        of a session with a shrinkable arena carries the shrink entry."""
        settings = self.runtime.settings
        defer = handle.cpu_arena and settings.release_memory and settings.ram_kept_between_jobs
        release_now = last and settings.release_memory and bool(handle.shrink) and not defer
        run_options = onnxruntime_module().RunOptions()
        if release_now:
            run_options.add_run_config_entry(SHRINK_CONFIG_KEY, handle.shrink)
        if handle.shrink and settings.release_memory and id(handle) not in self._before:
            # releases are reported against the memory before this job first ran the session
            self._before[id(handle)] = memory_snapshot(handle.gpu_device_id)
        return release_now, defer, run_options

    def _count_run(self, handle: SessionHandle, shapes: tuple) -> None:
        self.runs += 1
        self._dirty[id(handle)] = handle
        self._used[id(handle)] = handle
        if self._working_key is None or elements(shapes) > elements(self._working_key[1]):
            self._working_key = (handle.model_name, shapes)
        handle.last_used = time.time()
        if handle.gpu_device_id is not None:
            self.timeline.gpu_device_id = handle.gpu_device_id

    def _invoke(self, handle, session, names, feeds, out, release_now, run_options):
        """(outputs, None), or (None, (resource, error)) when the run ran out of memory; `out`:
        the outputs to bind (None: a plain run). A shrink entry the session has no arena for is
        dropped (``handle.shrink`` empties) and the run made again as before."""

        def call(options):
            if out is None:
                return session.run(names, feeds, options)
            return run_bound(session, names, feeds, out, options)

        try:
            try:
                return call(run_options), None
            except Exception as exc:
                if not (release_now and _ARENA_NOT_FOUND in str(exc)):
                    raise
                self._arena_not_found(handle, exc)
                return call(onnxruntime_module().RunOptions()), None
        except Exception as exc:
            resource = out_of_memory_resource(exc, on_gpu=handle.gpu_device_id is not None)
            if resource is None:
                raise InferenceError(
                    f"{handle.model_name} failed on {handle.device_label}: {first_line(exc)}"
                ) from exc
            # Only the error's text and type leave this block: its traceback holds this frame and
            # the frames below it, which reference the session; kept, they would keep its weights
            # and arena alive until the caller's `except` ended (where the tiler loads the next one).
            return None, (resource, without_frames(exc))

    def _arena_not_found(self, handle: SessionHandle, exc: BaseException) -> None:
        """The session has no arena for the shrink entry's device after all: it runs as before."""
        self.runtime.events.emit(
            "release_unsupported",
            model=handle.model_name,
            device=handle.device_label,
            shrink=handle.shrink,
            detail=first_line(exc),
        )
        handle.shrink = ""

    def _after_run(self, handle: SessionHandle, *, last: bool, release_now: bool, defer: bool, all_bound: bool):
        """A final run: its session is finished here, and what the run grew is given back now
        (or, for the shared CPU arena kept between jobs, owed to the deferred release)."""
        if last:
            self._finished.add(id(handle))
        if release_now:
            started = time.perf_counter()
            if handle.cpu_arena and not all_bound:
                self.runtime.release_cpu_arena()  # regions the outputs pinned during the run
            elif handle.cpu_arena:
                trim_process_heap()  # the arena shrank in the run; the C heap's free pages too
            self._dirty.pop(id(handle), None)
            self._emit_release("operation_complete", handle, started, in_run=True)
        elif last:
            self._dirty.pop(id(handle), None)
            self._owes_cpu_release = self._owes_cpu_release or defer

    def _out_of_memory(self, handle: SessionHandle, resource: str, cause: BaseException) -> None:
        """Free what the failed run held before anything else loads: the session (weights and,
        on CUDA, its own arena) and, on the shared CPU arena, the regions the run grew."""
        self._dirty.pop(id(handle), None)
        self.runtime.evict(handle, reason="out_of_memory", force=True)
        if handle.cpu_arena:
            self.runtime.release_cpu_arena()
        self.runtime.events.emit(
            "out_of_memory",
            operation=self.name,
            model=handle.model_name,
            device=handle.device_label,
            resource=resource,
            detail=first_line(cause),
        )

    @staticmethod
    def _out_of_memory_error(handle: SessionHandle, resource: str, cause: BaseException):
        return InferenceOutOfMemoryError(
            f"Out of {resource} while running {handle.model_name} on {handle.device_label}. "
            "Try a smaller tile size or a lower resolution, or close other programs using the memory"
            + (", or switch the device to CPU in the add-on preferences." if handle.gpu_device_id is not None else "."),
            model=handle.model_name,
            device=handle.device_label,
            resource=resource,
            detail=str(cause),
        )

    def _emit_release(self, reason, handle, started, *, in_run, at_release=None):
        after = memory_snapshot(handle.gpu_device_id)
        event = self.runtime.events.emit(
            "memory_release",
            operation=self.name,
            reason=reason,
            model=handle.model_name,
            device=handle.device_label,
            shrink=handle.shrink,
            in_run=in_run,
            seconds=round(time.perf_counter() - started, 6),
            before=self._before.get(id(handle)),
            at_release=at_release,
            after=after,
        )
        self.release_events.append(event)
        self.timeline.mark("release", after)

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            outcome = "no_final_run" if self._dirty else "success"
        elif isinstance(exc, OperationCancelled):
            outcome = "cancelled"
        elif isinstance(exc, MemoryBudgetError):
            outcome = "over_budget"  # refused before running: nothing ran out
        elif isinstance(exc, InferenceOutOfMemoryError):
            outcome = "out_of_memory"
        else:
            outcome = "error"
        held = list(self._held.values())
        for handle in held:  # an evicted session goes with its last job
            self.runtime.unhold(handle, self)
            if isinstance(exc, ModelContractError) and not handle.evicted:
                # a model that does not fit the job is of no use cached: give its weights back
                self.runtime.evict(handle, reason="model contract")
        self._held.clear()
        try:
            if self._dirty and self.runtime.settings.release_memory:
                self._release_after_abort(outcome)
        finally:
            self.runtime.deferred.job_ended(owes_release=self._owes_cpu_release)
        self._dirty.clear()
        self._unload_by_rule(held)
        self._report_memory(outcome, unfinished_bytes(tb) if exc is not None else 0)
        self.runtime.events.emit(
            "operation_end",
            operation=self.name,
            outcome=outcome,
            runs=self.runs,
            seconds=round(time.perf_counter() - (self._started or time.perf_counter()), 4),
        )
        return False

    def count_results(self, held: Callable[[], int]) -> None:
        """How to tell the bytes of this job's results still alive at its end: the report shows
        them as their own line, apart from what the runtime kept (models/base.py ResultSink)."""
        self._results_held = held

    def _report_memory(self, outcome: str, unfinished: int = 0) -> None:
        """The job's memory report: a `job_memory` event, `self.memory`, the runtime's last job."""
        try:
            gpu = next((h.gpu_device_id for h in self._used.values() if h.gpu_device_id is not None), None)
            after = self.timeline.mark("after", memory_snapshot(gpu))
            self.timeline.stop()
            rows = []
            results = self._results_held() if self._results_held is not None else 0
            for key in ("ram", "vram") if gpu is not None else ("ram",):
                weights, session_state, count = self.runtime.weights(key, gpu)
                rows.append(
                    job_figures(
                        key,
                        before=self._job_before.get(key),
                        loaded=self._loaded_bytes(key),
                        peak=self.timeline.peak(key),
                        after=after.get(key),
                        library=self.runtime.library_floor(key, gpu),
                        weights=weights, session_state=session_state,
                        cached_sessions=count,
                        results=results, unfinished=unfinished,
                    )
                )
            library = LIBRARY_RAM.get("at", 0) >= self._started_at
            job = {
                "operation": self.name,
                "outcome": outcome,
                "devices": sorted({h.device_label for h in self._used.values()}),
                "loaded_models": ["the onnxruntime library"] * library + [h.model_name for h in self._loaded],
                "released": bool(self.release_events or self.unloaded),
                "release_rules": self._release_notes(),
                "release_deferred_s": self.runtime.settings.cpu_release_delay if self._owes_cpu_release else 0,
                "runs": self.runs,
                "live_output_bytes": self._live_output_bytes,
                "figures": rows,
                "budget": list(self.budget.notes),
            }
            job["lines"] = format_job_memory(job)
            job["working_key"] = self._working_key
            remember_working(self.runtime, job)
            self.memory = job
            self.runtime.last_job_memory = job
            # named, so the picture (memory_plot.py) can say which job on which device, with the report's own peaks
            self.runtime.last_timeline = {**self.timeline.as_dict(), "operation": self.name, "devices": job["devices"], "outcome": outcome, "peaks": {f["figure"]: f["peak"] for f in rows}}
            self.runtime.events.emit("job_memory", **job)
        except Exception as exc:  # a report must never break the job
            self.timeline.stop()
            self.runtime.events.emit("job_memory_unavailable", operation=self.name, error=first_line(exc))

    def _rule(self, handle: SessionHandle) -> str:
        settings = self.runtime.settings
        if not settings.release_memory:
            return KEEP
        return release_rule(
            handle.providers, cpu_arena=handle.cpu_arena, keep_loaded=settings.keep_models_loaded_on_dml_coreml
        )

    def _unload_by_rule(self, held: list[SessionHandle]) -> None:
        """DirectML and CoreML have no arena a run could shrink: the UNLOAD rule drops the sessions
        this job used (their weights and every buffer their runs kept) now that it has ended."""
        handles = [h for h in held if h.session is not None and not h.evicted and self._rule(h) == UNLOAD]
        if handles:
            self.unloaded = self.runtime.unload_sessions(handles, "release rule: unload after the job")

    def _release_notes(self) -> list[str]:
        """One line per device the job ran on: the rule that applied to it and what it gave back."""
        notes: dict[str, None] = {}
        for handle in self._used.values():
            rule = self._rule(handle)
            note = f"{handle.device_label}: {rule} ({RELEASE_RULES[rule]})"
            if rule == UNLOAD and self.unloaded:
                gave = ", ".join(f"{k} {mb(v)}" for k, v in self.unloaded["by"].items() if v is not None)
                note += f"; {self.unloaded['sessions']} session(s) unloaded, giving back {gave or 'n/a'}"
            elif rule == KEEP and handle.release == UNLOAD:
                note += "; the preference 'Keep models loaded on DirectML/CoreML' is on"
            notes.setdefault(note)
        return list(notes)

    def _loaded_bytes(self, key: str) -> int:
        """What loading added during this job: its new sessions (and onnxruntime, if it was first
        imported during the job)."""
        total = sum(max(0, h.load_growth.get(key) or 0) for h in self._loaded)
        if key == "ram" and LIBRARY_RAM.get("at", 0) >= self._started_at:
            total += LIBRARY_RAM.get("bytes", 0)
        return total

    def _release_after_abort(self, reason: str) -> None:
        handles = list(self._dirty.values())
        cpu_done = False
        for handle in handles:
            if not handle.shrink:
                continue  # providers without a shrinkable arena run exactly as before
            started = time.perf_counter()
            at_release = memory_snapshot(handle.gpu_device_id)
            if handle.gpu_device_id is not None:
                self.runtime.evict(handle, reason=f"release_after_{reason}")
            if handle.cpu_arena and not cpu_done:
                self.runtime.release_cpu_arena()
                cpu_done = True
            self._emit_release(reason, handle, started, in_run=False, at_release=at_release)


def _as_cancel_check(cancel) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set
    if callable(cancel):
        return lambda: bool(cancel())
    raise TypeError("cancel must be None, a threading.Event or a callable returning bool")
