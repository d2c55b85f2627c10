"""The device table: one row per kind of device, its capabilities as columns; device choice -> ONNX Runtime providers, and which arenas a session may shrink.

Every difference between devices (the fallback warning and where to get the missing runtime,
whether VRAM can be measured, IO binding, the fp16 preference, the release rule, session options,
the preferences that shape its options) is a column of `DeviceKind`, read where it is needed:
no other module compares provider names or device kinds. A new row (`add_device`) gets the
fallback warning and a release rule by construction.

What was *requested* only shapes session creation. Everything after creation (shrink entries,
fallback warnings) is decided from what the session reports in `get_providers()`, because a
CUDA request can silently land on CPU and a shrink entry naming a missing arena fails the run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .errors import DeviceSpecError, ProviderUnavailableError
from .onnx_inputs import all_inputs_static
from .paths import user_cache_root

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
DML = "DmlExecutionProvider"
COREML = "CoreMLExecutionProvider"

SHRINK_CONFIG_KEY = "memory.enable_memory_arena_shrinkage"
# DirectML's pooling allocator (BucketizedBufferAllocator) keeps every freed per-run buffer,
# rounded up to a power of two, until the session is destroyed; with this session entry its
# sizes are not rounded after load, so per-run buffers go back when their run ends
# (onnxruntime dml_provider_factory.cc reads it; ExecutionProvider OnSessionInitializationEnd).
DML_DISABLE_ARENA_KEY = "ep.dml.disable_memory_arena"

# cudnn_conv_algo_search values ORT 1.31 accepts (cuda_execution_provider_info.cc)
CONV_ALGO_SEARCHES = ("HEURISTIC", "EXHAUSTIVE", "DEFAULT")
# MLComputeUnits values ORT's CoreML provider accepts (coreml_options.cc); CPUOnly is left out
# of the preference: the CPU device does that without CoreML's conversion.
COREML_COMPUTE_UNITS = ("ALL", "CPUAndGPU", "CPUAndNeuralEngine")

# ---- release rules: what gives a device's memory back when a job ends ----------------------
SHRINK = "shrink"  # the shrink entry on the job's last run of each session (the spec)
UNLOAD = "unload"  # the job's sessions are dropped when it ends; the next job loads them again
KEEP = "keep"  # nothing is given back: no arena to shrink, or the artist keeps models loaded
RELEASE_RULES = {
    SHRINK: "the arena shrinks in the job's last run; weights stay loaded",
    UNLOAD: "the job's sessions are unloaded when it ends; the next job loads the model again",
    KEEP: "nothing is given back at the job's end (models stay loaded)",
}


@dataclass(frozen=True)
class ProviderChoices:
    """The settings that shape a provider's options (from RuntimeSettings; see core.py)."""

    gpu_mem_limit: int | None = None
    cudnn_max_workspace: bool = False
    conv_algo_search: str = "HEURISTIC"
    coreml_compute_units: str = "ALL"
    coreml_cache_dir: str | None = None
    # CoreML RequireStaticInputShapes; None: on when the model file declares every input's shape
    static_shapes: bool | None = None
    model_path: str | None = None

    @classmethod
    def of(cls, settings, *, static_shapes: bool | None = None, model_path=None) -> ProviderChoices:
        """The choices a core.RuntimeSettings makes (CoreML's cache: the per-user cache folder)."""
        return cls(
            gpu_mem_limit=settings.gpu_mem_limit_bytes,
            cudnn_max_workspace=settings.cudnn_max_workspace,
            conv_algo_search=settings.cudnn_conv_algo_search,
            coreml_compute_units=settings.coreml_compute_units,
            coreml_cache_dir=settings.coreml_cache_dir or str(user_cache_root() / "coreml"),
            static_shapes=static_shapes,
            model_path=None if model_path is None else str(model_path),
        )


