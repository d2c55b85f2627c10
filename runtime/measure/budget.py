"""Budget before a job: estimate what it needs, compare with what is free under the budget,
and act in order (release arenas, evict least-recently-used sessions) before refusing.

Weights come from the model file size (or nothing, when its session is already loaded); working
memory is what the same model grew on the same input shape last time, never assumed: measured
on the first run of each job (the previous job's release left the arena empty, so that run's
growth is the shape's cost) and from each job's report, remembered per (model, input shape).
A shape not measured yet is scaled from the same model's measured shapes by element count (the
highest rate seen); a model never measured is "unknown", and only its weights are checked.

Every operation checks twice (:class:`JobBudget`): before loading a model that is not cached
(its weights), and before the first run of each input shape (its working memory, less what the
job has already grown). When even after releasing and evicting a run does not fit,
:class:`MemoryBudgetError` (an out-of-memory error) is raised before anything runs: the tiler
then runs smaller tiles (the degrade; with the overlap at least the receptive radius the pixels
are the same), every other family reports the message. The default tile plan never depends on
free memory: only a shortage changes it, and the change is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import LeanImageError, MemoryBudgetError, user_path
from ..providers import measured_gpu
from ..settings import MemoryBudgets
from .memory import available_system_memory_bytes, figures, gpu_snapshot, memory_snapshot, peak_rss_bytes
from .memory_report import mb

MARGIN = 0.10  # of the estimate, on top of it
WHAT_TO_DO = (
    "Lower the resolution or the tile size, raise the memory budget (add-on preferences: RAM / GPU "
    "Memory Budget), or unload other models and close other programs."
)


@dataclass
class BudgetDecision:
    fits: bool
    needed: int  # bytes, margin included
    free: int | None  # under the budget, after the actions
    working_known: bool
    actions: list[str] = field(default_factory=list)  # what was done to make room, in order
    budget: int | None = None
    how: str = ""  # where the working memory figure came from
    used: int | None = None  # this process's figure when the budget was checked

    def message(self, subject: str = "this job") -> str:
        done = f", after {', '.join(self.actions)}" if self.actions else ""
        if self.fits:
            return f"fits: {subject} needs about {size(self.needed)}{self._how()}, {self._free()}{done}"
        return f"Not enough memory: {subject} needs about {size(self.needed)}{self._how()} but only {self._free()}{done}. {WHAT_TO_DO}"

    def note(self, subject: str) -> str:
        """One line for the job's report: what was short, what was done, how it ended."""
        end = "then it fitted" if self.fits else "still short: not run at that size"
        return f"{subject} needed about {size(self.needed)}{self._how()}, {self._free()}; {', '.join(self.actions)}; {end}"

    def _how(self) -> str:
        if not self.working_known:
            return " (working memory not measured yet for this shape: weights only)"
        return f" ({self.how})" if self.how else ""

    def _free(self) -> str:
        free = size(None if self.free is None else max(0, self.free))
        if not self.budget:
            return f"{free} free on the device"
        return f"{free} free under the {size(self.budget)} budget (this process uses {size(self.used)})"


def size(value) -> str:
    """Bytes for a budget message: MiB, or KiB below one MiB (a small tile's need is not "0 MiB")."""
    if value is not None and abs(value) < 2**20:
        return f"{value / 1024:.0f} KiB"
    return mb(value)


def elements(shapes) -> int:
    """Elements of a run's inputs (symbolic or missing dimensions count as nothing)."""
    return sum(math.prod(int(d) for d in shape) for shape in shapes if all(isinstance(d, int) for d in shape))


def working_estimate(runtime, model_name: str, shapes) -> tuple[int | None, str]:
    """(bytes, how) for one run of ``model_name`` on inputs of ``shapes``; (None, ...) unknown."""
    known = runtime.working_memory.get((model_name, shapes))
    if known is not None:
        return known, "measured for this input size"
    count = elements(shapes)
    rates = [grew / n for (name, s), grew in runtime.working_memory.items() if name == model_name and (n := elements(s))]
    if not rates or not count:
        return None, "not measured yet"
    return int(max(rates) * count), "scaled from a measured input size"


