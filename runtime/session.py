"""A loaded model: the cached ONNX Runtime session and what the runtime learned about it."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from .measure.memory import nvidia_gpu_count, process_rss_bytes
from .onnx_inputs import weights_bytes
from .plugin_eps import registry as plugin_registry
from .providers import (
    DEVICE_BY_KIND,
    NVIDIA_PROVIDERS,
    DeviceRequest,
    describe_providers,
    release_rule,
    row_of,
    shrink_spec,
)

LIBRARY_RAM: dict = {}
"""``{"bytes": n}``: the RSS the first import of onnxruntime added, when this module imported it
(the runtime/libraries floor on CPU); empty when something else imported it first."""


def onnxruntime_module():
    """onnxruntime, imported on first use (importing the package must stay cheap)."""
    if "onnxruntime" not in sys.modules:
        before = process_rss_bytes()
        import onnxruntime

        after = process_rss_bytes()
        if before is not None and after is not None:
            LIBRARY_RAM.setdefault("bytes", max(0, after - before))
            LIBRARY_RAM.setdefault("at", time.time())
    import onnxruntime

    return onnxruntime


def installed_providers() -> list[str]:
    """The providers the installed onnxruntime offers, or CPU only when onnxruntime is missing or
    broken (a missing wheel, DLL trouble): a device menu then still has something to pick."""
    try:
        ort = onnxruntime_module()
        listed = list(ort.get_available_providers())
    except Exception:
        return ["CPUExecutionProvider"]
    try:  # plugin packages in this Python (onnxruntime-ep-webgpu, ...) that found a device
        return listed + [p for p in plugin_registry.runnable_providers(ort) if p not in listed]
    except Exception:  # an onnxruntime too old for plugin libraries: the doctor says so
        return listed


def runnable_providers(available: Iterable[str] | None = None, gpu_count=nvidia_gpu_count) -> list[str]:
    """The installed providers that can run here: the NVIDIA ones (onnxruntime-gpu lists them on
    every machine: providers.py's table) only where the driver sees a GPU (an unknown count keeps
    them: Windows' older drivers keep NVML where it is not looked for)."""
    available = installed_providers() if available is None else list(available)
    if any(p in NVIDIA_PROVIDERS for p in available) and gpu_count() == 0:
        return [p for p in available if p not in NVIDIA_PROVIDERS]
    return available


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
        # the row of the provider it really got (None for one the table does not know)
        self.device = row_of(self.providers)
        self.cpu_arena = cpu_arena and self.device is not None and self.device.host
        self.shrink = shrink_spec(self.providers, self.provider_options, cpu_arena_shrinkable=self.cpu_arena)
        # what gives its memory back when a job ends (providers.py's device table); the artist's
        # "keep models loaded" choice is applied when the job ends (operation.py)
        self.release = release_rule(self.providers, cpu_arena=self.cpu_arena)
        self.partitions: dict | None = None  # CoreML: ORT's partition report (device_sessions.py)
        self.partition_warning: str | None = None
        self.inputs = [TensorInfo(i.name, tuple(i.shape), i.type) for i in session.get_inputs()]
        self.outputs = [TensorInfo(o.name, tuple(o.shape), o.type) for o in session.get_outputs()]
        # a request for a device row that landed on another provider ("auto" asked for none)
        requested = DEVICE_BY_KIND.get(request.kind)
        self.fallback_warning = requested.fallback_warning(self.model_name, self.providers) if requested else None
        self.onnxruntime_log: list[str] = []  # ORT's own lines while it was created (runtime/log/native_log.py)
        self.evicted = False
        self.evict_reason: str | None = None
        # operations that are using this session: an eviction drops it from the cache at once,
        # but the session itself (its weights and arenas) only when the last of them ends
        self.holders: set[int] = set()
        self.created_at = time.time()
        self.last_used = self.created_at
        self.load_growth: dict = {}  # figure -> bytes that loading it added (runtime.memory figures)
        try:
            self.file_bytes = model_path.stat().st_size
        except OSError:
            self.file_bytes = 0
        try:  # what the file holds as weights; its size when it cannot be read as ONNX
            self.model_weights = weights_bytes(model_path)
        except (OSError, ValueError, IndexError):
            self.model_weights = self.file_bytes

    def weights_bytes(self, figure: str) -> int:
        """The model's weights (from the file: its initializers and constants) in the figure they
        live in: VRAM for a CUDA session, RAM otherwise. Never what loading measured: that is the
        session's whole cost (onnxruntime's per-session state too), see :meth:`session_state_bytes`."""
        on_gpu = self.gpu_device_id is not None
        return self.model_weights if on_gpu == (figure == "vram") else 0

    def session_state_bytes(self, figure: str) -> int:
        """What loading added beyond the weights (onnxruntime's graph, kernels and their buffers)."""
        grown = int(self.load_growth.get(figure) or 0)
        return max(0, grown - self.weights_bytes(figure))

    @property
    def device_label(self) -> str:
        name = describe_providers(self.providers)
        gpu = self.gpu_device_id
        return name if gpu is None else f"{name}:{gpu}"

    @property
    def gpu_device_id(self) -> int | None:
        """The device whose memory this session's figures read (its row: VRAM measurable)."""
        if self.device is None or not self.device.vram_measurable:
            return None
        return int(self.provider_options.get(self.device.provider, {}).get("device_id", 0))


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