def _cuda_options(request: DeviceRequest, choices: ProviderChoices) -> dict:
    if choices.conv_algo_search not in CONV_ALGO_SEARCHES:
        raise ValueError(
            f"cudnn_conv_algo_search must be one of {CONV_ALGO_SEARCHES}, got {choices.conv_algo_search!r}"
        )
    options = {
        "device_id": str(request.index),
        # Every region can be returned; with kNextPowerOfTwo region 0 is never freed.
        "arena_extend_strategy": "kSameAsRequested",
        # On (ORT's default), cuDNN's algorithm search sizes its workspace from free VRAM (up
        # to ~90 % of it), outside gpu_mem_limit, for every new input shape: Blender's VRAM.
        "cudnn_conv_use_max_workspace": "1" if choices.cudnn_max_workspace else "0",
        # HEURISTIC picks an algorithm without running each one: tiles of varying shapes (edge
        # tiles, splits after out of memory, frames of other sizes) each trigger a new search,
        # and EXHAUSTIVE's benchmark runs allocate every candidate's workspace each time.
        "cudnn_conv_algo_search": choices.conv_algo_search,
    }
    if choices.gpu_mem_limit:
        options["gpu_mem_limit"] = str(int(choices.gpu_mem_limit))
    return options


def _directml_options(request: DeviceRequest, choices: ProviderChoices) -> dict:
    return {"device_id": str(request.index)}


def _coreml_options(request: DeviceRequest, choices: ProviderChoices) -> dict:
    if choices.coreml_compute_units not in COREML_COMPUTE_UNITS:
        raise ValueError(
            f"CoreML compute units must be one of {COREML_COMPUTE_UNITS}, got {choices.coreml_compute_units!r}"
        )
    static = choices.static_shapes
    if static is None:  # fixed inputs (a fixed-tile upscaler, DA3's 280x504): compiled once for them
        static = choices.model_path is not None and all_inputs_static(choices.model_path)
    options = {
        # ML Program runs fp16/fp32 on the GPU and Neural Engine and covers more operators than
        # the older NeuralNetwork format (ORT's default)
        "ModelFormat": "MLProgram",
        "MLComputeUnits": choices.coreml_compute_units,
        # on for a model with a free dimension, CoreML would take none of its graph
        "RequireStaticInputShapes": "1" if static else "0",
    }
    if choices.coreml_cache_dir:
        # compiled once per model and shape, not at every load (the unload rule loads often)
        options["ModelCacheDirectory"] = str(choices.coreml_cache_dir)
    return options


@dataclass(frozen=True)
class DeviceKind:
    """One row of the device table: everything the runtime knows about a kind of device. Every
    difference between devices is a column here, read by the code that needs it, so a new row
    gets the fallback warning, the release rule and the rest by construction (add_device)."""

    kind: str  # the device string's name: "cuda", "directml", "coreml", "cpu"
    provider: str  # onnxruntime's provider
    label: str  # what the artist reads
    takes_index: bool  # "cuda:1", "directml:1"
    auto_rank: int | None  # order "auto" tries it in (None: only as the fallback)
    arena_device: str | None  # the shrink entry's device name ("gpu", "cpu"), None: no ORT arena
    options: Callable[[DeviceRequest, ProviderChoices], dict]
    release: str  # SHRINK, UNLOAD or KEEP: what gives its memory back when a job ends
    session_entries: tuple[tuple[str, str], ...] = ()  # session config entries it needs
    aliases: tuple[str, ...] = ()  # other names the device string accepts ("dml")
    # the preferences' device menu: its label and tooltip, and the enum number Blender stores in
    # saved preferences (stable: never reuse or renumber one)
    menu_label: str = ""
    menu_text: str = ""
    enum_number: int = -1
    # why a request for it can land elsewhere, and what to do (the fallback warning's middle)
    fallback_cause: str = ""
    runtime_source: str = "the onnxruntime build for that device"  # what offers its provider
    host: bool = False  # the CPU itself: always offered, what others fall back to, the shared CPU arena
    vram_measurable: bool = False  # its memory is readable per device (NVML): budgets, VRAM figures
    io_binding: bool = False  # outputs can be bound into host memory (the runtime writes in place)
    prefers_fp16: bool = False  # fp16-weight files run at least as well as fp32 ones (catalog order)
    nvidia: bool = False  # runs only where the NVIDIA driver sees a GPU; its index counts those
    addon_libraries: bool = False  # the add-on installs and preloads its libraries (runtime/cuda)
    remake_in_cpu_arena: bool = False  # landed on CPU: made again in the shared CPU arena
    memory_pattern: bool = True  # False: no memory pattern and sequential execution (DirectML)
    partition_report: bool = False  # ORT logs how much of the graph it takes (CoreML), at INFO
    cache_option: str | None = None  # a provider option naming a folder it compiles into
    index_preference: str | None = None  # the preference holding its index (the menu's device)
    preferences: tuple[str, ...] = ()  # the other preferences that shape its options

    def __post_init__(self):
        if self.release not in RELEASE_RULES:
            raise ValueError(f"device {self.kind!r}: release must be one of {sorted(RELEASE_RULES)}, got {self.release!r}")

    @property
    def release_text(self) -> str:
        return RELEASE_RULES[self.release]

    def fallback_warning(self, model_name: str, actual_providers: list[str]) -> str | None:
        """The artist's line when a request for this device landed on another provider."""
        if self.host or actual_providers[:1] == [self.provider]:
            return None
        cause = self.fallback_cause or (
            f"{self.label} could not be used here. Check its driver and that {self.runtime_source} is installed"
        )
        return (
            f"{self.label} was requested for {model_name} but the session runs on "
            f"{describe_providers(actual_providers)}: {cause}; results are correct but slower."
        )


