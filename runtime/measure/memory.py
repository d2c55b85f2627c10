"""Memory snapshots: process RSS, and on NVIDIA GPUs the device and this process's usage.

Everything here must work in a stock Blender, whose Python has neither psutil nor nvidia-ml-py:
RSS and available RAM come from the OS directly (/proc on Linux, ctypes on Windows and macOS);
psutil is only a last resort on other systems, and NVML stats are optional. Reading stats must
never break inference, so every failure becomes None or a field in the snapshot, not an exception.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

from .heap import trim_process_heap  # noqa: F401 - the runtime's callers find it with the other measures

_nvml_lock = threading.Lock()
_nvml_state = {"initialised": False, "error": None}


# --- Windows: GetProcessMemoryInfo / GlobalMemoryStatusEx ------------------------------------------


# DWORD is 32-bit on Windows; c_uint32 rather than c_ulong keeps the layout testable on LP64 systems.
class _ProcessMemoryCounters(ctypes.Structure):
    _fields_ = [
        ("cb", ctypes.c_uint32),
        ("PageFaultCount", ctypes.c_uint32),
        ("PeakWorkingSetSize", ctypes.c_size_t),
        ("WorkingSetSize", ctypes.c_size_t),
        ("QuotaPeakPagedPoolUsage", ctypes.c_size_t),
        ("QuotaPagedPoolUsage", ctypes.c_size_t),
        ("QuotaPeakNonPagedPoolUsage", ctypes.c_size_t),
        ("QuotaNonPagedPoolUsage", ctypes.c_size_t),
        ("PagefileUsage", ctypes.c_size_t),
        ("PeakPagefileUsage", ctypes.c_size_t),
    ]


class _MemoryStatusEx(ctypes.Structure):
    _fields_ = [
        ("dwLength", ctypes.c_uint32),
        ("dwMemoryLoad", ctypes.c_uint32),
        ("ullTotalPhys", ctypes.c_ulonglong),
        ("ullAvailPhys", ctypes.c_ulonglong),
        ("ullTotalPageFile", ctypes.c_ulonglong),
        ("ullAvailPageFile", ctypes.c_ulonglong),
        ("ullTotalVirtual", ctypes.c_ulonglong),
        ("ullAvailVirtual", ctypes.c_ulonglong),
        ("ullAvailExtendedVirtual", ctypes.c_ulonglong),
    ]


def _windows_counters() -> _ProcessMemoryCounters | None:
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.GetCurrentProcess.restype = wintypes.HANDLE
    # K32GetProcessMemoryInfo is kernel32's copy of psapi's (Windows 7+): no psapi.dll needed.
    get_info = kernel32.K32GetProcessMemoryInfo
    get_info.argtypes = [wintypes.HANDLE, ctypes.POINTER(_ProcessMemoryCounters), wintypes.DWORD]
    get_info.restype = wintypes.BOOL
    counters = _ProcessMemoryCounters()
    counters.cb = ctypes.sizeof(counters)
    if not get_info(kernel32.GetCurrentProcess(), ctypes.byref(counters), counters.cb):
        return None
    return counters


def _windows_available_bytes() -> int | None:
    status = _MemoryStatusEx()
    status.dwLength = ctypes.sizeof(status)
    if not ctypes.WinDLL("kernel32").GlobalMemoryStatusEx(ctypes.byref(status)):
        return None
    return int(status.ullAvailPhys)


# --- macOS: task_info(MACH_TASK_BASIC_INFO) --------------------------------------------------------


class _MachTaskBasicInfo(ctypes.Structure):
    _pack_ = 4  # <mach/task_info.h> declares these under #pragma pack(4)
    _fields_ = [
        ("virtual_size", ctypes.c_uint64),
        ("resident_size", ctypes.c_uint64),
        ("resident_size_max", ctypes.c_uint64),
        ("user_time", ctypes.c_int32 * 2),
        ("system_time", ctypes.c_int32 * 2),
        ("policy", ctypes.c_int32),
        ("suspend_count", ctypes.c_int32),
    ]


_MACH_TASK_BASIC_INFO = 20


def _mach_task_info() -> _MachTaskBasicInfo | None:
    libc = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
    libc.mach_task_self.restype = ctypes.c_uint32
    libc.task_info.argtypes = [ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    info = _MachTaskBasicInfo()
    count = ctypes.c_uint32(ctypes.sizeof(info) // 4)  # in natural_t (32-bit) units
    if libc.task_info(libc.mach_task_self(), _MACH_TASK_BASIC_INFO, ctypes.byref(info), ctypes.byref(count)) != 0:
        return None
    return info


def _ru_maxrss_bytes() -> int | None:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


# --- Linux: /proc ----------------------------------------------------------------------------------


def _statm_rss_bytes() -> int | None:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _psutil_rss_bytes() -> int | None:
    import psutil

    return int(psutil.Process().memory_info().rss)


def process_rss_bytes() -> int | None:
    """Resident set size of this process now, in bytes; None when the OS won't say."""
    if sys.platform.startswith("linux"):
        readers = (_statm_rss_bytes, lambda: _kib(_status_kib("VmRSS")))
    elif sys.platform == "win32":
        readers = (lambda: _windows_counters().WorkingSetSize,)
    elif sys.platform == "darwin":
        readers = (lambda: _mach_task_info().resident_size,)
    else:
        readers = ()
    for reader in (*readers, _psutil_rss_bytes):
        try:
            value = reader()
        except Exception:  # no /proc, no symbol, no psutil: try the next one
            continue
        if value:
            return int(value)
    return None


