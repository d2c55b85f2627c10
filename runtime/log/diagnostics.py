"""What the user's machine offers the runtime, for bug reports and for disabling buttons (bpy-free).

    report = collect()               # plain dataclass; dataclasses.asdict(report) for JSON
    print(format_report(report))     # readable text, one fact per line
    onnxruntime_import_error()       # None, or one line saying why onnxruntime can't be imported

`collect()` creates one tiny CUDA session through the runtime (a fresh `Runtime`, so the shared
cache is untouched) to learn what a CUDA request really gets: onnxruntime-gpu lists CUDA and
imports fine without a GPU or without CUDA/cuDNN, and only session creation tells. ORT reports
why CUDA failed on the process's stderr, not as an exception, so the probe captures file
descriptor 2 for the duration of that one session creation (and echoes it back afterwards).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import sys
import tempfile
from dataclasses import dataclass, field

from ..cuda import gpu_libraries, gpu_loading
from ..measure import memory
from ..paths import ADDON_ROOT
from ..plugin_eps import registry as plugin_registry
from . import native_log
from .report_text import format_report  # noqa: F401  (the doctor's text, its own module)

_REASON_PATTERNS = (
    re.compile(r"Failed to load library .*? with error: (.+)"),
    re.compile(r"(Failed to create CUDAExecutionProvider\..*?)(?: Please install|$)"),
    re.compile(r"(CUDA failure \d+:.+)"),
    re.compile(r"(no CUDA-capable device is detected.*)"),
)


@dataclass
class CudaLibrary:
    name: str  # file name ORT loads, e.g. libcudnn.so.9
    path: str | None  # where it was found; None when not found
    where: str  # "nvidia wheel", "system search path", "not found"
    required: bool = True  # cuFFT and NVRTC serve only some operators


@dataclass
class CudaProbe:
    attempted: bool
    providers: list[str] = field(default_factory=list)  # what the session really got
    ok: bool = False  # CUDA first in providers and a run succeeded
    fallback_reason: str | None = None  # ORT's own words when it fell back (or why no probe ran)
    ort_messages: list[str] = field(default_factory=list)  # ORT's warnings/errors during creation


@dataclass
class Report:
    python: str
    platform: str
    onnxruntime_version: str | None = None
    onnxruntime_package: str | None = None  # onnxruntime / onnxruntime-gpu
    onnxruntime_location: str | None = None
    onnxruntime_error: str | None = None
    build_cuda_version: str | None = None  # CUDA the onnxruntime build was made for
    available_providers: list[str] = field(default_factory=list)
    nvml: dict = field(default_factory=dict)  # available, driver_version, cuda_driver_version, gpus, error
    cuda_libraries: list[CudaLibrary] = field(default_factory=list)
    cuda_libraries_note: str | None = None
    cuda_probe: CudaProbe | None = None
    gpu_runtime: dict = field(default_factory=dict)  # the add-on's own CUDA/cuDNN folder, when activated
    bundled_wheels: list[str] = field(default_factory=list)  # the onnxruntime wheel(s) this zip ships
    session: dict = field(default_factory=dict)  # what an "auto" job's session really gets, and its release rule
    cuda_offered: bool = False  # this onnxruntime build lists the CUDA provider
    plugin_eps: list[dict] = field(default_factory=list)  # installed plugin packages: devices found, or why not
    worker_python: dict = field(default_factory=dict)  # the worker's interpreter, when another (ui/cli/cli_doctor.py)


# --- onnxruntime --------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


def onnxruntime_import_error() -> str | None:
    """None when onnxruntime imports; else one readable line (for a disabled button's tooltip)."""
    try:
        import onnxruntime  # noqa: F401
    except Exception as exc:  # ImportError, or OSError from a DLL it links against
        return (
            f"onnxruntime cannot be imported ({_one_line(exc)}) by Python {platform.python_version()};"
            " install the Lean Image AI zip built for this platform and Blender version"
        )
    return None


def _onnxruntime_facts(report: Report):
    report.onnxruntime_error = onnxruntime_import_error()
    if report.onnxruntime_error:
        return None
    import onnxruntime as ort

    report.onnxruntime_version = getattr(ort, "__version__", None)
    report.onnxruntime_package = getattr(ort, "package_name", None)
    report.onnxruntime_location = os.path.dirname(os.path.abspath(ort.__file__))
    report.build_cuda_version = getattr(ort, "cuda_version", None) or None
    try:
        report.available_providers = list(ort.get_available_providers())
    except Exception as exc:
        report.onnxruntime_error = f"onnxruntime imported but lists no providers ({_one_line(exc)})"
    return ort


# --- NVIDIA driver and GPUs ---------------------------------------------------------------------


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_facts() -> dict:
    try:
        import pynvml
    except ImportError:
        driver = memory._driver_nvml_library() is not None
        return {
            "available": False,
            "error": "NVML not available (nvidia-ml-py is not installed)",
            "driver_library_found": driver,
        }
    nvml = memory._nvml()
    if nvml is None:
        return {"available": False, "error": f"NVML not available ({memory._nvml_state['error']})"}
    facts: dict = {"available": True, "gpus": []}
    try:
        facts["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
        facts["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"  # highest CUDA the driver runs
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            facts["gpus"].append(
                {
                    "index": index,  # NVML's order, which need not be CUDA's (CUDA_VISIBLE_DEVICES)
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                    "total_bytes": int(info.total),
                    "free_bytes": int(info.free),
                }
            )
    except Exception as exc:
        facts["error"] = _one_line(exc)
    return facts


# --- CUDA / cuDNN libraries ---------------------------------------------------------------------


def _cuda_library_facts(report: Report, ort, directory: str | None) -> None:
    """Where ORT's preload_dlls() would find each CUDA/cuDNN library (without loading from wheels)."""
    system = platform.system()
    report.cuda_libraries_note = _no_libraries_because(report, ort, system)
    if report.cuda_libraries_note is not None:
        return
    wanted = ort._get_nvidia_dll_paths(system == "Windows", True, True)
    # preload_dlls() stays quiet about cuDNN too, but the CUDA provider refuses to load without it.
    optional = {p[-1] for p in wanted if "cufft" in p[-1] or "nvrtc" in p[-1]}
    # The same search preload_dlls() makes: a given folder (flat), else the site-packages that
    # holds onnxruntime (nvidia/<package>/lib|bin/...), then the system loader. The add-on's own
    # folder (gpu_loading.activate(), laid out like site-packages) is loaded before all of them.
    site = os.path.normpath(os.path.join(report.onnxruntime_location, ".."))
    activation = gpu_loading.active()
    addon = activation.folder if activation is not None and activation.error is None and not directory else None
    for relative in wanted:
        name = relative[-1]
        candidates = [(os.path.join(directory, name), "given folder")] if directory else []
        if addon:
            candidates.append((os.path.join(addon, *relative), "add-on GPU runtime"))
        if not directory:
            candidates.append((os.path.join(site, *relative), "nvidia wheel"))
        report.cuda_libraries.append(_find_library(name, candidates, name not in optional))


def _no_libraries_because(report: Report, ort, system: str) -> str | None:
    """Why no library list can be made here, or None when it can."""
    if ort is None:
        return "onnxruntime is not importable"
    if not report.build_cuda_version:
        return f"{report.onnxruntime_package or 'onnxruntime'} is not a CUDA build"
    if system not in ("Linux", "Windows"):
        return f"CUDA is not supported on {system}"
    if getattr(ort, "_get_nvidia_dll_paths", None) is None:  # private; present in 1.2x-1.3x
        return f"onnxruntime {report.onnxruntime_version} does not say which libraries it loads"
    return None


def _find_library(name: str, candidates: list[tuple[str, str]], required: bool) -> CudaLibrary:
    hit = next(((path, where) for path, where in candidates if os.path.isfile(path)), None)
    if hit is not None:
        return CudaLibrary(name, hit[0], hit[1], required)
    try:
        ctypes.CDLL(name)  # what preload_dlls() tries next; a hit is loaded, as it would be
        return CudaLibrary(name, None, "system search path", required)
    except OSError:
        return CudaLibrary(name, None, "not found", required)


# --- what a CUDA session really gets --------------------------------------------------------------


def _clean(line: str) -> str:
    return native_log.clean(line)


def _fallback_reason(messages: list[str]) -> str | None:
    for pattern in _REASON_PATTERNS:
        for message in messages:
            match = pattern.search(message)
            if match:
                return match.group(1).strip()
    return None


@contextlib.contextmanager
def _probe_model():
    """A model file for a probe session: x -> x, no nodes: nothing to compute, nothing to allocate."""
    from ..release import cpu_arena

    with tempfile.TemporaryDirectory(prefix="lean_image_ai_probe_") as tmp:
        model = os.path.join(tmp, "probe.onnx")
        with open(model, "wb") as f:
            f.write(cpu_arena.RELEASE_PROBE_MODEL)
        yield model


def probe_cuda(device: str = "cuda", runtime=None) -> CudaProbe:
    """Create one tiny session for `device` and report what it really got (never raises)."""
    import numpy as np

    from .. import core
    from ..errors import LeanImageError
    from ..providers import CUDA

    runtime = runtime or core.Runtime()
    probe = CudaProbe(attempted=True)
    with _probe_model() as model:
        handle = None
        try:
            with native_log.captured(python_stdout=True) as captured:
                handle = runtime.session(model, device)
                probe.providers = list(handle.providers)
                handle.session.run(None, {"x": np.zeros(1, np.float32)})
        except LeanImageError as exc:
            probe.fallback_reason = str(exc)
        except Exception as exc:
            probe.fallback_reason = _one_line(exc)
        finally:
            if handle is not None:
                runtime.evict(handle, "diagnostics")
        # Lines starting "{" are this runtime's own events (logged to stderr too), not ORT's.
        ort_said = handle.onnxruntime_log if handle is not None else []
        probe.ort_messages = [c for c in map(_clean, [*ort_said, *captured]) if c and not c.startswith("{")]
    probe.ok = probe.providers[:1] == [CUDA] and probe.fallback_reason is None
    if not probe.ok and probe.fallback_reason is None:
        probe.fallback_reason = _fallback_reason(probe.ort_messages) or (
            handle.fallback_warning if handle is not None else None
        )
    return probe


# --- the report ---------------------------------------------------------------------------------


def bundled_wheels(root: str | None = None) -> list[str]:
    """The wheel files the installed zip's manifest lists (tools/build_extension.py writes them;
    their names carry the onnxruntime build and version); empty in a source checkout."""
    manifest = os.path.join(root or ADDON_ROOT, "blender_manifest.toml")
    try:
        with open(manifest, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return []
    block = re.search(r"^wheels\s*=\s*\[(.*?)\]", text, re.M | re.S)
    return [os.path.basename(w) for w in re.findall(r'"([^"]+\.whl)"', block.group(1))] if block else []


def probe_session(device: str = "auto", runtime=None) -> dict:
    """What a job on ``device`` really gets (one tiny session through the runtime) and the
    release rule that applies to it; never raises (``error`` then says why)."""
    import numpy as np

    from .. import core
    from ..providers import RELEASE_RULES, describe_providers, release_rule

    runtime = runtime or core.Runtime(core.get_runtime().settings)
    facts: dict = {"requested": device}
    with _probe_model() as model:
        handle = None
        try:
            handle = runtime.session(model, device)
            handle.session.run(None, {"x": np.zeros(1, np.float32)})
        except Exception as exc:
            facts["error"] = _one_line(exc)
        finally:
            if handle is not None:
                keep = runtime.settings.keep_models_loaded_on_dml_coreml
                rule = release_rule(handle.providers, cpu_arena=handle.cpu_arena, keep_loaded=keep)
                facts.update(
                    providers=list(handle.providers),
                    device=describe_providers(handle.providers),
                    release_rule=rule,
                    release_text=RELEASE_RULES[rule],
                )
                runtime.evict(handle, "diagnostics")
    return facts


def collect(*, cuda_probe: bool = True, directory: str | None = None, runtime=None) -> Report:
    """Everything above; `directory` is a folder of CUDA/cuDNN libraries to look in instead of
    the nvidia wheels (as preload_dlls' argument of that name)."""
    report = Report(
        python=f"{platform.python_version()} ({sys.executable})",
        platform=f"{platform.system()} {platform.release()} {platform.machine()}",
    )
    ort = _onnxruntime_facts(report)
    report.nvml = _nvml_facts()
    activation = gpu_loading.active()
    if activation is not None:
        report.gpu_runtime = {
            "folder": activation.folder,
            "version": gpu_libraries.installed_version(activation.folder),
            "loaded": list(activation.loaded),
            "missing": list(activation.missing),
            "failed": dict(activation.failed),
            "error": activation.error,
        }
    _cuda_library_facts(report, ort, directory)
    report.cuda_offered = "CUDAExecutionProvider" in report.available_providers
    if ort is None:
        report.cuda_probe = CudaProbe(attempted=False, fallback_reason="onnxruntime is not importable")
    elif "CUDAExecutionProvider" not in report.available_providers:
        report.cuda_probe = CudaProbe(
            attempted=False, fallback_reason="this onnxruntime build does not offer CUDAExecutionProvider"
        )
    elif cuda_probe:
        report.cuda_probe = probe_cuda("cuda", runtime)
    report.bundled_wheels = bundled_wheels()
    if ort is not None:
        report.plugin_eps = _plugin_facts(ort)
        report.session = probe_session("auto", runtime)
    return report


def _plugin_facts(ort) -> list[dict]:
    try:
        found = plugin_registry.statuses(ort)
    except Exception as exc:  # an onnxruntime without plugin support: said as the one fact
        return [{"package": "plugin execution providers", "problem": _one_line(exc), "devices": 0}]
    return [{"package": s.plugin.package, "label": s.plugin.label, "provider": s.provider, "library": s.library,
             "devices": s.devices, "problem": s.problem} for s in found]  # fmt: skip
