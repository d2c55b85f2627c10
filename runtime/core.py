"""The one shared inference runtime: session cache, operations and memory release.

Sessions (model weights) are long-lived and cached; the temporary arena memory a job grows is
handed back when the job's final model run ends. A job is an `Operation`; its owner marks the
final run explicitly (`last=True`), so only that run carries the arena-shrink entry.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import numpy as np

from .errors import (
    InferenceError,
    InferenceOutOfMemoryError,
    ModelFileError,
    OperationCancelled,
    first_line,
)
from .events import EventLog
from .memory import memory_snapshot, nvidia_gpu_count
from .oom import out_of_memory_resource
from .providers import (
    CPU,
    CUDA,
    SHRINK_CONFIG_KEY,
    DeviceRequest,
    describe_providers,
    parse_device,
    resolve_providers,
    shrink_spec,
)

# A passthrough graph (input "x" float[1] is also the output, no nodes). Its run allocates
# nothing from the arena, so a run of it carrying `cpu:0` can free every region of the shared
# CPU arena that is no longer in use. Built with onnx.helper; tests/test_runtime.py rebuilds it
# and checks these bytes.
RELEASE_PROBE_MODEL = bytes.fromhex(
    "0808120d6c65616e5f696d6167655f61693a31120d72656c656173655f70726f62655a0f0a0178120a0a0808"
    "0112040a020801620f0a0178120a0a08080112040a02080142040a001011"
)

# ORT's answer when a shrink entry names a device the session has no arena for
_ARENA_NOT_FOUND = "Did not find an arena based allocator"

_ENV_CPU_ARENA_LOCK = threading.Lock()
_env_cpu_arena: dict | None = None  # the config it was registered with; once per process


@dataclass(frozen=True)
class RuntimeSettings:
    release_memory: bool = True
    """Shrink arenas at the end of every operation (the spec). Off only for comparisons."""
    cpu_arena: bool = True
    """Give CPU sessions a shrinkable (kSameAsRequested) process-wide arena, so RAM comes back too."""
    cpu_arena_max_bytes: int | None = None
    """Cap for that arena. Applied when the arena is first registered (once per process)."""
    gpu_mem_limit_bytes: int | None = None
    """CUDA arena budget (`gpu_mem_limit`)."""
    intra_op_threads: int = 0


def _ort():
    import onnxruntime

    return onnxruntime


def _register_env_cpu_arena(max_bytes: int | None) -> bool:
    """Register the shared kSameAsRequested CPU arena once; True when it is usable."""
    global _env_cpu_arena
    with _ENV_CPU_ARENA_LOCK:
        if _env_cpu_arena is None:
            ort = _ort()
            config = {"arena_extend_strategy": 1}  # kSameAsRequested: every region can be freed
            if max_bytes:
                config["max_mem"] = int(max_bytes)
            info = ort.OrtMemoryInfo(
                "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
            )
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(config))
            _env_cpu_arena = config
        return True


def env_cpu_arena_config() -> dict | None:
    return None if _env_cpu_arena is None else dict(_env_cpu_arena)


def default_session_factory(model_path: str, session_options, providers):
    return _ort().InferenceSession(model_path, sess_options=session_options, providers=providers)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple  # ints for fixed dims, str/None for dynamic ones
    type: str  # e.g. "tensor(float)"

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(
            {
                "tensor(float)": np.float32,
                "tensor(float16)": np.float16,
                "tensor(double)": np.float64,
                "tensor(int64)": np.int64,
                "tensor(int32)": np.int32,
                "tensor(uint8)": np.uint8,
                "tensor(bool)": np.bool_,
            }.get(self.type, np.float32)
        )


class SessionHandle:
    """A cached session plus what the runtime learned about it when it was created."""

    def __init__(self, key, model_path: Path, request: DeviceRequest, session, *, cpu_arena: bool):
        self.key = key
        self.model_path = model_path
        self.model_name = model_path.name
        self.request = request
        self.session = session
        self.providers: list[str] = list(session.get_providers())
        self.provider_options: dict = dict(session.get_provider_options() or {})
        self.cpu_arena = cpu_arena and self.providers[:1] == [CPU]
        self.shrink = shrink_spec(self.providers, self.provider_options, cpu_arena_shrinkable=self.cpu_arena)
        self.inputs = [TensorInfo(i.name, tuple(i.shape), i.type) for i in session.get_inputs()]
        self.outputs = [TensorInfo(o.name, tuple(o.shape), o.type) for o in session.get_outputs()]
        self.fallback_warning: str | None = None
        if request.kind == "cuda" and self.providers[:1] != [CUDA]:
            self.fallback_warning = (
                f"CUDA was requested for {self.model_name} but the session runs on "
                f"{describe_providers(self.providers)}: the GPU or its CUDA/cuDNN libraries could not be used. "
                "Check the NVIDIA driver and the onnxruntime-gpu install; results are correct but slower."
            )
        self.evicted = False

    @property
    def device_label(self) -> str:
        name = describe_providers(self.providers)
        if self.providers[:1] == [CUDA]:
            return f"{name}:{int(self.provider_options.get(CUDA, {}).get('device_id', 0))}"
        return name

    @property
    def gpu_device_id(self) -> int | None:
        if self.providers[:1] == [CUDA]:
            return int(self.provider_options.get(CUDA, {}).get("device_id", 0))
        return None


T = TypeVar("T")


def mark_last(items: Iterable[T]) -> Iterator[tuple[T, bool]]:
    """Yield (item, is_last) so the owner of a loop can mark its final run explicitly."""
    iterator = iter(items)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield current, False
        current = following
    yield current, True


class Runtime:
    def __init__(
        self,
        settings: RuntimeSettings | None = None,
        *,
        session_factory: Callable | None = None,
        available_providers: Callable[[], list[str]] | None = None,
    ):
        self.settings = settings or RuntimeSettings()
        self.events = EventLog()
        self._session_factory = session_factory or default_session_factory
        self._available_providers = available_providers or (lambda: list(_ort().get_available_providers()))
        self._lock = threading.RLock()
        self._sessions: dict[tuple, SessionHandle] = {}
        self._probe = None
        self._dlls_preloaded = False
        self._cuda_usable_cache: bool | None = None
        self.sessions_created = 0

    # ---- settings -------------------------------------------------------------------------
    def configure(self, **changes) -> RuntimeSettings:
        """Change settings for sessions created from now on (existing ones keep theirs)."""
        with self._lock:
            self.settings = replace(self.settings, **changes)
            return self.settings

    # ---- sessions -------------------------------------------------------------------------
    def _model_identity(self, model_path) -> tuple[Path, tuple]:
        path = Path(model_path).expanduser()
        try:
            path = path.resolve()
            stat = path.stat()
        except FileNotFoundError:
            raise ModelFileError(
                f"Model file not found: {path}. Install the model from the add-on preferences "
                "(Lean Image AI > Models) or put the file at that path."
            ) from None
        except OSError as exc:
            raise ModelFileError(f"Cannot read model file {path}: {exc.strerror or exc}.") from exc
        if not path.is_file():
            raise ModelFileError(f"Model path {path} is not a file.")
        # size + mtime: a model replaced on disk gets a new session instead of a stale one
        return path, (str(path), stat.st_size, stat.st_mtime_ns)

    def session(self, model_path, device: str | DeviceRequest = "auto") -> SessionHandle:
        """The cached session for (model file, device, runtime settings); created on first use."""
        request = parse_device(device)
        path, identity = self._model_identity(model_path)
        settings = self.settings
        available = self._available_providers()
        if request.kind == "auto" and CUDA in available and not self._cuda_usable():
            # onnxruntime-gpu lists CUDA even with no GPU; "auto" should quietly mean CPU there
            available = [p for p in available if p != CUDA]
        providers = resolve_providers(request, available, gpu_mem_limit=settings.gpu_mem_limit_bytes)
        # Only CPU sessions join the shared CPU arena. CUDA sessions keep their host allocators as
        # ORT sets them up (env allocators interact with CUDA's pinned allocator: onnxruntime
        # #25211), and DirectML/CoreML sessions run exactly as before.
        cpu_arena = settings.cpu_arena and providers[0][0] == CPU
        key = (identity, str(request), settings.gpu_mem_limit_bytes, cpu_arena, settings.intra_op_threads)
        with self._lock:
            handle = self._sessions.get(key)
            if handle is not None:
                self.events.emit("session_reuse", model=handle.model_name, device=handle.device_label)
                return handle
            handle = self._create(key, path, request, providers, cpu_arena)
            self._sessions[key] = handle
            return handle

    def _create(self, key, path: Path, request: DeviceRequest, providers, cpu_arena: bool) -> SessionHandle:
        ort = _ort()
        options = ort.SessionOptions()
        if self.settings.intra_op_threads:
            options.intra_op_num_threads = self.settings.intra_op_threads
        uses_cuda = providers[0][0] == CUDA
        if uses_cuda:
            # weights outside the arena, so the arena holds only transient memory
            options.add_session_config_entry("session.use_device_allocator_for_initializers", "1")
            self._preload_cuda_dlls()
        if cpu_arena:
            _register_env_cpu_arena(self.settings.cpu_arena_max_bytes)
            options.add_session_config_entry("session.use_env_allocators", "1")
        started = time.perf_counter()
        try:
            session = self._session_factory(str(path), options, providers)
        except Exception as exc:
            resource = out_of_memory_resource(exc, on_gpu=uses_cuda)
            if resource:
                raise InferenceOutOfMemoryError(
                    f"Not enough {resource} to load {path.name} on {request}. Close other programs "
                    "or scenes using it, or choose the CPU device in the add-on preferences.",
                    model=path.name,
                    device=str(request),
                    resource=resource,
                    detail=str(exc),
                ) from exc
            if not type(exc).__module__.startswith("onnxruntime"):
                raise
            raise ModelFileError(
                f"Could not load {path} as an ONNX model ({first_line(exc)}). The file may be "
                "truncated or corrupt: remove it and install it again."
            ) from exc
        handle = SessionHandle(key, path, request, session, cpu_arena=cpu_arena)
        self.sessions_created += 1
        self.events.emit(
            "session_create",
            model=handle.model_name,
            device=handle.device_label,
            requested=str(request),
            providers=handle.providers,
            shrink=handle.shrink,
            seconds=round(time.perf_counter() - started, 4),
        )
        if handle.fallback_warning:
            self.events.emit(
                "provider_fallback",
                model=handle.model_name,
                requested=str(request),
                providers=handle.providers,
                message=handle.fallback_warning,
            )
        return handle

    def _cuda_usable(self) -> bool:
        if self._cuda_usable_cache is None:
            count = nvidia_gpu_count()
            self._cuda_usable_cache = count is None or count > 0  # unknown: let ORT try
        return self._cuda_usable_cache

    def _preload_cuda_dlls(self):
        if self._dlls_preloaded:
            return
        self._dlls_preloaded = True
        try:  # loads NVIDIA's CUDA/cuDNN wheels when installed; harmless otherwise
            _ort().preload_dlls()
        except Exception as exc:
            self.events.emit("cuda_preload_failed", error=first_line(exc))

    def cached_sessions(self) -> list[SessionHandle]:
        with self._lock:
            return list(self._sessions.values())

    def evict(self, handle: SessionHandle, reason: str) -> None:
        """Drop a session (weights and its arenas go with it)."""
        with self._lock:
            if self._sessions.get(handle.key) is handle:
                del self._sessions[handle.key]
            already = handle.evicted
            handle.evicted = True
            handle.session = None
        if not already:
            gc.collect()
            self.events.emit(
                "session_evict", model=handle.model_name, device=handle.device_label, reason=reason
            )

    def clear(self, reason: str = "clear") -> None:
        """Drop every cached session and give back the shared CPU arena's free regions."""
        for handle in self.cached_sessions():
            self.evict(handle, reason)
        self.release_cpu_arena()

    # ---- memory release -------------------------------------------------------------------
    def release_cpu_arena(self) -> bool:
        """Free every unused region of the shared CPU arena (a run that allocates nothing)."""
        if _env_cpu_arena is None:
            return False
        ort = _ort()
        with self._lock:
            if self._probe is None:
                options = ort.SessionOptions()
                options.add_session_config_entry("session.use_env_allocators", "1")
                self._probe = ort.InferenceSession(RELEASE_PROBE_MODEL, options, providers=[CPU])
            probe = self._probe
        run_options = ort.RunOptions()
        run_options.add_run_config_entry(SHRINK_CONFIG_KEY, "cpu:0")
        probe.run(None, {"x": np.zeros(1, np.float32)}, run_options)
        return True

    def operation(self, name: str, *, cancel=None) -> Operation:
        return Operation(self, name, cancel=cancel)


