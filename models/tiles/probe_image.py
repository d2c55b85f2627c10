"""A natural-looking image, built the same on every machine: what a deep net's reach is measured on
(models/tiles/reach.py), so the reach is a property of the model, never of the first image a user
happens to tile.

No photo ships with the add-on, and a flat grey or a graphic makes a trained net reach unlike a
photo does, so one is made: a 1/f ("pink") spectrum, as photographs have, in three correlated
colour channels, a few soft-edged discs and one hard edge (objects), and a little per-pixel grain
(sensor noise), quantised to 8 bits. Seeded: the same every run.
"""

from __future__ import annotations

import numpy as np


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
