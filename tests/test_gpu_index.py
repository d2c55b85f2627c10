"""CUDA device index -> NVML device (runtime/cuda/gpu_index.py), and the snapshot and budget that read
it. NVML and a CUDA runtime cannot exist here: a recorded NVML stand-in answers with what
nvidia-ml-py returns (bytes bus ids like "00000000:41:00.0", "GPU-..." UUIDs, memory structs),
records every call the runtime makes, and the CUDA runtime's cudaDeviceGetPCIBusId answer
("0000:41:00.0", CUDA's own format) is given where a test needs one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from lean_image_ai.runtime.cuda import gpu_index
from lean_image_ai.runtime.cuda.gpu_index import NvmlDevice, map_cuda_index
from lean_image_ai.runtime.measure import budget, memory

MiB = 1 << 20
# Two GPUs of different kinds, in NVML's order (PCI bus order): CUDA's FASTEST_FIRST would put
# the faster one (the second on the bus) first.
GPUS = [
    {"bus": b"00000000:01:00.0", "uuid": b"GPU-1111aaaa-0000-0000-0000-000000000001", "name": b"Small", "free": 1000 * MiB},
    {"bus": b"00000000:41:00.0", "uuid": b"GPU-2222bbbb-0000-0000-0000-000000000002", "name": b"Big", "free": 20000 * MiB},
]


class RecordedNvml:
    def __init__(self, gpus=GPUS, pid=None):
        self.gpus = gpus
        self.calls: list[tuple] = []
        self.pid = pid

    def nvmlDeviceGetCount(self):
        self.calls.append(("count",))
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self.calls.append(("handle", index))
        return index

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId=self.gpus[handle]["bus"])

    def nvmlDeviceGetUUID(self, handle):
        return self.gpus[handle]["uuid"]

    def nvmlDeviceGetName(self, handle):
        return self.gpus[handle]["name"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        free = self.gpus[handle]["free"]
        return SimpleNamespace(total=free * 2, used=free, free=free)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=self.pid, usedGpuMemory=(handle + 1) * 100 * MiB)] if self.pid else []

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return []


DEVICES = [NvmlDevice(i, g["bus"].decode(), g["uuid"].decode()) for i, g in enumerate(GPUS)]


@pytest.mark.parametrize(
    ("cuda", "visible", "order", "bus", "expected", "how"),
    [
        (0, "1", "PCI_BUS_ID", None, 1, "CUDA_VISIBLE_DEVICES, PCI bus order"),
        (0, "1,0", "PCI_BUS_ID", None, 1, "CUDA_VISIBLE_DEVICES, PCI bus order"),
        (1, "1,0", "PCI_BUS_ID", None, 0, "CUDA_VISIBLE_DEVICES, PCI bus order"),
        (0, "GPU-2222bbbb", None, None, 1, "UUID in CUDA_VISIBLE_DEVICES"),
        (0, None, "PCI_BUS_ID", None, 0, "PCI bus order"),
        (0, None, None, None, 0, "assumed PCI bus order (CUDA_DEVICE_ORDER unset)"),
        (0, None, None, "0000:41:00.0", 1, "pci bus id from the CUDA runtime"),  # FASTEST_FIRST, told by CUDA
        (0, "0", None, "0000:41:00.0", 1, "pci bus id from the CUDA runtime"),
    ],
)
def test_cuda_index_maps_to_the_nvml_device(cuda, visible, order, bus, expected, how):
    assert map_cuda_index(cuda, DEVICES, visible=visible, order=order, bus_id=bus) == (expected, how)


@pytest.mark.parametrize(
    ("cuda", "visible", "reason"),
    [
        (1, "1", "not among the 1 in CUDA_VISIBLE_DEVICES"),
        (0, "5", "not among NVML's 2 GPUs"),
        (0, "GPU-9999", "names 0 NVML devices"),
        (0, "GPU-", "names 2 NVML devices"),
        (0, "", "not among the 0"),
        (0, "-1", "not among the 0"),
    ],
)
def test_unmappable_devices_are_none_with_the_reason(cuda, visible, reason):
    index, why = map_cuda_index(cuda, DEVICES, visible=visible, order="PCI_BUS_ID")
    assert index is None and reason in why


def test_snapshot_and_tiler_budget_read_the_mapped_device(monkeypatch):
    """cuda:0 under CUDA_VISIBLE_DEVICES=1 is NVML device 1: its memory, not device 0's."""
    import os

    nvml = RecordedNvml(pid=os.getpid())
    monkeypatch.setattr(memory, "_nvml", lambda: nvml)
    monkeypatch.setattr(gpu_index, "_loaded_cudart", lambda: None)  # no CUDA runtime in this process
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    snap = memory.gpu_snapshot(0)
    assert snap["available"] and snap["nvml_index"] == 1 and snap["name"] == "Big"
    assert snap["free_bytes"] == 20000 * MiB and snap["process_used_bytes"] == 200 * MiB
    assert ("handle", 1) in nvml.calls and nvml.calls.count(("handle", 0)) == 1  # 0 only listed, not read
    assert snap["mapping"] == "CUDA_VISIBLE_DEVICES, PCI bus order"
    # the budget check (and the tiler's auto size through it) sees the same device
    assert budget.free_bytes(0, None) == 20000 * MiB


def test_snapshot_says_when_the_order_is_assumed(monkeypatch):
    monkeypatch.setattr(memory, "_nvml", lambda: RecordedNvml())
    monkeypatch.setattr(gpu_index, "_loaded_cudart", lambda: None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    snap = memory.gpu_snapshot(1)
    assert snap["nvml_index"] == 1 and snap["mapping"].startswith("assumed")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    missing = memory.gpu_snapshot(0)
    assert not missing["available"] and "not among NVML's 2 GPUs" in missing["error"]


def test_no_cuda_runtime_here_is_not_loaded_for_a_bus_id():
    """gpu_index never loads libcudart itself (initialising CUDA costs memory): here, where no
    CUDA runtime is in the process, it answers None."""
    import sys

    if any("libcudart" in name for name in _mapped_libraries()):
        pytest.skip("a CUDA runtime is loaded in this process")
    assert gpu_index.cuda_pci_bus_id(0) is None
    assert not any("libcudart" in name for name in _mapped_libraries()), sys.platform


def _mapped_libraries() -> list[str]:
    try:
        with open("/proc/self/maps") as maps:
            return [line.split()[-1] for line in maps if "/" in line]
    except OSError:
        pytest.skip("no /proc here")
