"""The request a leak check repeats: one family's job on a small generated image (bpy-free)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import families, library
from .base import JobOptions


def card_image(height: int = 96, width: int = 128) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.stack([x / width, y / height, 0.5 + 0.5 * np.sin(x / 7.0) * np.cos(y / 5.0)], axis=2)
    return (np.clip(image, 0, 1) * 255).astype(np.uint8)


def family_job(
    family_id: str,
    *,
    device: str = "auto",
    model: str = "",
    models_dir: str = "",
    runtime=None,
    size=(96, 128),
    cancel=None,
) -> Callable[[], object]:
    """A callable that runs the family's adapter once on the same image with the same model
    (an installed one, ``model`` as an id or a file, or the family's embedded fallback)."""
    family = families.get(family_id)
    as_file = model.endswith(".onnx")
    choice = library.resolve(
        family.id, library.models_dir(models_dir), "" if as_file else model, model if as_file else "", device=device
    )
    kwargs = choice.adapter_kwargs(family.id)
    image = card_image(*size)
    options = JobOptions(device=device, runtime=runtime, cancel=cancel)

    def job():
        return family.run([image], choice.path, options=options, **kwargs)

    return job
