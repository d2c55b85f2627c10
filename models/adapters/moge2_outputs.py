"""MoGe-2's head outputs at the source size, resampled where MoGe's own `forward()` resamples them.

MoGe resizes the heads' raw maps to the picture's size (one bilinear, no antialias) and only then
applies its activations: `exp` of the point map's z (x and y scaled by it), the mask's sigmoid and
the normals' normalisation. A dynamic-size export is fed at the picture's size
(moge2.at_source_size), so it does that itself and nothing here resizes. A fixed-size export runs
at its own size, so its outputs come after the activations: those are undone here (log of z,
x / z and y / z, the mask's logit), the raw maps resized once as MoGe does, and the activations
applied again. Resampling after the activations instead (as this adapter did before issue 42)
bends z between pixels and moves the mask's 0.5 contour: on the seeded ViT-S export, mask IoU
0.54 against MoGe's."""

from __future__ import annotations

import numpy as np

from .resampling import torch_bilinear

# a float32 sigmoid saturates at 1 beyond a logit of ~17: its inverse is clipped there (the
# resampled logit's sign, which the 0.5 threshold reads, does not depend on the clip)
PROBABILITY_FLOOR = 1e-7


def points_to_source(points: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """HxWx3 affine points at `size`: MoGe-2's `exp` remap undone, resampled, redone. A map with a
    non-positive or non-finite z (not from an `exp` remap) is resampled as it is."""
    if points.shape[:2] == tuple(size):
        return points
    z = points[:, :, 2]
    if not (np.isfinite(points).all() and (z > 0).all()):
        return torch_bilinear(points, size, antialias=False)
    raw = np.empty_like(points)
    np.divide(points[:, :, :2], z[:, :, None], out=raw[:, :, :2])
    np.log(z, out=raw[:, :, 2])
    raw = torch_bilinear(raw, size, antialias=False)
    depth = np.exp(raw[:, :, 2])
    raw[:, :, :2] *= depth[:, :, None]
    raw[:, :, 2] = depth
    return raw


def mask_to_source(probability: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """HxW mask probability at `size`: the logit resampled, the sigmoid applied after."""
    if probability.shape == tuple(size):
        return probability
    p = np.clip(probability.astype(np.float64), PROBABILITY_FLOOR, 1.0 - PROBABILITY_FLOOR)
    logit = torch_bilinear((np.log(p) - np.log1p(-p)).astype(np.float32), size, antialias=False)
    return (1.0 / (1.0 + np.exp(-logit))).astype(np.float32)


def normal_to_source(normal: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """HxWx3 unit normals at `size`: resampled, then normalised (zero vectors stay zero). The
    export's normals are already normalised, so this is not MoGe's resize of the raw head output:
    only a fixed-size export's normals come here resized."""
    if normal.shape[:2] != tuple(size):
        normal = torch_bilinear(normal, size, antialias=False)
    length = np.linalg.norm(normal, axis=2, keepdims=True)
    return np.where(length > 1e-12, normal / np.maximum(length, 1e-12), 0.0).astype(np.float32)
