"""The request a leak check repeats: one family's job on a small generated image (bpy-free)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..runtime.settings import MemoryBudgets
from .model_run import ModelRun
from .store import library


def card_image(height: int = 96, width: int = 128) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.stack([x / width, y / height, 0.5 + 0.5 * np.sin(x / 7.0) * np.cos(y / 5.0)], axis=2)
    return (np.clip(image, 0, 1) * 255).astype(np.uint8)


def repeatable_run(
    family_id: str,
    *,
    device: str = "auto",
    model: str = "",
    folder: Path | None = None,
    budgets: MemoryBudgets | None = None,
    runtime=None,
    size=(96, 128),
    cancel=None,
) -> Callable[[], object]:
    """A callable that runs the family's model (models/model_run.py's ModelRun) once on the same image
    with the same model (an installed one, ``model`` as an id or a file, or the family's embedded fallback), from
    the models ``folder`` a front-end found (library.models_dir), else the default one."""
    # the first-time hash of an installed file, if any, is the first run's (never the caller's thread)
    folder = folder if folder is not None else library.models_dir()
    job = ModelRun.resolve(family_id, folder, model=model, device=device, budgets=budgets)
    image = card_image(*size)
    options = job.options(runtime=runtime, cancel=cancel)
    return lambda: job.infer([image], options)