class Operation:
    """One business inference: a button press, a batch of frames, a headless call.

    Use as a context manager. Every model run goes through `run()`; the owner of the loop passes
    `last=True` on the final run of each session it used, and only that run carries the shrink
    entry. If the operation ends by cancellation or error (or without a final run), the memory
    it grew is given back on exit: the shared CPU arena by a probe run, a CUDA session's arena by
    evicting that session (the only way to free it without another model run).
    """

    def __init__(self, runtime: Runtime, name: str, *, cancel=None):
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
        self, handle: SessionHandle, feeds: dict, *, last: bool, output_names=None
    ) -> dict[str, np.ndarray]:
        if self._started is None:
            raise RuntimeError("Operation.run() called outside its `with` block")
        if id(handle) in self._finished:
            raise RuntimeError(f"{handle.model_name} already made its final run in operation {self.name!r}")
        if handle.evicted or handle.session is None:
            raise RuntimeError(f"{handle.model_name}'s session was evicted; get a new one with op.session()")
        self.check_cancelled()
        settings = self.runtime.settings
        release_now = last and settings.release_memory and bool(handle.shrink)
        ort = _ort()
        run_options = ort.RunOptions()
        if release_now:
            run_options.add_run_config_entry(SHRINK_CONFIG_KEY, handle.shrink)
        if handle.shrink and settings.release_memory and id(handle) not in self._before:
            # releases are reported against the memory before this job first ran the session
            self._before[id(handle)] = memory_snapshot(handle.gpu_device_id)
        names = list(output_names) if output_names else [o.name for o in handle.outputs]
        self.runs += 1
        self._dirty[id(handle)] = handle
        try:
            try:
                outputs = handle.session.run(names, feeds, run_options)
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
                outputs = handle.session.run(names, feeds, ort.RunOptions())
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
        if handle.cpu_arena:
            # CPU outputs are views into arena regions; owning copies stop them pinning a region
            outputs = [np.array(o, copy=True) for o in outputs]
        if last:
            self._finished.add(id(handle))
        if release_now:
            started = time.perf_counter()
            if handle.cpu_arena:
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


def _as_cancel_check(cancel) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set
    if callable(cancel):
        return lambda: bool(cancel())
    raise TypeError("cancel must be None, a threading.Event or a callable returning bool")


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    """The process-wide runtime (sessions cached in the add-on's global state)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = Runtime(_settings_from_environment())
        return _runtime


def _settings_from_environment() -> RuntimeSettings:
    """Headless/farm knobs; Blender preferences call `configure()` instead."""
    settings = RuntimeSettings()
    if os.environ.get("LEAN_IMAGE_AI_RELEASE_CPU", "").lower() in ("0", "false", "no"):
        settings = replace(settings, cpu_arena=False)
    return settings
