"""Device choice -> ONNX Runtime providers, and which arenas a session may shrink.

What was *requested* only shapes session creation. Everything after creation (shrink entries,
fallback warnings) is decided from what the session reports in `get_providers()`, because a
CUDA request can silently land on CPU and a shrink entry naming a missing arena fails the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import DeviceSpecError, ProviderUnavailableError

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
DML = "DmlExecutionProvider"
COREML = "CoreMLExecutionProvider"

SHRINK_CONFIG_KEY = "memory.enable_memory_arena_shrinkage"

# Providers whose arena ORT's shrink entry may name. DirectML and CoreML have no ORT arena,
# TensorRT keeps engine memory outside it; anything not listed runs exactly as before.
ARENA_DEVICE_BY_PROVIDER = {CUDA: "gpu", CPU: "cpu"}

# cudnn_conv_algo_search values ORT 1.31 accepts (cuda_execution_provider_info.cc)
CONV_ALGO_SEARCHES = ("HEURISTIC", "EXHAUSTIVE", "DEFAULT")

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|directml|dml|coreml)(?::(\d+))?$")


@dataclass(frozen=True)
class DeviceRequest:
    kind: str  # "auto" | "cpu" | "cuda" | "directml" | "coreml"
    index: int = 0

    def __str__(self):
        return f"{self.kind}:{self.index}" if self.kind in ("cuda", "directml") else self.kind


def parse_device(device: str | DeviceRequest | None) -> DeviceRequest:
    if isinstance(device, DeviceRequest):
        return device
    if device is not None and not str(device).strip():
        raise DeviceSpecError(
            "The device is empty. Use one of: 'auto', 'cpu', 'cuda', 'cuda:N', 'directml', "
            "'directml:N', 'coreml' (or leave the option out for 'auto')."
        )
    text = (device or "auto").strip().lower()
    match = _DEVICE_RE.match(text)
    if not match:
        raise DeviceSpecError(
            f"Unknown device {device!r}. Use one of: 'auto', 'cpu', 'cuda', 'cuda:N', "
            "'directml', 'directml:N', 'coreml'."
        )
    kind, index = match.group(1), match.group(2)
    kind = "directml" if kind == "dml" else kind
    if index is not None and kind not in ("cuda", "directml"):
        raise DeviceSpecError(f"Device {device!r}: only 'cuda' and 'directml' take an index (e.g. 'cuda:1').")
    return DeviceRequest(kind, int(index or 0))


def resolve_providers(
    request: DeviceRequest,
    available: list[str],
    *,
    gpu_mem_limit: int | None = None,
    cudnn_max_workspace: bool = False,
    conv_algo_search: str = "HEURISTIC",
) -> list[tuple[str, dict]]:
    """The provider list (with options) to create a session with."""
    if request.kind == "auto":
        for kind, provider in (("cuda", CUDA), ("directml", DML), ("coreml", COREML)):
            if provider in available:
                return resolve_providers(
                    DeviceRequest(kind, 0),
                    available,
                    gpu_mem_limit=gpu_mem_limit,
                    cudnn_max_workspace=cudnn_max_workspace,
                    conv_algo_search=conv_algo_search,
                )
        return [(CPU, {})]
    if request.kind == "cpu":
        return [(CPU, {})]
    provider = {"cuda": CUDA, "directml": DML, "coreml": COREML}[request.kind]
    if provider not in available:
        raise ProviderUnavailableError(
            f"Device '{request}' needs {provider}, which the installed onnxruntime does not offer "
            f"(it offers {', '.join(available)}). Choose another device in the add-on preferences, "
            "or install the onnxruntime build for that device."
        )
    if request.kind == "cuda":
        if conv_algo_search not in CONV_ALGO_SEARCHES:
            raise ValueError(f"cudnn_conv_algo_search must be one of {CONV_ALGO_SEARCHES}, got {conv_algo_search!r}")
        options = {
            "device_id": str(request.index),
            # Every region can be returned; with kNextPowerOfTwo region 0 is never freed.
            "arena_extend_strategy": "kSameAsRequested",
            # On (ORT's default), cuDNN's algorithm search sizes its workspace from free VRAM (up
            # to ~90 % of it), outside gpu_mem_limit, for every new input shape: Blender's VRAM.
            "cudnn_conv_use_max_workspace": "1" if cudnn_max_workspace else "0",
            # HEURISTIC picks an algorithm without running each one: tiles of varying shapes (edge
            # tiles, splits after out of memory, frames of other sizes) each trigger a new search,
            # and EXHAUSTIVE's benchmark runs allocate every candidate's workspace each time.
            "cudnn_conv_algo_search": conv_algo_search,
        }
        if gpu_mem_limit:
            options["gpu_mem_limit"] = str(int(gpu_mem_limit))
        return [(CUDA, options), (CPU, {})]
    if request.kind == "directml":
        return [(DML, {"device_id": str(request.index)}), (CPU, {})]
    return [(COREML, {}), (CPU, {})]


def shrink_spec(actual_providers: list[str], provider_options: dict, *, cpu_arena_shrinkable: bool) -> str:
    """The `memory.enable_memory_arena_shrinkage` value for a session's final run, or "".

    Decided by the session's *primary* provider (the first one it really got): a DirectML or
    CoreML session also lists CPU as a fallback, but must run exactly as before. A CUDA session
    names only its own GPU arena; only CPU sessions use the runtime's shared CPU arena.
    """
    if not actual_providers:
        return ""
    primary = actual_providers[0]
    if primary == CUDA:
        return f"gpu:{int((provider_options.get(CUDA) or {}).get('device_id', 0))}"
    if primary == CPU and cpu_arena_shrinkable:
        return "cpu:0"
    return ""


def describe_providers(actual_providers: list[str]) -> str:
    names = {
        CUDA: "CUDA",
        CPU: "CPU",
        DML: "DirectML",
        COREML: "CoreML",
        "TensorrtExecutionProvider": "TensorRT",
    }
    return names.get(actual_providers[0], actual_providers[0]) if actual_providers else "none"