def _kib(value: int | None) -> int | None:
    return None if value is None else value * 1024


def os_available_memory_bytes() -> int | None:
    """RAM the OS could give any process without swapping (MemAvailable), in bytes; None when unknown."""
    try:
        if sys.platform == "win32":
            return _windows_available_bytes()
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except Exception:
        pass
    try:  # macOS and the rest: only when psutil happens to be there; callers fall back on None
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:
        return None


def address_space_headroom_bytes() -> int | None:
    """What ``RLIMIT_AS`` (``ulimit -v``, ``prlimit --as``) still lets this process map: the limit
    less the address space in use (VmSize); None without a limit."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    if limit == resource.RLIM_INFINITY or limit < 0:
        return None
    in_use = _status_kib("VmSize")
    return None if in_use is None else max(0, limit - in_use * 1024)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return int(text)
    except (OSError, ValueError):  # "max" (no limit), or no such file
        return None


def cgroup_headroom_bytes(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """What this process's memory cgroup (a container's or a SLURM job's) still allows: the
    tightest ``memory.max - memory.current`` of its cgroup and those above it (v2), or
    ``memory.limit_in_bytes - memory.usage_in_bytes`` (v1); None without a limit."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    headrooms = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: the unified hierarchy
            base, names = root, ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base, names = f"{root}/memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            folder = "/".join([base, *parts[:depth]])
            limit, used = _read_int(f"{folder}/{names[0]}"), _read_int(f"{folder}/{names[1]}")
            if limit is not None and used is not None and limit < 1 << 60:  # v1 writes ~2**63 for none
                headrooms.append(max(0, limit - used))
    return min(headrooms, default=None)


def available_system_memory_bytes() -> int | None:
    """What this process could still allocate, in bytes: the tightest of the OS's available RAM,
    its address-space limit (RLIMIT_AS) and its cgroup's memory limit; None when none is known.
    Every "would it fit" check uses this, so a container or `ulimit -v` is refused up front
    instead of failing half-way with a MemoryError."""
    figures = [os_available_memory_bytes(), address_space_headroom_bytes(), cgroup_headroom_bytes()]
    return min((f for f in figures if f is not None), default=None)


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
    """How many NVIDIA GPUs the driver sees; None when that can't be known.

    nvidia-ml-py when installed; otherwise the driver's own NVML library through ctypes, which
    is what a stock Blender (no nvidia-ml-py) has. Without this, 'auto' would try CUDA on every
    machine and log ORT's provider-load failure on each first session.
    """
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return _driver_nvml_gpu_count()
    nvml = _nvml()
    if nvml is None:
        return 0  # the package is there but the driver is not: no usable GPU
    try:
        return int(nvml.nvmlDeviceGetCount())
    except Exception:
        return 0


def _driver_nvml_library():
    """The NVIDIA driver's NVML library, loaded; None when absent (then so is the CUDA driver)."""
    if sys.platform == "win32":
        system_root = os.environ.get("SystemRoot", r"C:\Windows")
        candidates = [
            os.path.join(system_root, "System32", "nvml.dll"),  # where current drivers put it
            os.path.join(os.environ.get("ProgramFiles", r"C:\Program Files"), "NVIDIA Corporation", "NVSMI", "nvml.dll"),
        ]
    elif sys.platform.startswith("linux"):
        candidates = ["libnvidia-ml.so.1"]  # installed with every Linux driver (and WSL's)
    else:
        return None
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _driver_nvml_gpu_count() -> int | None:
    try:
        lib = _driver_nvml_library()
    except Exception:
        return None
    if lib is None:
        # Linux and macOS: no driver library, no CUDA. Windows: old drivers kept NVML elsewhere,
        # so "not found" is only "unknown" there and ORT may still try.
        return None if sys.platform == "win32" else 0
    try:
        if lib.nvmlInit_v2() != 0:
            return 0
        try:
            count = ctypes.c_uint(0)
            if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
                return 0
            return int(count.value)
        finally:
            lib.nvmlShutdown()
    except Exception:
        return None


def gpu_snapshot(device_id: int = 0) -> dict:
    """NVML's figures for CUDA device ``device_id`` (mapped to NVML's own numbering: gpu_index)."""
    nvml = _nvml()
    if nvml is None:
        return {"available": False, "error": _nvml_state["error"]}
    try:
        from ..cuda.gpu_index import nvml_index

        index, mapping = nvml_index(nvml, device_id)
        if index is None:
            return {"available": False, "device_id": device_id, "error": f"no NVML device for CUDA {device_id}: {mapping}"}
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
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
            "nvml_index": index,
            "mapping": mapping,
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


def figures(snap: dict | None) -> dict:
    """The two figures a snapshot holds: ``ram`` (RSS, what the OS sees) and ``vram`` (what the
    driver sees for this process; the whole device's use when NVML can't say per process)."""
    snap = snap or {}
    gpu = snap.get("gpu") or {}
    vram = None
    if gpu.get("available"):
        vram = gpu.get("process_used_bytes")
        if vram is None:
            vram = gpu.get("used_bytes")
    return {"ram": snap.get("rss_bytes"), "vram": vram}


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
        if sys.platform == "win32":
            return int(_windows_counters().PeakWorkingSetSize)
        if sys.platform == "darwin":
            return int(_mach_task_info().resident_size_max)
    except Exception:
        pass
    try:
        return _ru_maxrss_bytes()
    except Exception:
        return None
