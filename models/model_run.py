"""One family job, defined once (bpy-free): the family, the model it runs, the artist's option
values, the device and the memory budgets, and the one call that runs it on frames.

Every front-end builds its job here and runs it through :meth:`ModelRun.infer` (the callable a
models/batch/sequence.py BatchRun takes): the command line (ui/cli/main.py), the farm's workers
(ui/cli/farm_worker.py), Blender's single-image operators (operators/model_job.py), Process Sequence
(operators/batch_ops.py) and the leak check (models/leak_request.py). So they agree on:

- which model a ``--model``/Model text names (models/store/library.py ``names_a_file``);
- the adapter's keywords (the model's settings and the job's option values);
- the budgets: :meth:`infer` passes them with the job to its runtime operation (runtime/settings.py
  ``MemoryBudgets``; never into the shared runtime's settings, so no job runs under another's),
  which checks them before each load and run, and an upscale's auto tile size reads the one of the
  device its session runs on; the same budgets and image give the same tile plan everywhere;
- a model file not hashed since it changed is hashed by :meth:`infer`, on the worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..runtime.settings import MemoryBudgets
from . import families
from .base import RunOptions
from .family import Family
from .store import library


@dataclass
class ModelRun:
    family_id: str
    model: library.ModelChoice
    values: dict = field(default_factory=dict)  # the family's option values (front-end-only ones too)
    device: str = "auto"
    budgets: MemoryBudgets = field(default_factory=MemoryBudgets)
    # adapter keywords a later pass adds (a shot's focal length once its first pass settled it)
    extra: dict = field(default_factory=dict)

    @classmethod
    def resolve(
        cls,
        family_id: str,
        folder,
        *,
        model: str = "",
        model_path: str = "",
        values: dict | None = None,
        device: str = "auto",
        budgets: MemoryBudgets | None = None,
    ) -> ModelRun:
        """The job of ``family_id`` with ``model`` (an id or a file: one rule) or ``model_path``,
        else the installed or embedded default, from the models ``folder``: a read, with the
        first-time hash of an installed file left to :meth:`infer` (never Blender's main thread, never
        a write while choosing). The default model is picked for ``device`` (off CUDA fp32 before
        fp16: library.prefer_for_device)."""
        family = families.get(family_id)
        choice = library.resolve(family.id, Path(folder), model, model_path, device=device)
        known = {o.name: o.default for o in family.options}
        return cls(family.id, choice, {**known, **(values or {})}, device, budgets or MemoryBudgets())

    @property
    def family(self) -> Family:
        return families.get(self.family_id)

    def adapter_kwargs(self) -> dict:
        return {**self.model.adapter_kwargs(self.family_id, **self.values), **self.extra}

    def options(self, **fields) -> RunOptions:
        """Job options on this job's device and budgets (progress, cancel, runtime as given)."""
        return RunOptions(**{"device": self.device, "budgets": self.budgets, **fields})

    def for_worker(self) -> ModelRun:
        """The same job for another process: the model named by its absolute path."""
        model = library.ModelChoice(**{**vars(self.model), "path": str(Path(self.model.path).resolve())})
        return ModelRun(self.family_id, model, dict(self.values), self.device, self.budgets, dict(self.extra))

    def infer(self, frames, options: RunOptions | None = None):
        """Run the family's adapter on ``frames`` (one image, a list, or a lazy frame source) as
        one runtime operation, under this job's budgets (unless ``options`` brings its own)."""
        options = options or self.options()
        if options.budgets is None:
            options = replace(options, budgets=self.budgets)
        self.model.verify()
        return self.family.run(frames, self.model.path, options=options, **self.adapter_kwargs())
