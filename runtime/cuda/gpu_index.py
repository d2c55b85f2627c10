"""Which NVML device a CUDA device index names (bpy-free).

CUDA numbers the GPUs it lets this process see: ``CUDA_VISIBLE_DEVICES`` picks and orders them
(by index or by ``GPU-<uuid>``), and ``CUDA_DEVICE_ORDER`` decides the order of the indices
(FASTEST_FIRST unless it says PCI_BUS_ID). NVML always numbers every GPU by PCI bus id. So
``cuda:0`` is NVML device 0 only by luck; reading NVML device ``N`` for ``cuda:N`` reports
another GPU's memory (and the tiler's budget would be planned on it).

Resolution, best first:
1. the CUDA runtime already in this process (onnxruntime-gpu's libcudart, loaded by
   preload_dlls): ``cudaDeviceGetPCIBusId`` gives the exact PCI bus id. It is never loaded just for
   this, because initialising CUDA costs memory a CPU-only job should not pay;
2. ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` applied to NVML's list. Exact with
   ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, with UUID entries, or when one GPU is visible; otherwise
   CUDA's FASTEST_FIRST order is not knowable without CUDA, and PCI bus order is *assumed*
   (right for identical GPUs in practice): the snapshot says so (``mapping``).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from dataclasses import dataclass

_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)$")
_cache: dict[int, str | None] = {}
_cache_lock = threading.Lock()


@dataclass(frozen=True)
class NvmlDevice:
    index: int  # NVML's index
    pci_bus_id: str
    uuid: str


def normal_bus_id(text) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) from NVML's ``00000000:01:00.0`` or CUDA's ``0000:01:00.0``."""
    text = text.decode() if isinstance(text, bytes) else str(text)
    match = _BUS_ID.match(text.strip())
    if not match:
        return None
    domain, bus, device, function = (int(g, 16) if g else 0 for g in match.groups())
    return domain, bus, device, function


def visible_entries(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it (None: unset, all devices). CUDA stops at the first
    entry it cannot use."""
    if value is None:
        return None
    entries = []
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        if not (item.isdigit() or item.upper().startswith(("GPU-", "MIG-"))):
            break
        entries.append(item)
    return entries


def visible_cuda_count(nvidia_gpu_count) -> int | None:
    """GPUs CUDA will number 0..N-1: the driver's count, narrowed by CUDA_VISIBLE_DEVICES."""
    count = nvidia_gpu_count()
    listed = visible_entries(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if listed is None or count is None:
        return count
    return min(count, len(listed))


def map_cuda_index(
    index: int, devices: list[NvmlDevice], *, visible: str | None, order: str | None, bus_id: str | None = None
) -> tuple[int | None, str]:
    """(NVML index, how it was decided) for CUDA device ``index``; (None, why) when it cannot be."""
    if bus_id is not None:
        return _by_bus_id(bus_id, devices)
    by_bus = sorted(devices, key=lambda d: normal_bus_id(d.pci_bus_id) or (0, 0, 0, 0))
    exact = (order or "").strip().upper() == "PCI_BUS_ID" or len(by_bus) == 1
    entries = visible_entries(visible)
    if entries is None:
        if index >= len(by_bus):
            return None, f"CUDA device {index} is not among NVML's {len(by_bus)} GPUs"
        return by_bus[index].index, "PCI bus order" if exact else "assumed PCI bus order (CUDA_DEVICE_ORDER unset)"
    if index >= len(entries):
        return None, f"CUDA device {index} is not among the {len(entries)} in CUDA_VISIBLE_DEVICES"
    entry = entries[index]
    if entry.upper().startswith(("GPU-", "MIG-")):
        return _by_uuid(entry, devices)
    position = int(entry)
    if position >= len(by_bus):
        return None, f"CUDA_VISIBLE_DEVICES entry {position} is not among NVML's {len(by_bus)} GPUs"
    how = "CUDA_VISIBLE_DEVICES, PCI bus order" if exact else "CUDA_VISIBLE_DEVICES, assumed PCI bus order"
    return by_bus[position].index, how


def _by_bus_id(bus_id: str, devices: list[NvmlDevice]) -> tuple[int | None, str]:
    wanted = normal_bus_id(bus_id)
    for device in devices:
        if normal_bus_id(device.pci_bus_id) == wanted:
            return device.index, "pci bus id from the CUDA runtime"
    return None, f"no NVML device has the CUDA runtime's PCI bus id {bus_id}"


def _by_uuid(entry: str, devices: list[NvmlDevice]) -> tuple[int | None, str]:
    """A CUDA_VISIBLE_DEVICES entry naming a GPU by (a prefix of) its UUID; MIG ones are not mapped."""
    if entry.upper().startswith("MIG-"):
        return None, "MIG instances are not mapped"
    matches = [d for d in devices if d.uuid.upper().startswith(entry.upper())]
    if len(matches) == 1:
        return matches[0].index, "UUID in CUDA_VISIBLE_DEVICES"
    return None, f"{entry} names {len(matches)} NVML devices"


def _loaded_cudart():
    """libcudart if this process already loaded it (never loads it), else None."""
    names = {
        "linux": ("libcudart.so.13", "libcudart.so.12"),
        "win32": ("cudart64_13.dll", "cudart64_12.dll"),
    }.get("linux" if sys.platform.startswith("linux") else sys.platform, ())
    for name in names:
        try:
            if sys.platform == "win32":
                get_module = ctypes.windll.kernel32.GetModuleHandleW  # type: ignore[attr-defined]
                get_module.restype = ctypes.c_void_p
                if not get_module(name):
                    continue
                return ctypes.CDLL(name)
            return ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        except (OSError, AttributeError):
            continue
    return None


def cuda_pci_bus_id(index: int) -> str | None:
    """CUDA device ``index``'s PCI bus id from the CUDA runtime in this process; None without one."""
    with _cache_lock:
        if _cache.get(index) is not None:
            return _cache[index]
    lib = _loaded_cudart()
    if lib is None:
        return None
    buffer = ctypes.create_string_buffer(64)
    try:
        if lib.cudaDeviceGetPCIBusId(buffer, ctypes.c_int(64), ctypes.c_int(int(index))) != 0:
            return None
    except Exception:
        return None
    value = buffer.value.decode(errors="replace")
    with _cache_lock:
        _cache[index] = value
    return value


_devices: list = [None, None]  # (nvml module, its devices): GPUs do not come and go in a process


def nvml_devices(nvml) -> list[NvmlDevice]:
    """Every GPU NVML lists, read once per NVML module (a snapshot is taken every few ms)."""
    with _cache_lock:
        if _devices[0] is nvml:
            return list(_devices[1])
    devices = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        bus = nvml.nvmlDeviceGetPciInfo(handle).busId
        uuid = nvml.nvmlDeviceGetUUID(handle)
        devices.append(
            NvmlDevice(index, bus.decode() if isinstance(bus, bytes) else str(bus), uuid.decode() if isinstance(uuid, bytes) else str(uuid))
        )
    with _cache_lock:
        _devices[:] = [nvml, devices]
    return list(devices)


def nvml_index(nvml, cuda_index: int) -> tuple[int | None, str]:
    """The NVML index of CUDA device ``cuda_index`` in this process, and how it was decided."""
    return map_cuda_index(
        cuda_index,
        nvml_devices(nvml),
        visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
        order=os.environ.get("CUDA_DEVICE_ORDER"),
        bus_id=cuda_pci_bus_id(cuda_index),
    )
