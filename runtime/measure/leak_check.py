"""Leak check: run the same request N times, record memory after each, say `stable` or `growing`.

A runtime that caches arenas and sessions reaches a plateau after a few runs (a high floor is not
a leak); a job that keeps something every run grows without end. After a warm-up (the first
fifth of the runs), memory is `growing` when both hold for one figure (RSS, or this process's
VRAM on a GPU): the least-squares slope per run is above the tolerance, and the medians of the
window's three thirds rise one after the other by more than the tolerance each run. A single
step (one late allocation, a page-cache hiccup) moves one third only, so it reads as stable.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import SettingError
from .memory import figures, memory_snapshot
from .memory_report import LABELS, mb

DEFAULT_TOLERANCE_PER_RUN = 256 * 1024
MIN_RUNS = 8  # two warm-up runs and the six the slope and the thirds need
MAX_RUNS = 100_000
RUNS_REASON = (
    f"It needs at least {MIN_RUNS} runs to judge: the first third (at least 2) only warms up, and "
    "telling a steady rise from a single step takes 6 runs after that."
)


@dataclass
class LeakResult:
    verdict: str  # "stable" or "growing"
    runs: int
    warmup: int
    samples: dict[str, list[int]] = field(default_factory=dict)  # figure -> value after each run
    slopes: dict[str, float] = field(default_factory=dict)  # figure -> bytes per run (window)
    growing: list[str] = field(default_factory=list)  # the figures that grow
    tolerance: int = DEFAULT_TOLERANCE_PER_RUN

    def summary(self) -> str:
        window = f"runs {self.warmup + 1}-{self.runs}"
        if self.growing:
            parts = [f"{LABELS[k].split(' (')[0]} grows {mb(self.slopes[k])} per run" for k in self.growing]
            return f"growing: {'; '.join(parts)} over {window} (tolerance {self.tolerance // 1024} KiB per run)"
        parts = [
            f"{LABELS[k].split(' (')[0]} plateaued at {mb(v[-1])} (slope {self.slopes[k] / 1024:.0f} KiB per run)"
            for k, v in self.samples.items()
        ]
        return f"stable: {'; '.join(parts)} over {window} (tolerance {self.tolerance // 1024} KiB per run)"


def analyse(samples: dict[str, list[int]], *, tolerance: int = DEFAULT_TOLERANCE_PER_RUN) -> LeakResult:
    runs = max((len(v) for v in samples.values()), default=0)
    if runs < MIN_RUNS:  # nothing measured is not "stable"
        raise SettingError(f"{runs} run(s) with memory figures cannot be judged. {RUNS_REASON}")
    # the first third only warms up: the allocator settles its free lists and per-thread arenas
    # over the first tens of jobs (measured here: RSS rises ~4 MB over ~25 upscale jobs, then flat)
    warmup = max(2, runs // 3)
    result = LeakResult("stable", runs, warmup, samples, tolerance=tolerance)
    for key, values in samples.items():
        window = np.asarray(values[warmup:], dtype=np.float64)
        if len(window) < 6:
            raise ValueError(f"a leak check needs at least {warmup + 6} runs")
        slope = float(np.polyfit(np.arange(len(window)), window, 1)[0])
        result.slopes[key] = slope
        thirds = [float(np.median(part)) for part in np.array_split(window, 3)]
        step = len(window) / 3 * tolerance
        rising = thirds[1] - thirds[0] > step and thirds[2] - thirds[1] > step
        if slope > tolerance and rising:
            result.growing.append(key)
    result.verdict = "growing" if result.growing else "stable"
    return result


def leak_check(
    job: Callable[[], object],
    *,
    runs: int = 30,
    gpu_device_id: int | None = None,
    tolerance: int = DEFAULT_TOLERANCE_PER_RUN,
    after_run: Callable[[int, dict], object] | None = None,
) -> LeakResult:
    """Run ``job()`` ``runs`` times; memory after each run (after a garbage collection)."""
    if isinstance(runs, bool) or not isinstance(runs, int) or not MIN_RUNS <= runs <= MAX_RUNS:
        reason = RUNS_REASON if isinstance(runs, int) and runs < MIN_RUNS else ""
        raise SettingError(f"runs={runs!r}: a leak check takes {MIN_RUNS} to {MAX_RUNS} runs. {reason}".rstrip())
    samples: dict[str, list[int]] = {}
    for index in range(runs):
        job()
        gc.collect()
        values = figures(memory_snapshot(gpu_device_id))
        for key, value in values.items():
            if value is not None:
                samples.setdefault(key, []).append(int(value))
        if after_run is not None:
            after_run(index + 1, values)
    return analyse(samples, tolerance=tolerance)
