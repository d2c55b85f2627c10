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
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from . import load_errors
from .errors import (
    DeviceSpecError,
    InferenceOutOfMemoryError,
    ModelFileError,
    SessionClosedError,
    first_line,
)
from .events import EventLog
from .memory import nvidia_gpu_count
from .oom import out_of_memory_resource
from .operation import Operation
from .providers import (
    CPU,
    CUDA,
    SHRINK_CONFIG_KEY,
    DeviceRequest,
    parse_device,
    resolve_providers,
)
from .session import SessionHandle, onnxruntime_module

# A passthrough graph (input "x" float[1] is also the output, no nodes). Its run allocates
# nothing from the arena, so a run of it carrying `cpu:0` can free every region of the shared
# CPU arena that is no longer in use. Built with onnx.helper; tests/test_runtime.py rebuilds it
# and checks these bytes.
RELEASE_PROBE_MODEL = bytes.fromhex(
    "0808120d6c65616e5f696d6167655f61693a31120d72656c656173655f70726f62655a0f0a0178120a0a0808"
    "0112040a020801620f0a0178120a0a08080112040a02080142040a001011"
)

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


def _register_env_cpu_arena(max_bytes: int | None) -> bool:
    """Register the shared kSameAsRequested CPU arena once; True when it is usable."""
    global _env_cpu_arena
    with _ENV_CPU_ARENA_LOCK:
        if _env_cpu_arena is None:
            ort = onnxruntime_module()
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


def visible_cuda_count() -> int | None:
    """GPUs CUDA will number 0..N-1: the driver's count, narrowed by CUDA_VISIBLE_DEVICES."""
    count = nvidia_gpu_count()
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None or count is None:
        return count
    listed = []
    for item in mask.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break  # CUDA stops at the first invalid entry
        listed.append(item)
    return min(count, len(listed))


def default_session_factory(model_path: str, session_options, providers):
    return onnxruntime_module().InferenceSession(model_path, sess_options=session_options, providers=providers)


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
        self._available_providers = available_providers or (lambda: list(onnxruntime_module().get_available_providers()))
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
        except RuntimeError as exc:  # Python < 3.13: "Symlink loop from ..."
            raise load_errors.symlink_loop(path) from exc
        except OSError as exc:
            raise load_errors.os_error(path, exc) from exc
        if not path.is_file():
            raise ModelFileError(
                f"Model path {path} is not a file (a folder or a device). Choose the .onnx file "
                "itself, or install the model again from the add-on preferences."
            )
        try:  # the OS's own answer (permission, busy), before onnxruntime turns it into prose
            os.close(os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0)))
        except OSError as exc:
            raise load_errors.os_error(path, exc) from exc
        # size + mtime: a model replaced on disk gets a new session instead of a stale one
        return path, (str(path), stat.st_size, stat.st_mtime_ns)

    def session(self, model_path, device: str | DeviceRequest = "auto", *, holder=None) -> SessionHandle:
        """The cached session for (model file, device, runtime settings); created on first use.

        ``holder`` (an Operation) marks the session as in use by that job until it ends: an
        eviction meanwhile drops it from the cache but the job keeps running on it.
        """
        request = parse_device(device)
        if request.kind == "cuda":
            self._check_gpu_index(request)
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
            if handle is None and holder is not None:
                # evicted while this job was using it: the job finishes on the session it began with
                handle = holder.held_session(key)
            if handle is not None:
                self.events.emit("session_reuse", model=handle.model_name, device=handle.device_label)
            else:
                handle = self._create(key, path, request, providers, cpu_arena)
                self._sessions[key] = handle
            if holder is not None:
                self.hold(handle, holder)
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
            on_device = providers[0][0] != CPU
            raise load_errors.load_failure(exc, path, device=str(request), on_device=on_device) from exc
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
        try:  # loads NVIDIA's CUDA/cuDNN wheels when installed; harmless otherwise
            onnxruntime_module().preload_dlls()
        except Exception as exc:
            self.events.emit("cuda_preload_failed", error=first_line(exc))

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

    # ---- memory release -------------------------------------------------------------------
    def release_cpu_arena(self) -> bool:
        """Free every unused region of the shared CPU arena (a run that allocates nothing)."""
        if _env_cpu_arena is None:
            return False
        ort = onnxruntime_module()
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
