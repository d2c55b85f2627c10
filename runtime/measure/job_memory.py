"""What one job did to memory, kept while it runs and said when it ends: the memory before it, the
sessions it loaded and the ones it ran, its largest run (what budget.py remembers), and the bytes
its outputs and results still hold; at its end, the report memory_report.py words (the figures,
the loaded models, the lines). runtime/operation.py's Operation keeps one per job and publishes
the report (an event, the runtime's last job)."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..providers import may_use_measured_gpu
from ..session import LIBRARY_RAM
from .budget import elements, remember_working
from .memory import figures, gpu_snapshot, memory_snapshot
from .memory_report import format_job_memory, job_figures


class JobMemory:
    """One job's memory account, fed by its Operation as it loads and runs sessions."""

    def __init__(self, runtime, timeline):
        self.runtime = runtime
        self.timeline = timeline  # the job's Timeline: its marks give the before, peak and after figures
        self.started_at = 0.0  # time.time() at the job's start: was onnxruntime imported during it?
        self.before: dict = {}  # figure -> memory at the job's start (VRAM: before its first CUDA session)
        self.loaded: list = []  # sessions this job created
        self.used: dict = {}  # by id(handle): the sessions this job ran
        self.live_output_bytes = 0  # the last run's outputs
        self.results_held: Callable[[], int] | None = None  # the job's results still alive (bytes)
        self.working_key = None  # (model, input shapes) of the largest run: what budget.py remembers

    def start(self) -> None:
        self.started_at = time.time()

    def mark_before(self) -> None:
        self.before["ram"] = self.timeline.mark("before")["ram"]

    def before_load(self, request) -> None:
        """The VRAM before the job's first session that may run on a measured GPU."""
        if "vram" not in self.before and may_use_measured_gpu(request):
            vram = figures({"gpu": gpu_snapshot(request.index or 0)})["vram"]
            if vram is not None:
                self.before["vram"] = vram

    def ran(self, handle, shapes: tuple) -> None:
        """A run of `handle` on inputs of `shapes`: the session is used, the largest run kept."""
        self.used[id(handle)] = handle
        if self.working_key is None or elements(shapes) > elements(self.working_key[1]):
            self.working_key = (handle.model_name, shapes)
        if handle.gpu_device_id is not None:
            self.timeline.gpu_device_id = handle.gpu_device_id

    def gpu(self) -> int | None:
        """The GPU the job ran on (None: CPU only)."""
        return next((h.gpu_device_id for h in self.used.values() if h.gpu_device_id is not None), None)

    def report(self, operation: str, outcome: str, *, unfinished: int, runs: int, release: dict, budget: list) -> dict:
        """The job's memory report (memory_report.py): its figures per device, what it loaded and
        how it released (`release`: released, release_rules, release_deferred_s), its lines; the
        largest run's working memory remembered (budget.py). The timeline is stopped."""
        gpu = self.gpu()
        after = self.timeline.mark("after", memory_snapshot(gpu))
        self.timeline.stop()
        rows = []
        results = self.results_held() if self.results_held is not None else 0
        for key in ("ram", "vram") if gpu is not None else ("ram",):
            weights, session_state, count = self.runtime.weights(key, gpu)
            rows.append(
                job_figures(
                    key,
                    before=self.before.get(key),
                    loaded=self._loaded_bytes(key),
                    peak=self.timeline.peak(key),
                    after=after.get(key),
                    library=self.runtime.library_floor(key, gpu),
                    weights=weights, session_state=session_state,
                    cached_sessions=count,
                    results=results, unfinished=unfinished,
                )
            )
        library = LIBRARY_RAM.get("at", 0) >= self.started_at
        job = {
            "operation": operation,
            "outcome": outcome,
            "devices": sorted({h.device_label for h in self.used.values()}),
            "loaded_models": ["the onnxruntime library"] * library + [h.model_name for h in self.loaded],
            **release,
            "runs": runs,
            "live_output_bytes": self.live_output_bytes,
            "figures": rows,
            "budget": list(budget),
        }
        job["lines"] = format_job_memory(job)
        job["working_key"] = self.working_key
        remember_working(self.runtime, job)
        return job

    def _loaded_bytes(self, key: str) -> int:
        """What loading added during this job: its new sessions (and onnxruntime, if it was first
        imported during the job)."""
        total = sum(max(0, h.load_growth.get(key) or 0) for h in self.loaded)
        if key == "ram" and LIBRARY_RAM.get("at", 0) >= self.started_at:
            total += LIBRARY_RAM.get("bytes", 0)
        return total
