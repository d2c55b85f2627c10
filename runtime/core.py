"""The one shared inference runtime: session cache, operations and memory release.

Sessions (model weights) are long-lived and cached; the temporary arena memory a job grows is
handed back when the job's final model run ends. A job is an `Operation`; its owner marks the
final run explicitly (`last=True`), so only that run carries the arena-shrink entry.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from . import device_sessions, load_errors
from .cuda import cuda_preload, gpu_index
from .errors import (
    DeviceSpecError,
    InferenceOutOfMemoryError,
    SessionClosedError,
)
from .log import native_log
from .log.events import EventLog
from .measure.memory import figures, memory_snapshot, nvidia_gpu_count
from .oom import out_of_memory_resource
from .operation import Operation
from .plugin_eps import registry as plugin_registry
from .providers import (
    CPU,
    DEVICE_BY_KIND,
    DEVICE_BY_PROVIDER,
    NVIDIA_PROVIDERS,
    DeviceRequest,
    ProviderChoices,
    parse_device,
    resolve_providers,
)
from .release.cpu_arena import register_env_cpu_arena
from .release.deferred_release import DeferredRelease
from .release.on_request import ReleaseOnRequest
from .release.scratch import ScratchBuffers
from .session import LIBRARY_RAM, SessionHandle, installed_providers, onnxruntime_module
from .settings import MemoryBudgets, RuntimeSettings, settings_from_environment

# The events are the runtime's record (event log, file, panels): no raw JSON lines on stderr from
# logging's last-resort handler where no logging was set up (where it was, the records still go).
logging.getLogger("lean_image_ai").addHandler(logging.NullHandler())


def visible_cuda_count() -> int | None:
    """GPUs CUDA will number 0..N-1: the driver's count, narrowed by CUDA_VISIBLE_DEVICES."""
    return gpu_index.visible_cuda_count(nvidia_gpu_count)


def default_session_factory(model_path: str, session_options, providers):
    return plugin_registry.inference_session(onnxruntime_module(), model_path, session_options, providers)