DEVICES: list[DeviceKind] = [
    DeviceKind(
        "cuda", CUDA, "CUDA", True, 0, "gpu", _cuda_options, SHRINK,
        # weights outside the arena, so the arena holds only what the runs grew
        (("session.use_device_allocator_for_initializers", "1"),),
        menu_label="CUDA (NVIDIA)", menu_text="Run on an NVIDIA GPU with CUDA", enum_number=2,
        fallback_cause="the GPU or its CUDA/cuDNN libraries could not be used. "
        "Check the NVIDIA driver and the onnxruntime-gpu install",
        runtime_source="onnxruntime-gpu", vram_measurable=True, io_binding=True, prefers_fp16=True,
        nvidia=True, addon_libraries=True, index_preference="cuda_device_index",
        preferences=("cudnn_max_workspace",),
        # ORT's own CPU fallback has no shrinkable arena: remade, the job gives its RAM back
        remake_in_cpu_arena=True,
    ),
    DeviceKind(
        "directml", DML, "DirectML", True, 1, None, _directml_options, UNLOAD, ((DML_DISABLE_ARENA_KEY, "1"),),
        aliases=("dml",), menu_label="DirectML", menu_text="Run on a DirectX 12 GPU (Windows)", enum_number=3,
        fallback_cause="DirectML could not use this GPU. Update the graphics driver",
        runtime_source="onnxruntime-directml",
        # DirectML runs neither memory patterns nor parallel execution (ORT's DirectML notes)
        memory_pattern=False,
    ),
    DeviceKind(
        "coreml", COREML, "CoreML", False, 2, None, _coreml_options, UNLOAD,
        menu_label="CoreML (Apple)", menu_text="Run with Apple CoreML", enum_number=4,
        fallback_cause="CoreML could not use this GPU. Update the graphics driver",
        runtime_source="onnxruntime for macOS", partition_report=True, cache_option="ModelCacheDirectory",
        preferences=("coreml_compute_units",),
    ),
    # CPU shrinks only the runtime's shared env arena (core.py); without it, as before: KEEP
    DeviceKind(
        "cpu", CPU, "CPU", False, None, "cpu", lambda request, choices: {}, SHRINK,
        menu_label="CPU", menu_text="Run on the CPU", enum_number=1, host=True, io_binding=True,
    ),
]  # fmt: skip
AUTO_ENUM_NUMBER = 0
# Providers onnxruntime-gpu lists beside CUDA that run only where the NVIDIA driver sees a GPU,
# and labels for providers that are no row of their own
NVIDIA_ALSO = ("TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider")
OTHER_LABELS = {"TensorrtExecutionProvider": "TensorRT"}
# The indexes below are filled from DEVICES (and refilled by add_device): modules that imported
# them see a new row
DEVICE_BY_KIND: dict[str, DeviceKind] = {}
DEVICE_BY_PROVIDER: dict[str, DeviceKind] = {}
NVIDIA_PROVIDERS: set[str] = set()
_KIND_OF_NAME: dict[str, str] = {}
_INDEXED: list[str] = []
_NAMES = ""
_DEVICE_RE = re.compile("")