def remember(runtime, key, grew) -> None:
    if key and grew is not None and grew >= 0:
        runtime.working_memory[key] = max(int(grew), runtime.working_memory.get(key, 0))


def remember_working(runtime, job: dict) -> None:
    """Keep what a job's runs grew, per (model, largest input shape), from its memory report."""
    if job.get("working_key") and job["figures"]:
        remember(runtime, job["working_key"], job["figures"][-1].get("grew"))


def budget_for(budgets: MemoryBudgets, gpu_device_id: int | None) -> int | None:
    """A job's budget for the memory of the device it runs on: RAM, or that GPU's VRAM."""
    return budgets.ram_bytes if gpu_device_id is None else budgets.vram_bytes


def _used_now(gpu_device_id: int | None) -> int | None:
    return figures(memory_snapshot(gpu_device_id))["ram" if gpu_device_id is None else "vram"]


def free_bytes(gpu_device_id: int | None, budget: int | None) -> int | None:
    """What a job may still take: the device's free memory, and under a budget no more than the
    budget less what this process uses now (RSS, or its NVML figure on a GPU)."""
    if gpu_device_id is None:
        free = available_system_memory_bytes()
    else:
        snap = gpu_snapshot(gpu_device_id)
        free = snap.get("free_bytes") if snap.get("available") else None
    if budget:
        room = budget - (_used_now(gpu_device_id) or 0)
        free = room if free is None else min(free, room)
    return free


def make_room(runtime, decision: BudgetDecision, gpu_device_id, keep=()) -> BudgetDecision:
    """Release arenas, then evict least-recently-used sessions (never those in ``keep``) until
    ``decision.needed`` fits; records each action and emits one ``budget`` event."""
    budget = decision.budget
    runtime.release_now()
    decision.actions.append("releasing arenas")
    decision.free = free_bytes(gpu_device_id, budget)
    kept = {id(h) for h in keep}
    # only sessions whose memory is on this device: unloading a CPU model frees no VRAM
    on_device = [h for h in runtime.cached_sessions() if h.gpu_device_id == gpu_device_id]
    for handle in sorted(on_device, key=lambda h: h.last_used):
        if decision.free is None or decision.needed <= decision.free:
            break
        if id(handle) in kept:
            continue
        runtime.evict(handle, "budget")
        decision.actions.append(f"unloading {handle.model_name} (least recently used)")
        decision.free = free_bytes(gpu_device_id, budget)
    decision.fits = decision.free is None or decision.needed <= decision.free
    if budget:
        decision.used = _used_now(gpu_device_id)
    runtime.events.emit(
        "budget", fits=decision.fits, needed=decision.needed, free=decision.free, budget=budget,
        actions=decision.actions, device="cpu" if gpu_device_id is None else f"cuda:{gpu_device_id}",
    )
    return decision


def decide(runtime, needed: int, gpu_device_id, *, budget, known=True, how="", keep=()) -> BudgetDecision:
    decision = BudgetDecision(False, needed, free_bytes(gpu_device_id, budget), known, budget=budget, how=how)
    if budget:
        decision.used = _used_now(gpu_device_id)
    if decision.free is None or needed <= decision.free:
        decision.fits = True
        return decision
    return make_room(runtime, decision, gpu_device_id, keep)


def check(runtime, model_path, input_shapes, *, gpu_device_id=None, budget=None) -> BudgetDecision:
    """Decide for a whole job (weights + working memory) under ``budget``; may release arenas and
    evict LRU sessions (never the needed one)."""
    path = Path(model_path)
    loaded = [h for h in runtime.cached_sessions() if h.model_path == path.resolve()]
    weights = 0 if loaded else path.stat().st_size
    working, how = working_estimate(runtime, path.name, tuple(tuple(s) for s in input_shapes))
    needed = int((weights + (working or 0)) * (1 + MARGIN))
    return decide(runtime, needed, gpu_device_id, budget=budget, known=working is not None, how=how, keep=loaded)


