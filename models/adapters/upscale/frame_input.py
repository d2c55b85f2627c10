"""A frame as an upscale model takes it, and its alpha joined back to the result.

Alpha: the default `alpha_mode="model"` runs the alpha channel through the model as a grey image
(mean of the three output channels), so transparency edges line up with the colour edges the
model sharpened. It costs one extra run per tile, but only when the alpha is not constant:
opaque images (the common case for renders and photos) skip it. `alpha_mode="resize"` uses a
cubic resize instead (same kernel as the embedded bicubic model) and never runs the model twice.

Range: RGB is clipped to [0, 1] for a trained model; the embedded bicubic model keeps an HDR
frame's values (`keeps_hdr`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...imaging import clip_for_model, resize_clipped

DEFAULT_MODEL_PATH = Path(__file__).parents[2] / "assets" / "bicubic_x2.onnx"
ALPHA_MODES = ("model", "resize")  # through the model as a grey image, or resized (cubic)


@dataclass
class ModelInput:
    """What one frame feeds the tiler, and what its result needs from the source besides."""

    source: np.ndarray  # HxWx3 RGB in [0, 1], or HxWx4 when the alpha runs through the model
    alpha: np.ndarray | None  # the source's alpha, None when it has none
    alpha_constant: float | None  # a flat alpha's value: no run needed to upscale it
    model_alpha: bool  # the alpha runs through the model (the 4th channel of `source`)
    kind: str  # the source's samples: "8-bit", "16-bit" or "float"
    warnings: list[str]
    clipped: str | None = None  # what was clipped for the model, in words
    high: float = 1.0  # the highest value the output keeps (an HDR frame's own through the embedded model)


def model_input(frame, *, alpha_mode: str, hdr: bool, model_name: str, plan_warnings) -> ModelInput:
    """The frame as the model takes it: RGB clipped to [0, 1] (to its own range when `hdr`), with
    the alpha as a 4th channel when it runs through the model; `plan_warnings` lead its warnings."""
    prepared = frame.prepare()
    warnings = list(plan_warnings) + list(prepared.warnings)
    rgb, alpha = prepared.rgb, prepared.alpha
    high = 1.0
    if hdr and prepared.kind == "float":  # an HDR frame keeps its range, not the resampling's ringing
        high = max(1.0, float(rgb.max()))
    clipped = clip_for_model(rgb, high, model_name, hdr_hint="the embedded bicubic model keeps HDR values")
    if clipped:
        warnings.append(f"{frame.label}: {clipped}")
    alpha_constant = None
    if alpha is not None and float(alpha.min()) == float(alpha.max()):
        alpha_constant = float(alpha.min())
    model_alpha = alpha is not None and alpha_constant is None and alpha_mode == "model"
    source = np.concatenate([rgb, alpha[:, :, None]], axis=2) if model_alpha else rgb
    return ModelInput(source, alpha, alpha_constant, model_alpha, prepared.kind, warnings, clipped, high)


def keeps_hdr(handle) -> bool:
    """Whether the model keeps values above 1: the embedded bicubic model is a plain resampling
    (linear, trained on nothing), so an HDR frame goes through it unclipped; a trained model
    learnt [0, 1] and gets its input clipped to that."""
    return Path(handle.model_path).resolve() == DEFAULT_MODEL_PATH.resolve()


def with_alpha(image: np.ndarray, fed: ModelInput) -> np.ndarray:
    """The upscaled RGB(A) with the source's alpha joined back: resized (cubic) or constant, unless
    it already ran through the model."""
    if fed.alpha is None or fed.model_alpha:
        return image  # clipped to [0, 1] as each tile was pasted
    out_h, out_w = image.shape[:2]
    if fed.alpha_constant is not None:
        matte = np.full((out_h, out_w, 1), fed.alpha_constant, np.float32)
    else:
        matte = resize_clipped(fed.alpha, (out_h, out_w), "cubic")[:, :, None]
    return np.concatenate([image, matte], axis=2)
