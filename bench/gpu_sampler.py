"""Memory sampling for bench/gpu_release.py: NVML's per-process and device figures for one CUDA
device (RSS in the CPU dry run) every few milliseconds, and the failure that stops a check."""

from __future__ import annotations

import os
import threading
import time


class CheckFailed(Exception):
    pass


class Sampler:
    """Process (and device) memory every `period` s on a thread; peak since the last mark."""

    def __init__(self, device: int | None, period: float = 0.003):
        self.device, self.period = device, period
        self.samples: list[tuple[int, int | None]] = []
        self.missing = 0  # samples where NVML did not list this process
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def read(self, before_cuda: bool = False) -> tuple[int, int | None]:
        from lean_image_ai.runtime.measure.memory import gpu_snapshot, process_rss_bytes

        if self.device is None:
            return process_rss_bytes(), None
        snap = gpu_snapshot(self.device)
        if not snap.get("available"):
            raise CheckFailed(f"NVML cannot read CUDA device {self.device}: {snap.get('error')}")
        if snap["process_used_bytes"] is None and before_cuda:
            return 0, snap["used_bytes"]  # no CUDA context yet: NVML rightly lists nothing
        if snap["process_used_bytes"] is None:
            self.missing += 1
            raise CheckFailed(
                f"NVML does not list process {os.getpid()} on {snap['name']} (per-process accounting is "
                "unavailable here: a container without the host PID namespace, WSL, or MIG): nothing can be proved"
            )
        return snap["process_used_bytes"], snap["used_bytes"]

    def _loop(self):
        while not self._stop.is_set():
            try:
                self.samples.append(self.read())
            except CheckFailed:
                pass
            time.sleep(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def mark(self, before_cuda: bool = False) -> int:
        self.samples.append(self.read(before_cuda))
        return len(self.samples)

    def peak(self, since: int = 0) -> int:
        return max(s[0] for s in self.samples[since:])

    def device_peak(self, since: int = 0) -> int | None:
        values = [s[1] for s in self.samples[since:] if s[1] is not None]
        return max(values) if values else None
