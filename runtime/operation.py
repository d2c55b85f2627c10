"""An operation: one job's model runs, and the release of the memory they grew when it ends."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from .errors import InferenceError, InferenceOutOfMemoryError, OperationCancelled, first_line
from .memory import memory_snapshot
from .oom import out_of_memory_resource
from .providers import CPU, CUDA, SHRINK_CONFIG_KEY
from .session import SessionHandle, onnxruntime_module

# ORT's answer when a shrink entry names a device the session has no arena for
_ARENA_NOT_FOUND = "Did not find an arena based allocator"


class Operation:
    """One business inference: a button press, a batch of frames, a headless call.

    Use as a context manager. Every model run goes through `run()`; the owner of the loop passes
    `last=True` on the final run of each session it used, and only that run carries the shrink
    entry. If the operation ends by cancellation or error (or without a final run), the memory
    it grew is given back on exit: the shared CPU arena by a probe run, a CUDA session's arena by
    evicting that session (the only way to free it without another model run).
    """

    def __init__(self, runtime, name: str, *, cancel=None):  # runtime: the core.Runtime that made it
        self.runtime = runtime
        self.name = name
        self._cancel = _as_cancel_check(cancel)
        self.runs = 0
        self.shrink_runs = 0
        self._dirty: dict[int, SessionHandle] = {}  # by id(handle): ran since their last shrink
        self._finished: set[int] = set()
        self._started = None
        self.release_events: list[dict] = []
        self._before: dict[int, dict] = {}  # by id(handle): memory before its first run here

    def __enter__(self):
        self._started = time.perf_counter()
        self.runtime.events.emit("operation_start", operation=self.name)
        return self

    def session(self, model_path, device="auto") -> SessionHandle:
        return self.runtime.session(model_path, device)

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
        if self._started is None:
            raise RuntimeError("Operation.run() called outside its `with` block")
        if id(handle) in self._finished:
            raise RuntimeError(f"{handle.model_name} already made its final run in operation {self.name!r}")
        if handle.evicted or handle.session is None:
            raise RuntimeError(f"{handle.model_name}'s session was evicted; get a new one with op.session()")
        self.check_cancelled()
        settings = self.runtime.settings
        release_now = last and settings.release_memory and bool(handle.shrink)
        ort = onnxruntime_module()
        run_options = ort.RunOptions()
        if release_now:
            run_options.add_run_config_entry(SHRINK_CONFIG_KEY, handle.shrink)
        if handle.shrink and settings.release_memory and id(handle) not in self._before:
            # releases are reported against the memory before this job first ran the session
            self._before[id(handle)] = memory_snapshot(handle.gpu_device_id)
        names = list(output_names) if output_names else [o.name for o in handle.outputs]
        self.runs += 1
        self._dirty[id(handle)] = handle
        bound = _bindable(handle, out)

        def invoke(options):
            if not bound:
                return handle.session.run(names, feeds, options)
            return _run_bound(handle.session, names, feeds, out, options)

        try:
            try:
                outputs = invoke(run_options)
            except Exception as exc:
                if not (release_now and _ARENA_NOT_FOUND in str(exc)):
                    raise
                # the session has no arena for that device after all: keep it running as before
                self.runtime.events.emit(
                    "release_unsupported",
                    model=handle.model_name,
                    device=handle.device_label,
                    shrink=handle.shrink,
                    detail=first_line(exc),
                )
                handle.shrink = ""
                release_now = False
                outputs = invoke(ort.RunOptions())
        except Exception as exc:
            resource = out_of_memory_resource(exc, on_gpu=handle.gpu_device_id is not None)
            if resource is None:
                raise InferenceError(
                    f"{handle.model_name} failed on {handle.device_label}: {first_line(exc)}"
                ) from exc
            self._dirty.pop(id(handle), None)
            self.runtime.evict(handle, reason="out_of_memory")
            self.runtime.events.emit(
                "out_of_memory",
                operation=self.name,
                model=handle.model_name,
                device=handle.device_label,
                resource=resource,
                detail=first_line(exc),
            )
            raise InferenceOutOfMemoryError(
                f"Out of {resource} while running {handle.model_name} on {handle.device_label}. "
                "Try a smaller tile size or a lower resolution, or close other programs using the memory"
                + (
                    ", or switch the device to CPU in the add-on preferences."
                    if handle.gpu_device_id is not None
                    else "."
                ),
                model=handle.model_name,
                device=handle.device_label,
                resource=resource,
                detail=str(exc),
            ) from exc
        all_bound = bound and all(name in out for name in names)
        if not bound:
            # CPU outputs are views into arena regions; owning copies stop them pinning a region.
            # A provider without IOBinding here copies into the caller's arrays instead.
            targets = [(out or {}).get(name) for name in names]
            outputs = [_copy_into(t, o, handle.cpu_arena) for t, o in zip(targets, outputs, strict=True)]
        if last:
            self._finished.add(id(handle))
        if release_now:
            started = time.perf_counter()
            if handle.cpu_arena and not all_bound:
                self.runtime.release_cpu_arena()  # regions the outputs pinned during the run
            self._dirty.pop(id(handle), None)
            self.shrink_runs += 1
            self._emit_release("operation_complete", handle, started, in_run=True)
        elif last:
            self._dirty.pop(id(handle), None)
        return dict(zip(names, outputs, strict=True))

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

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            outcome = "no_final_run" if self._dirty else "success"
        elif isinstance(exc, OperationCancelled):
            outcome = "cancelled"
        elif isinstance(exc, InferenceOutOfMemoryError):
            outcome = "out_of_memory"
        else:
            outcome = "error"
        if self._dirty and self.runtime.settings.release_memory:
            self._release_after_abort(outcome)
        self._dirty.clear()
        self.runtime.events.emit(
            "operation_end",
            operation=self.name,
            outcome=outcome,
            runs=self.runs,
            seconds=round(time.perf_counter() - (self._started or time.perf_counter()), 4),
        )
        return False

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


def _bindable(handle: SessionHandle, out) -> bool:
    """IOBinding into host memory: the CPU provider writes there directly, CUDA copies there."""
    return bool(out) and handle.providers[:1] in ([CPU], [CUDA])


def _run_bound(session, names, feeds, out, run_options):
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, np.ascontiguousarray(value))
    for name in names:
        target = out.get(name)
        if target is None:
            binding.bind_output(name, "cpu")
            continue
        if not target.flags.c_contiguous:
            raise ValueError(f"the output array for {name!r} must be C-contiguous")
        binding.bind_output(name, "cpu", 0, target.dtype, list(target.shape), target.ctypes.data)
    session.run_with_iobinding(binding, run_options)
    if all(name in out for name in names):
        return [out[name] for name in names]  # written in place: no copy
    copies = binding.copy_outputs_to_cpu()
    return [out.get(name, value) for name, value in zip(names, copies, strict=True)]


def _copy_into(target, value, owned_copy: bool):
    if target is None:
        return np.array(value, copy=True) if owned_copy else value
    np.copyto(target, value)
    return target


def _as_cancel_check(cancel) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set
    if callable(cancel):
        return lambda: bool(cancel())
    raise TypeError("cancel must be None, a threading.Event or a callable returning bool")