def _index_devices() -> None:
    global _NAMES, _DEVICE_RE
    for index, rows in ((DEVICE_BY_KIND, {d.kind: d for d in DEVICES}), (DEVICE_BY_PROVIDER, {d.provider: d for d in DEVICES})):
        index.clear()
        index.update(rows)
    NVIDIA_PROVIDERS.clear()
    NVIDIA_PROVIDERS.update({d.provider for d in DEVICES if d.nvidia} | set(NVIDIA_ALSO))
    _KIND_OF_NAME.clear()
    _KIND_OF_NAME.update({name: d.kind for d in DEVICES for name in (d.kind, *d.aliases)})
    _INDEXED[:] = [d.kind for d in DEVICES if d.takes_index]
    _NAMES = ", ".join(  # as messages list them: 'cpu', 'cuda', 'cuda:N', ...
        f"'{d.kind}'" + (f", '{d.kind}:N'" if d.takes_index else "") for d in by_auto_rank(DEVICES)
    )
    _DEVICE_RE = re.compile(r"^(auto|" + "|".join(map(re.escape, _KIND_OF_NAME)) + r")(?::(\d+))?$")


def by_auto_rank(rows) -> list[DeviceKind]:
    """Rows in the order "auto" tries them, the fallback (no rank) last."""
    return sorted(rows, key=lambda d: float("inf") if d.auto_rank is None else d.auto_rank)


def add_device(row: DeviceKind) -> DeviceKind:
    """A new row in the table, seen at once by everything that reads it."""
    if row.kind in DEVICE_BY_KIND or row.provider in DEVICE_BY_PROVIDER:
        raise ValueError(f"device {row.kind!r} ({row.provider}) is already in the table")
    DEVICES.append(row)
    _index_devices()
    return row


def remove_device(kind: str) -> None:
    DEVICES[:] = [d for d in DEVICES if d.kind != kind]
    _index_devices()


def device_help() -> str:
    """For command-line help: auto, cpu, cuda, cuda:N, ..."""
    return "auto, " + _NAMES.replace("'", "")


_index_devices()


def row_of(actual_providers: list[str]) -> DeviceKind | None:
    """The row of a session's primary provider (the first one it really got); None for one the
    table does not know (TensorRT)."""
    return DEVICE_BY_PROVIDER.get(actual_providers[0]) if actual_providers else None


def measured_gpu(request: DeviceRequest) -> int | None:
    """The GPU whose memory a request's budget and figures read; None: RAM ("auto" is checked
    against RAM: which device it lands on is known once the session exists)."""
    row = DEVICE_BY_KIND.get(request.kind)
    return request.index if row is not None and row.vram_measurable else None


def may_use_measured_gpu(request: DeviceRequest) -> bool:
    """Whether a session for this request can land on a device whose memory is measured."""
    if request.kind == "auto":
        return any(d.vram_measurable for d in DEVICES if d.auto_rank is not None)
    return measured_gpu(request) is not None


def fallback_device(warning: str) -> DeviceKind | None:
    """The row a fallback warning (DeviceKind.fallback_warning) was written for."""
    return next((d for d in DEVICES if warning.startswith(f"{d.label} was requested for ")), None)


def auto_device(available: list[str]) -> DeviceKind:
    """The row "auto" picks among the providers offered: the first ranked one, else the host."""
    ranked = [d for d in by_auto_rank(DEVICES) if d.auto_rank is not None]
    host = next(d for d in DEVICES if d.host)
    return next((d for d in ranked if d.provider in available), host)


@dataclass(frozen=True)
class DeviceRequest:
    kind: str  # "auto" | "cpu" | "cuda" | "directml" | "coreml"
    index: int = 0

    def __str__(self):
        return f"{self.kind}:{self.index}" if self.kind in _INDEXED else self.kind


def parse_device(device: str | DeviceRequest | None) -> DeviceRequest:
    if isinstance(device, DeviceRequest):
        return device
    if device is not None and not str(device).strip():
        raise DeviceSpecError(
            f"The device is empty. Use one of: 'auto', {_NAMES} (or leave the option out for 'auto')."
        )
    text = (device or "auto").strip().lower()
    match = _DEVICE_RE.match(text)
    if not match:
        raise DeviceSpecError(f"Unknown device {device!r}. Use one of: 'auto', {_NAMES}.")
    kind, index = match.group(1), match.group(2)
    kind = _KIND_OF_NAME.get(kind, kind)
    if index is not None and kind not in _INDEXED:
        raise DeviceSpecError(
            f"Device {device!r}: only {' and '.join(repr(k) for k in _INDEXED)} take an index (e.g. '{_INDEXED[0]}:1')."
        )
    return DeviceRequest(kind, int(index or 0))