class JobBudget:
    """The budget of one operation (see module doc); ``notes`` go into the job's report."""

    def __init__(self, runtime, timeline, budgets: MemoryBudgets):
        self.runtime = runtime
        self.timeline = timeline
        self.budgets = budgets  # the job's own (runtime/operation.py), never another job's
        self.notes: list[str] = []
        self._seen: set = set()
        self._baseline: dict = {}  # device -> its figure at the job's first run check
        self._measured = False

    def before_load(self, model_path, request, keep=()) -> None:
        """Room for a model's weights before its session is created (not for a cached one)."""
        try:
            path = user_path(model_path).resolve()
            size = path.stat().st_size
        except (OSError, LeanImageError):
            return  # the runtime reports a missing or unreadable file in its own words
        if any(h.model_path == path for h in self.runtime.cached_sessions()):
            return
        # "auto" is checked against RAM: which device it lands on is known once the session exists
        gpu = measured_gpu(request)
        needed = int(size * (1 + MARGIN))
        decision = decide(self.runtime, needed, gpu, budget=budget_for(self.budgets, gpu), how="its file's size", keep=keep)
        self._conclude(decision, f"loading {path.name}", path.name, request)

    def before_run(self, handle, shapes, keep=()) -> None:
        """Room for the working memory of the first run of each input shape in this job."""
        key = (handle.model_name, shapes)
        if key in self._seen:
            return
        self._seen.add(key)
        gpu = handle.gpu_device_id
        working, how = working_estimate(self.runtime, handle.model_name, shapes)
        now = _used_now(gpu)
        base = self._baseline.setdefault(gpu, now)
        if working is None:
            return  # nothing measured: the weights were checked, the run measures itself
        grown = max(0, now - base) if None not in (now, base) else 0  # already held by this job
        needed = int(max(0, working - grown) * (1 + MARGIN))
        decision = decide(self.runtime, needed, gpu, budget=budget_for(self.budgets, gpu), how=how, keep=keep)
        size = "x".join(str(d) for d in shapes[0]) if shapes else "?"
        self._conclude(decision, f"a {size} run of {handle.model_name}", handle.model_name, handle.device_label)

    def _conclude(self, decision: BudgetDecision, subject: str, model: str, device) -> None:
        if decision.actions:
            self.notes.append(decision.note(subject))
        if not decision.fits:
            raise MemoryBudgetError(
                decision.message(f"{subject} on {device}"),
                model=model,
                device=str(device),
                resource="memory under the budget" if decision.budget else "memory",
                detail=f"needed {decision.needed} bytes, free {decision.free}",
            )

    def meter(self, handle, shapes):
        """Start measuring the job's first run (None for the others)."""
        if self._measured:
            return None
        self._measured = True
        gpu = handle.gpu_device_id
        return (handle.model_name, shapes), gpu, _used_now(gpu), peak_rss_bytes(), self.timeline.now()

    def measured(self, meter) -> None:
        """What that run grew: the highest figure during it (the kernel's RSS high-water mark
        when it rose, the sampler's samples) over the figure before it."""
        if meter is None:
            return
        key, gpu, before, hwm_before, since = meter
        figure = "ram" if gpu is None else "vram"
        peaks = [_used_now(gpu), self.timeline.max_since(figure, since)]
        if gpu is None:
            hwm = peak_rss_bytes()
            if hwm is not None and hwm_before is not None and hwm > hwm_before:
                peaks.append(hwm)
        peaks = [p for p in peaks if p is not None]
        if before is not None and peaks:
            remember(self.runtime, key, max(peaks) - before)
