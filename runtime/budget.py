"""Budget before a job: estimate what it needs, compare with what is free under the budget,
and act in order (release arenas, evict least-recently-used sessions) before refusing.

Weights come from the model file size (or nothing, when its session is already loaded); working
memory is what the same model grew on the same input shape last time (remembered per model and
shape from the job reports), never assumed: an unknown shape is "unknown", and the check then
only covers the weights and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .memory import available_system_memory_bytes, gpu_snapshot
from .memory_report import mb

MARGIN = 0.10  # of the estimate, on top of it


@dataclass
class BudgetDecision:
    fits: bool
    needed: int
    free: int | None
    working_known: bool
    actions: list[str] = field(default_factory=list)  # what was done to make room, in order

    def message(self) -> str:
        done = f" after {', '.join(self.actions)}" if self.actions else ""
        unknown = "" if self.working_known else " (working memory not measured yet for this shape: weights only)"
        if self.fits:
            return f"fits: needs about {mb(self.needed)}{unknown}, {mb(self.free)} free{done}"
        return (
            f"Not enough memory: this job needs about {mb(self.needed)}{unknown} but only {mb(self.free)} "
            f"is free under the budget{done}. Use a smaller tile size or resolution, or raise the budget."
        )


def remember_working(runtime, job: dict) -> None:
    """Keep what a job's runs grew, per (model, input shape), from its memory report."""
    key = job.get("working_key")
    if key and job["figures"]:
        grew = job["figures"][-1].get("grew")
        if grew is not None:
            runtime.working_memory[key] = max(grew, runtime.working_memory.get(key, 0))


def free_bytes(runtime, gpu_device_id: int | None, budget: int | None) -> int | None:
    if gpu_device_id is None:
        free = available_system_memory_bytes()
        used_now = None
    else:
        snap = gpu_snapshot(gpu_device_id)
        free = snap.get("free_bytes") if snap.get("available") else None
        used_now = snap.get("process_used_bytes") if snap.get("available") else None
    if budget:
        if used_now is None:
            from .memory import process_rss_bytes

            used_now = process_rss_bytes() if gpu_device_id is None else 0
        room = budget - (used_now or 0)
        free = room if free is None else min(free, room)
    return free


def check(runtime, model_path, input_shapes, *, gpu_device_id=None, budget=None) -> BudgetDecision:
    """Decide before a job; may release arenas and evict LRU sessions (never the needed one)."""
    path = Path(model_path)
    loaded = [h for h in runtime.cached_sessions() if h.model_path == path.resolve()]
    weights = 0 if loaded else path.stat().st_size
    working = runtime.working_memory.get((path.name, tuple(tuple(s) for s in input_shapes)))
    needed = int((weights + (working or 0)) * (1 + MARGIN))
    decision = BudgetDecision(False, needed, free_bytes(runtime, gpu_device_id, budget), working is not None)
    if decision.free is None or needed <= decision.free:
        decision.fits = True
        return decision
    runtime.release_now()
    decision.actions.append("releasing arenas")
    decision.free = free_bytes(runtime, gpu_device_id, budget)
    for handle in sorted(runtime.cached_sessions(), key=lambda h: h.last_used):
        if needed <= decision.free or handle in loaded:
            continue
        runtime.evict(handle, "budget")
        decision.actions.append(f"unloading {handle.model_name} (least recently used)")
        decision.free = free_bytes(runtime, gpu_device_id, budget)
    decision.fits = needed <= decision.free
    runtime.events.emit("budget", fits=decision.fits, needed=needed, free=decision.free, actions=decision.actions)
    return decision