def resolve_providers(
    request: DeviceRequest, available: list[str], choices: ProviderChoices | None = None
) -> list[tuple[str, dict]]:
    """The provider list (with options) to create a session with."""
    choices = choices or ProviderChoices()
    if request.kind == "auto":
        device = auto_device(available)
        if device.host:
            return [(CPU, {})]
        return resolve_providers(DeviceRequest(device.kind, 0), available, choices)
    device = DEVICE_BY_KIND[request.kind]
    if device.host:
        return [(CPU, {})]
    if device.provider not in available:
        raise ProviderUnavailableError(
            f"Device '{request}' needs {device.provider}, which the installed onnxruntime does not offer "
            f"(it offers {', '.join(available)}). Choose another device in the add-on preferences, "
            f"or install {device.runtime_source}."
        )
    return [(device.provider, device.options(request, choices)), (CPU, {})]


def release_rule(actual_providers: list[str], *, cpu_arena: bool, keep_loaded: bool = False) -> str:
    """The rule that gives a session's memory back (SHRINK, UNLOAD or KEEP), from what the
    session really got: its primary provider's row; a CPU session shrinks only the shared arena;
    ``keep_loaded`` (the artist's choice) turns UNLOAD into KEEP."""
    device = row_of(actual_providers)
    if device is None or (device.host and not cpu_arena):
        return KEEP
    if device.release == UNLOAD and keep_loaded:
        return KEEP
    return device.release


def shrink_spec(actual_providers: list[str], provider_options: dict, *, cpu_arena_shrinkable: bool) -> str:
    """The `memory.enable_memory_arena_shrinkage` value for a session's final run, or "".

    Decided by the session's *primary* provider (the first one it really got): a DirectML or
    CoreML session also lists CPU as a fallback, but must run exactly as before. A CUDA session
    names only its own GPU arena; only CPU sessions use the runtime's shared CPU arena.
    """
    if release_rule(actual_providers, cpu_arena=cpu_arena_shrinkable) != SHRINK:
        return ""
    device = DEVICE_BY_PROVIDER[actual_providers[0]]
    index = int((provider_options.get(device.provider) or {}).get("device_id", 0)) if device.takes_index else 0
    return f"{device.arena_device}:{index}"


def describe_providers(actual_providers: list[str]) -> str:
    names = {d.provider: d.label for d in DEVICES} | OTHER_LABELS
    return names.get(actual_providers[0], actual_providers[0]) if actual_providers else "none"


# ---- CoreML's partition report ------------------------------------------------------------
_COREML_PARTITIONS = re.compile(
    r"number of partitions supported by CoreML: (\d+) number of nodes in the graph: (\d+) "
    r"number of nodes supported by CoreML: (\d+)"
)


def coreml_partitions(log_lines) -> dict | None:
    """ORT's own summary (CoreMLExecutionProvider::GetCapability, logged at session creation:
    WARNING when the graph splits into several partitions, INFO otherwise) as
    ``{"partitions", "nodes", "coreml_nodes"}``; None when the log has none."""
    for line in reversed(list(log_lines)):
        match = _COREML_PARTITIONS.search(line)
        if match:
            partitions, nodes, supported = map(int, match.groups())
            return {"partitions": partitions, "nodes": nodes, "coreml_nodes": supported}
    return None


def coreml_partition_warning(model_name: str, facts: dict | None, *, most_on_cpu: float = 0.5, many: int = 8) -> str | None:
    """One line when CoreML takes under half the graph or cuts it into many pieces (each cut
    is a CPU round trip); None when it runs well or nothing was logged."""
    if not facts or not facts["nodes"]:
        return None
    share = facts["coreml_nodes"] / facts["nodes"]
    if share >= most_on_cpu and facts["partitions"] <= many:
        return None
    return (
        f"CoreML runs {facts['coreml_nodes']} of {facts['nodes']} operators of {model_name} "
        f"({share:.0%}) in {facts['partitions']} piece(s); the rest runs on the CPU, so this model "
        "may be slower than on the CPU device. Try the CPU device, or another Compute Units choice."
    )