class Runtime(ReleaseOnRequest):
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
        self._available_providers = available_providers or installed_providers
        self._lock = threading.RLock()
        self._sessions: dict[tuple, SessionHandle] = {}
        self._probe = None
        self._dlls_preloaded = False
        self._preload: cuda_preload.Preload | None = None
        self._cuda_usable_cache: bool | None = None
        self.sessions_created = 0
        self.last_job_memory: dict | None = None  # the last operation's report (memory_report)
        self.last_timeline: dict | None = None  # its memory timeline (timeline.Timeline.as_dict)
        self.working_memory: dict[tuple, int] = {}  # (model name, input shape) -> what its runs grew
        self._cuda_floor: dict[int, int] = {}  # device -> VRAM the first session added beyond its file
        self.deferred = DeferredRelease(self)
        self.scratch = ScratchBuffers(self)  # bound outputs' buffers, kept while the arena is

    # ---- settings -------------------------------------------------------------------------
    def configure(self, **changes) -> RuntimeSettings:
        """Change settings for sessions created from now on (existing ones keep theirs)."""
        with self._lock:
            self.settings = replace(self.settings, **changes)
            return self.settings

    # ---- sessions -------------------------------------------------------------------------
    def session(
        self, model_path, device: str | DeviceRequest = "auto", *, holder=None, static_shapes: bool | None = None
    ) -> SessionHandle:
        """The cached session for (model file, device, runtime settings); created on first use.

        ``holder`` (an Operation) marks the session as in use by that job until it ends: an
        eviction meanwhile drops it from the cache but the job keeps running on it.
        ``static_shapes``: CoreML RequireStaticInputShapes (None: whether the file fixes every input).
        """
        request = parse_device(device)
        if request.kind != "auto" and DEVICE_BY_KIND[request.kind].nvidia:
            self._check_gpu_index(request)
        path, identity = load_errors.model_identity(model_path)
        settings = self.settings
        if holder is not None:  # the job's own arena cap (its VRAM budget), not another job's
            settings = replace(settings, gpu_mem_limit_bytes=holder.gpu_mem_limit)
        available = self._available_providers()
        if request.kind == "auto" and NVIDIA_PROVIDERS.intersection(available) and not self._cuda_usable():
            # onnxruntime-gpu lists CUDA even with no GPU; "auto" should quietly mean CPU there
            available = [p for p in available if p not in NVIDIA_PROVIDERS]
        choices = ProviderChoices.of(settings, static_shapes=static_shapes, model_path=path)
        providers = resolve_providers(request, available, choices)
        row = DEVICE_BY_PROVIDER[providers[0][0]]
        # Only CPU sessions join the shared CPU arena. CUDA sessions keep their host allocators as
        # ORT sets them up (env allocators interact with CUDA's pinned allocator: onnxruntime
        # #25211), and DirectML/CoreML sessions run exactly as before.
        cpu_arena = settings.cpu_arena and row.host
        key = (identity, str(request), settings.gpu_mem_limit_bytes, cpu_arena, settings.intra_op_threads)
        # other provider options (cuDNN's choices, CoreML's compute units or shapes): another session
        key += tuple(sorted(providers[0][1].items()))
        with self._lock:
            handle = self._sessions.get(key)
            if handle is None and holder is not None:
                # evicted while this job was using it: the job finishes on the session it began with
                handle = holder.held_session(key)
            if handle is not None:
                self.events.emit("session_reuse", model=handle.model_name, device=handle.device_label)
            else:
                handle = self._sessions[key] = self._new_session(key, path, request, providers, cpu_arena, settings)
            if holder is not None:
                self.hold(handle, holder)
            return handle

    def _new_session(self, key, path: Path, request: DeviceRequest, providers, cpu_arena: bool, settings):
        handle = self._create(key, path, request, providers, cpu_arena)
        remake = DEVICE_BY_PROVIDER[providers[0][0]].remake_in_cpu_arena and settings.cpu_arena
        if handle.fallback_warning and remake:
            handle = self._recreate_on_cpu(key, path, request, handle)
        if handle.fallback_warning:  # said once, after the CPU remake
            fallback = {"model": handle.model_name, "requested": str(request), "providers": handle.providers}
            self.events.emit("provider_fallback", **fallback, message=handle.fallback_warning)
        return handle

    def hold(self, handle: SessionHandle, holder) -> None:
        """Mark ``handle`` as used by ``holder`` until :meth:`unhold`; raises SessionClosedError
        when its session was already dropped."""
        with self._lock:
            if handle.session is None:
                raise SessionClosedError(
                    f"{handle.model_name} was unloaded ({handle.evict_reason or 'evicted'}) before this "
                    "job could run it; nothing was written. Run the job again: it loads the model anew.",
                    model=handle.model_name,
                )
            handle.holders.add(id(holder))

    def unhold(self, handle: SessionHandle, holder) -> None:
        """``holder`` is done with ``handle``; an evicted session goes with its last holder."""
        with self._lock:
            handle.holders.discard(id(holder))
            drop = handle.evicted and not handle.holders and handle.session is not None
            if drop:
                handle.session = None
        if drop:
            gc.collect()
            self.events.emit(
                "session_closed", model=handle.model_name, device=handle.device_label, reason=handle.evict_reason
            )

    def _create(self, key, path: Path, request: DeviceRequest, providers, cpu_arena: bool) -> SessionHandle:
        ort = onnxruntime_module()
        options = device_sessions.session_options(ort, providers, intra_op_threads=self.settings.intra_op_threads)
        row = DEVICE_BY_PROVIDER[providers[0][0]]
        if row.addon_libraries:
            self._preload_cuda_dlls()
        if cpu_arena:
            self._join_cpu_arena(options)
        started = time.perf_counter()
        gpu_id = int(providers[0][1].get("device_id", 0)) if row.vram_measurable else None
        loading = figures(memory_snapshot(gpu_id))
        ort_log: list[str] = []
        try:
            with native_log.captured() as ort_log:
                session = self._session_factory(str(path), options, providers)
        except Exception as exc:
            failure = _load_error(exc, path, request, row)
            if failure is None:
                raise
            raise failure from exc
        finally:
            if ort_log:
                self.events.emit("onnxruntime_log", model=path.name, requested=str(request), lines=ort_log)
        handle = SessionHandle(key, path, request, session, cpu_arena=cpu_arena)
        handle.onnxruntime_log = ort_log  # what ORT said while creating it (kept, not printed)
        device_sessions.note_partitions(handle, ort_log)
        loaded = figures(memory_snapshot(handle.gpu_device_id))
        handle.load_growth = {k: loaded[k] - loading[k] for k in loaded if None not in (loaded[k], loading[k])}
        if handle.gpu_device_id is not None and "vram" in handle.load_growth:
            # the first CUDA session on a device also brings the context and cuDNN/cuBLAS handles
            self._cuda_floor.setdefault(handle.gpu_device_id, max(0, handle.load_growth["vram"] - handle.file_bytes))
        self.sessions_created += 1
        self.events.emit(
            "session_create",
            model=handle.model_name,
            device=handle.device_label,
            requested=str(request),
            providers=handle.providers,
            shrink=handle.shrink,
            release=handle.release,
            seconds=round(time.perf_counter() - started, 4),
            **({"partitions": handle.partitions} if handle.partitions else {}),
        )
        failed = cuda_preload.failure(self._preload, handle.providers) if row.addon_libraries else None
        if failed:
            handle.fallback_warning = (
                f"{handle.fallback_warning or ''} CUDA/cuDNN libraries that did not load: {self._preload.describe()}."
            ).strip()
            self.events.emit("cuda_preload_failed", model=handle.model_name, **failed)
        return handle

    def _join_cpu_arena(self, options) -> None:
        register_env_cpu_arena(self.settings.cpu_arena_max_bytes)
        options.add_session_config_entry("session.use_env_allocators", "1")
        # No memory pattern: with it, the second run of an input shape allocates one block for
        # the whole plan, which the kSameAsRequested arena cannot carve from the first run's
        # freed chunks, so every shape held its working memory twice (compact x4 at 256 px:
        # 44 MB after one run, 90 MB after two; RealESRGAN_x4plus at 1080p: +1.1 GB per shape).
        options.enable_mem_pattern = False

    def _recreate_on_cpu(self, key, path: Path, request: DeviceRequest, fallen: SessionHandle) -> SessionHandle:
        """A CUDA request that landed on CPU, made again in the shared CPU arena so the job gives
        its RAM back like a CPU job (ORT's own fallback has no shrinkable arena); the warning stays."""
        fallen.session = None
        gc.collect()
        handle = self._create(key, path, request, [(CPU, {})], True)
        handle.fallback_warning = fallen.fallback_warning
        handle.onnxruntime_log = fallen.onnxruntime_log + handle.onnxruntime_log
        return handle

    def _check_gpu_index(self, request: DeviceRequest) -> None:
        """``cuda:N`` beyond the visible GPUs is a mistake to report, not a reason to run on CPU.
        (``cuda:0`` with no GPU at all stays a fallback with a warning.)"""
        count = visible_cuda_count()
        if count is None or request.index < count or (count == 0 and request.index == 0):
            return
        visible = ", ".join(f"cuda:{i}" for i in range(count)) if count else "none"
        raise DeviceSpecError(
            f"Device '{request}' names GPU {request.index}, but {count} NVIDIA GPU(s) are visible "
            f"to this process (visible: {visible}). Choose one of those, or 'auto' or 'cpu'"
            + ("; check CUDA_VISIBLE_DEVICES." if os.environ.get("CUDA_VISIBLE_DEVICES") is not None else ".")
        )

    def _cuda_usable(self) -> bool:
        if self._cuda_usable_cache is None:
            count = nvidia_gpu_count()
            self._cuda_usable_cache = count is None or count > 0  # unknown: let ORT try
        return self._cuda_usable_cache

    def _preload_cuda_dlls(self):
        if self._dlls_preloaded:
            return
        self._dlls_preloaded = True
        # never raises for a missing library (it prints): the session's providers tell, see _create
        self._preload = cuda_preload.preload(onnxruntime_module())

    def cached_sessions(self) -> list[SessionHandle]:
        with self._lock:
            return list(self._sessions.values())

    def evict(self, handle: SessionHandle, reason: str, *, force: bool = False) -> None:
        """Drop a session from the cache. Its weights and arenas go now, or, while operations
        still use it, when the last of them ends (``force``: now, for the job that holds it
        and must free its memory, such as after running out of it)."""
        with self._lock:
            if self._sessions.get(handle.key) is handle:
                del self._sessions[handle.key]
            already = handle.evicted
            handle.evicted = True
            if not already:
                handle.evict_reason = reason
            dropped = handle.session is not None and (force or not handle.holders)
            if dropped:
                handle.session = None
        if dropped:
            gc.collect()
        if not already:
            self.events.emit(
                "session_evict",
                model=handle.model_name,
                device=handle.device_label,
                reason=reason,
                in_use=not dropped and handle.session is not None,
            )

    def clear(self, reason: str = "clear") -> None:
        """Drop every cached session and give back the shared CPU arena's free regions."""
        for handle in self.cached_sessions():
            self.evict(handle, reason)
        self.release_cpu_arena()

    # ---- floors ---------------------------------------------------------------------------
    def library_floor(self, figure: str, gpu_device_id: int | None = None) -> int | None:
        """Runtime/libraries: the onnxruntime library in RAM (measured at its first import);
        on a GPU the CUDA context and cuDNN/cuBLAS handles (first session's load beyond its file)."""
        if figure == "ram":
            return LIBRARY_RAM.get("bytes")
        return self._cuda_floor.get(gpu_device_id)

    def weights(self, figure: str, gpu_device_id: int | None = None) -> tuple[int, int, int]:
        """(weights bytes read from the model files, the sessions' own state in RAM, session
        count) of the cached sessions in one figure."""
        handles = [
            h for h in self.cached_sessions() if figure == "ram" or h.gpu_device_id == gpu_device_id
        ]
        state = sum(h.session_state_bytes(figure) for h in handles) if figure == "ram" else 0
        return sum(h.weights_bytes(figure) for h in handles), state, len(handles)

    def operation(self, name: str, *, cancel=None, budgets: MemoryBudgets | None = None) -> Operation:
        """A job (see Operation); ``budgets``: its own memory budgets, else the runtime's settings'."""
        return Operation(self, name, cancel=cancel, budgets=budgets)


def _load_error(exc: Exception, path: Path, request: DeviceRequest, row) -> Exception | None:
    """What a failed session creation is said as; None for an error that is not onnxruntime's."""
    resource = out_of_memory_resource(exc, on_gpu=row.vram_measurable)
    if resource:
        return InferenceOutOfMemoryError(
            f"Not enough {resource} to load {path.name} on {request}. Close other programs "
            "or scenes using it, or choose the CPU device in the add-on preferences.",
            model=path.name,
            device=str(request),
            resource=resource,
            detail=str(exc),
        )
    if not type(exc).__module__.startswith("onnxruntime"):
        return None
    return load_errors.load_failure(exc, path, device=str(request), on_device=not row.host)


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    """The process-wide runtime (sessions cached in the add-on's global state)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = Runtime(settings_from_environment())
        return _runtime
