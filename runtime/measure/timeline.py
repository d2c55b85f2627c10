"""Memory during one job: sampled on a background thread, plus named marks (before, each run,
release, after). RSS always; this process's VRAM (NVML) once the job has a CUDA session.

The sampler only reads (``/proc/self/statm`` on Linux, one NVML query on a GPU), so it costs
next to nothing and never touches the runtime's state. A failed read is a gap, never an error.
"""

from __future__ import annotations

import threading
import time

from .memory import figures, memory_snapshot, peak_rss_bytes

SAMPLE_INTERVAL_S = 0.05


class _Sampler:
    """One long-lived thread samples every running job's timeline. A thread per job would make
    the C allocator open new per-thread arenas job after job: RSS creeping up that looks like a
    leak (seen with the leak check) and is not one.

    Between jobs it is parked, and ``remove`` returns only once it is: no round runs after a
    job's timeline stopped (no stale sample, no wake-up on a timer). In Blender this matters
    beyond tidiness: with Python 3.11 (Blender 4.2 to 5.0), when a script's ``bpy.ops`` call
    returns, Blender asks Python whether *a* thread holds the GIL (3.11 keeps one current
    thread for the whole process) and, when this thread is the one sampling, reads its context
    dictionary without taking the GIL, alongside us: a corrupted heap and a segfault a few
    calls later (seen about one run in five of the stock test's undo steps on bpy 5.0.1)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._active: set = set()
        self._parked = True
        self._thread: threading.Thread | None = None

    def add(self, timeline) -> None:
        with self._cond:
            self._active.add(timeline)
            self._parked = False
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="lean-image-ai-memory", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def remove(self, timeline) -> None:
        with self._cond:
            self._active.discard(timeline)
            self._cond.notify_all()
            # the thread holds the lock except while it waits: having it, no round is running
            if self._thread is not None and self._thread.is_alive():
                self._cond.wait_for(lambda: self._parked or bool(self._active), timeout=5.0)

    def _loop(self) -> None:
        with self._cond:
            while True:
                if not self._active:
                    self._parked = True
                    self._cond.notify_all()
                    self._cond.wait()  # idle between jobs: no polling
                    continue
                self._cond.wait(min(t.interval for t in self._active))  # woken early by add/remove
                for timeline in list(self._active):  # under the lock: remove waits for the round
                    timeline.sample()


_sampler = _Sampler()


class Timeline:
    """Samples memory every :data:`SAMPLE_INTERVAL_S` between ``start()`` and ``stop()``."""

    def __init__(self, interval: float = SAMPLE_INTERVAL_S):
        self.interval = interval
        self.gpu_device_id: int | None = None  # set when the job gets a CUDA session
        self.samples: list[tuple[float, dict]] = []  # (seconds since start, figures)
        self.marks: list[tuple[float, str, dict]] = []
        self._t0 = time.perf_counter()
        self._hwm_start = None
        self._running = False
        self._lock = threading.Lock()

    def _read(self) -> dict:
        try:
            return figures(memory_snapshot(self.gpu_device_id))
        except Exception:
            return {"ram": None, "vram": None}

    def start(self) -> Timeline:
        self._t0 = time.perf_counter()
        self._hwm_start = peak_rss_bytes()
        self._running = True
        _sampler.add(self)
        return self

    def sample(self) -> None:
        value = self._read()
        with self._lock:
            if self._running:
                self.samples.append((time.perf_counter() - self._t0, value))

    def mark(self, label: str, snap: dict | None = None) -> dict:
        value = figures(snap) if snap is not None else self._read()
        with self._lock:
            self.marks.append((time.perf_counter() - self._t0, label, value))
        return value

    def stop(self) -> None:
        with self._lock:
            self._running = False
        _sampler.remove(self)

    def peak(self, key: str) -> int | None:
        """The highest figure seen. For RAM on Linux the kernel's high-water mark (VmHWM) too,
        when it rose during the job: it catches peaks between two samples."""
        with self._lock:
            values = [v[key] for _, v in self.samples if v.get(key) is not None]
            values += [v[key] for _, _, v in self.marks if v.get(key) is not None]
        if key == "ram":
            hwm = peak_rss_bytes()
            if hwm is not None and self._hwm_start is not None and hwm > self._hwm_start:
                values.append(hwm)
        return max(values) if values else None

    def now(self) -> float:
        """Seconds since ``start()``, on the clock of the samples and marks."""
        return time.perf_counter() - self._t0

    def max_since(self, key: str, since: float) -> int | None:
        """The highest figure sampled or marked from ``since`` on (None when none was)."""
        with self._lock:
            values = [v[key] for t, v in self.samples if t >= since and v.get(key) is not None]
            values += [v[key] for t, _, v in self.marks if t >= since and v.get(key) is not None]
        return max(values) if values else None

    def as_dict(self) -> dict:
        with self._lock:
            return {
                "samples": [(round(t, 4), v) for t, v in self.samples],
                "marks": [(round(t, 4), label, v) for t, label, v in self.marks],
            }


PLOT_POINTS = 1000  # more than the memory picture has columns (800: runtime/measure/memory_plot.py)


def thinned(timeline: dict | None, points: int = PLOT_POINTS) -> dict | None:
    """``timeline`` (:meth:`Timeline.as_dict`'s) with about ``points`` samples, and run marks, per
    series, for a picture of it: the worker sends this to Blender's process, which only draws it (a
    10-hour job's 720,000 samples are 50 MiB of JSON, seconds of Blender's main thread to receive:
    bench/worker_timeline.py). The samples are cut into ``points / 2`` stretches in time order and
    each keeps the ones holding its lowest and highest figure of each series, so every peak and
    trough the picture draws stays; a long sequence's run marks (one per frame) are thinned alike,
    their number kept as ``run_count`` for the legend. The other marks (before, release, after)
    all stay."""
    if timeline is None:
        return None
    samples, marks = timeline.get("samples") or [], timeline.get("marks") or []
    runs = [m for m in marks if str(m[1]).startswith("run ")]
    thin = dict(timeline)
    if len(samples) > points:
        thin["samples"] = [samples[i] for i in _extremes([v for _, v in samples], points)]
    if len(runs) > points:
        kept = [runs[i] for i in _extremes([v for _, _, v in runs], points)]
        thin["marks"] = sorted([m for m in marks if not str(m[1]).startswith("run ")] + kept, key=lambda m: m[0])
        thin["run_count"] = len(runs)
    return thin


def _extremes(figures: list[dict], points: int) -> list[int]:
    """Which of ``figures`` (in time order) to keep: in each of ``points / 2`` stretches, the ones
    holding its lowest and highest figure of each series (one, where a stretch holds none)."""
    step = -(-len(figures) // max(1, points // 2))
    keys = sorted({key for values in figures for key in values})
    kept: list[int] = []
    for start in range(0, len(figures), step):
        stretch = range(start, min(start + step, len(figures)))
        chosen: set[int] = set()
        for key in keys:
            held = [i for i in stretch if figures[i].get(key) is not None]
            if held:
                chosen.update((min(held, key=lambda i: figures[i][key]), max(held, key=lambda i: figures[i][key])))
        kept.extend(sorted(chosen or {start}))  # a stretch of gaps (failed reads) keeps one: the gap is drawn
    return kept
