"""MoGe-2's camera recovery with a few per cent of wild points (#21): the robust fit lands at the
noise level where plain least squares (ours before, and MoGe's own `recover_focal_shift`, whose
solver is re-expressed below with scipy: LM over the shift from 0, ftol 1e-3, the focal in closed
form) is dragged off by them; a clean map still gives exactly the plain least squares."""

from __future__ import annotations

import numpy as np
import pytest
from lean_image_ai.models.adapters import moge2_solver
from scipy.optimize import least_squares
from test_moge2 import SOLVER_CASES, scipy_reference, synthetic_points


def moge_reference(uv, xyz):
    """MoGe's solve_optimal_focal_shift, as its geometry_numpy.py solves it."""
    xy, z = xyz[:, :2].astype(np.float64), xyz[:, 2].astype(np.float64)

    def residual(shift):
        projected = xy / (z + shift)[:, None]
        focal = (projected * uv).sum() / np.square(projected).sum()
        return (focal * projected - uv).ravel()

    shift = float(least_squares(residual, x0=0, ftol=1e-3, method="lm").x[0])
    projected = xy / (z + shift)[:, None]
    return (projected * uv).sum() / np.square(projected).sum(), shift


def with_outliers(height, width, focal, shift, fraction, seed):
    """Wild points left inside the mask: uniform in a +-50 cube, as a bad mask lets them through."""
    points, mask, _ = synthetic_points(height, width, focal, shift, invalid=fraction, noise=1e-3, seed=seed)
    inside = np.isfinite(points).all(axis=2)  # the NaN ones the mask would drop anyway
    return points, inside, int((~mask & inside).sum())


@pytest.mark.parametrize("fraction", [0.01, 0.05, 0.1])
@pytest.mark.parametrize("height,width,focal,shift", SOLVER_CASES)
def test_a_few_per_cent_of_outliers_leave_the_focal_at_the_noise_level(height, width, focal, shift, fraction):
    points, mask, wild = with_outliers(height, width, focal, shift, fraction, seed=3)
    assert wild > 0
    ours_f, ours_s = moge2_solver.recover_focal_shift(points, mask)
    assert abs(ours_f / focal - 1) < 3e-3 and abs(ours_s - shift) < 0.02
    xyz, uv = moge2_solver._subsample(points, moge2_solver.view_plane_uv(height, width), mask, 64, 1024)
    moge_f, _ = moge_reference(uv, xyz)
    assert abs(ours_f - focal) <= abs(moge_f - focal)  # never worse than MoGe's own solver


@pytest.mark.parametrize("fraction", [0.01, 0.05, 0.1])
def test_the_shift_for_a_given_focal_leaves_the_same_outliers_out(fraction):
    """A shot's camera (one focal for every frame) solves each frame's shift with the joint fit's
    inliers: a few per cent of wild points leave it at the noise level."""
    height, width, focal, shift = 48, 64, 1.2, 0.7
    points, mask, wild = with_outliers(height, width, focal, shift, fraction, seed=5)
    assert wild > 0
    assert abs(moge2_solver.shift_for_focal(points, mask, focal) - shift) < 2e-3  # the plain fit: 70-220 off


@pytest.mark.parametrize("height,width,focal,shift", [c for c in SOLVER_CASES if max(c[:2]) <= 64])
def test_a_clean_map_gives_exactly_the_plain_least_squares(height, width, focal, shift):
    # up to 64 a side every valid pixel is a sample: the same points as scipy's
    points, mask, uv = synthetic_points(height, width, focal, shift, noise=3e-3, invalid=0.0, seed=5)
    ours_f, ours_s = moge2_solver.recover_focal_shift(points, mask)
    ref_f, ref_s = scipy_reference(points, mask, uv)
    assert abs(ours_f / ref_f - 1) < 1e-6 and abs(ours_s - ref_s) < 3e-6
