"""Memory snapshots: process RSS, and on NVIDIA GPUs the device and this process's usage.

psutil and nvidia-ml-py are optional; reading stats must never break inference, so every
failure becomes a field in the snapshot instead of an exception.
"""

from __future__ import annotations

import os
import threading

_nvml_lock = threading.Lock()
_nvml_state = {"initialised": False, "error": None}


def process_rss_bytes() -> int | None:
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:
        pass
    try:  # Linux without psutil
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        return None


def available_system_memory_bytes() -> int | None:
    try:
        import psutil

        return psutil.virtual_memory().available
    except Exception:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except Exception:
        return None
    return None


def _nvml():
    """Import and initialise NVML once; returns the module or None (with the reason kept)."""
    with _nvml_lock:
        if _nvml_state["initialised"]:
            import pynvml

            return pynvml
        if _nvml_state["error"] is not None:
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            _nvml_state["initialised"] = True
            return pynvml
        except Exception as exc:  # no driver, no GPU, no package
            _nvml_state["error"] = f"{type(exc).__name__}: {exc}"
            return None


def nvidia_gpu_count() -> int | None:
    """How many NVIDIA GPUs the driver sees; None when that can't be known (no nvidia-ml-py)."""
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return None
    nvml = _nvml()
    if nvml is None:
        return 0  # the package is there but the driver is not: no usable GPU
    try:
        return int(nvml.nvmlDeviceGetCount())
    except Exception:
        return 0


def gpu_snapshot(device_id: int = 0) -> dict:
    nvml = _nvml()
    if nvml is None:
        return {"available": False, "error": _nvml_state["error"]}
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(device_id)
        name = nvml.nvmlDeviceGetName(handle)
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        process_used = None
        pid = os.getpid()
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                for proc in getattr(nvml, getter)(handle):
                    if proc.pid == pid and proc.usedGpuMemory is not None:
                        process_used = (process_used or 0) + proc.usedGpuMemory
            except Exception:
                continue
        return {
            "available": True,
            "device_id": device_id,
            "name": name.decode() if isinstance(name, bytes) else name,
            "total_bytes": info.total,
            "used_bytes": info.used,
            "free_bytes": info.free,
            "process_used_bytes": process_used,
        }
    except Exception as exc:
        return {"available": False, "device_id": device_id, "error": f"{type(exc).__name__}: {exc}"}


def memory_snapshot(gpu_device_id: int | None = None) -> dict:
    """RSS always; GPU stats only when asked for a device (NVML calls cost about a millisecond)."""
    snap = {"rss_bytes": process_rss_bytes()}
    if gpu_device_id is not None:
        snap["gpu"] = gpu_snapshot(gpu_device_id)
    return snap


def format_snapshot(snap: dict) -> str:
    def mb(value):
        return "n/a" if value is None else f"{value / 2**20:.0f} MiB"

    text = f"process RSS {mb(snap.get('rss_bytes'))}"
    gpu = snap.get("gpu")
    if gpu:
        if gpu.get("available"):
            text += (
                f"; GPU {gpu['device_id']} {gpu['name']}: used {mb(gpu['used_bytes'])} of"
                f" {mb(gpu['total_bytes'])}, free {mb(gpu['free_bytes'])},"
                f" this process {mb(gpu['process_used_bytes'])}"
            )
        else:
            text += f"; GPU stats unavailable ({gpu.get('error')})"
    return text


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Start a new peak-RSS window (Linux: clear_refs 5). False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    """Peak RSS of this process since start or the last reset_peak_rss().

    VmHWM, not getrusage's ru_maxrss: on Linux a child process inherits its parent's
    ru_maxrss, so a benchmark subprocess of a big parent would report the parent's peak.
    """
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception:
        return None
