"""MoGe-2's camera recovery in numpy (Blender ships no scipy): the focal length and z-shift that
turn MoGe's affine point map into camera-space points.

Least squares `min_{f,s} sum |f * (x, y) / (z + s) - (u, v)|^2` over a ~64x64 subsample of valid
pixels, `(u, v)` in MoGe's normalised view plane (pixel offset from the image centre divided by
half the image diagonal, so `f` is relative to the half diagonal). For a fixed `s` the best `f`
is closed form; `s` is then a 1-D problem, solved by a log-spaced scan of the nearest point's
depth followed by golden-section refinement (deterministic, no starting guess, never puts a
valid point behind the camera).

Outliers (a few per cent of wild points: sky or edge pixels the mask let through, as a hostile
test or a real photo gives) would drag that least squares far off, and a single one with a very
negative z would force a huge shift through the "in front of the camera" bound. So the fit is
robust in two steps (:func:`_robust_inliers`): a least-trimmed-squares scan over the shift (the
best TRIM_KEEP share of points counts, points behind the camera count as outliers) finds the
camera the bulk of the points agree on; points whose residual is over OUTLIER_SIGMAS robust
standard deviations (from the median residual) are dropped, and the plain least squares above is
solved on the rest. Where no point is dropped (a clean map) the result is exactly the plain one.

What it refuses (`DegenerateGeometryError`, a ValueError with a message for the artist), because
any answer would be arbitrary: fewer than MIN_VALID_POINTS valid points, all valid points at one
place, all at one depth (then every shift fits equally well, and with it any field of view), and
a fit whose diagonal field of view is outside FOV_RANGE_DEG.
MIN_VALID_POINTS comes from a noise study (random pixels of a 64x64 view, depths 1..4, 1 %
multiplicative noise, 300 trials per count): the worst focal error was 8.8e5x with 2 points,
62 % with 3, 15 % with 6, 6.4 % with 8, 2.5 % with 16 and 1.3 % with 64; 16 keeps the worst case
within a few percent.
"""

from __future__ import annotations

import math

import numpy as np

MIN_VALID_POINTS = 16
FOV_RANGE_DEG = (2.0, 160.0)  # diagonal field of view a photo's camera can plausibly have


class DegenerateGeometryError(ValueError):
    """The valid points cannot determine a focal length and shift."""


def view_plane_uv(height: int, width: int) -> np.ndarray:
    """HxWx2 float64: pixel-centre offsets from the image centre over half the diagonal.

    Same values as MoGe's `normalized_view_plane_uv` (corners at +-(W, H) / diagonal, shrunk by
    half a pixel), so a focal `f` here is relative to half the image diagonal.
    """
    half_diagonal = math.hypot(height, width) / 2.0
    u = (np.arange(width, dtype=np.float64) + 0.5 - width / 2.0) / half_diagonal
    v = (np.arange(height, dtype=np.float64) + 0.5 - height / 2.0) / half_diagonal
    return np.stack(np.meshgrid(u, v, indexing="xy"), axis=-1)


def _grid_indices(size: int, samples: int) -> np.ndarray:
    if samples >= size:
        return np.arange(size)
    return np.unique(((np.arange(samples) + 0.5) * (size / samples)).astype(np.int64))


def _subsample(points, uv, mask, grid: int, min_points: int):
    """Valid (xyz, uv) pairs on a grid x grid nearest subsample; finer grids for sparse masks."""
    height, width = points.shape[:2]
    total = int(mask.sum())
    samples = grid
    while True:
        rows = _grid_indices(height, samples)
        cols = _grid_indices(width, samples)
        keep = mask[np.ix_(rows, cols)]
        count = int(keep.sum())
        if count >= min(min_points, total) or samples >= max(height, width):
            return points[np.ix_(rows, cols)][keep], uv[np.ix_(rows, cols)][keep]
        samples *= 2


def _focal_for_shift(xy, z, uv, shift):
    """(focal, cost) for one shift: the best focal is closed form (linear least squares)."""
    projected = xy / (z + shift)[:, None]
    denominator = float(np.sum(projected * projected))
    if not denominator > 0.0 or not math.isfinite(denominator):
        return float("nan"), float("inf")
    focal = float(np.sum(projected * uv)) / denominator
    residual = focal * projected - uv
    return focal, float(np.sum(residual * residual))


def _minimise_log(cost, iterations: int = 80) -> float:
    """The log t minimising ``cost(log t)``: a log-spaced scan over 12 decades picks the basin,
    golden-section search refines it (deterministic, no starting guess)."""
    grid = np.linspace(math.log(1e-4), math.log(1e8), 121)
    costs = np.array([cost(g) for g in grid])
    best = int(np.argmin(costs))
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = high - ratio * (high - low), low + ratio * (high - low)
    cost_a, cost_b = cost(a), cost(b)
    for _ in range(iterations):
        if cost_a <= cost_b:
            high, b, cost_b = b, a, cost_a
            a = high - ratio * (high - low)
            cost_a = cost(a)
        else:
            low, a, cost_a = a, b, cost_b
            b = low + ratio * (high - low)
            cost_b = cost(b)
        if high - low < 1e-13:
            break
    log_t = (low + high) / 2.0
    if costs[best] < min(cost_a, cost_b, cost(log_t)):
        log_t = float(grid[best])
    return log_t


TRIM_KEEP = 0.75  # the least-trimmed-squares scan counts the best 75 % of points: up to 25 % outliers
CONCENTRATION_STEPS = 6  # refits on the best points at the chosen shift (each can only lower the cost)
REFITS = 5  # inliers chosen again from the fitted camera until they stop changing
OUTLIER_SIGMAS = 6.0  # a Gaussian residual is this far out about once in 10^8 points: only outliers are


def _trimmed_cost(xy, z, uv, shift: float, keep: int, steps: int = 2) -> tuple[float, np.ndarray | None]:
    """(cost, kept points) of one shift: the focal fitted to the points in front of the camera,
    then refitted to the ``keep`` with the smallest residuals (one concentration step of least
    trimmed squares); inf when fewer than ``keep`` points are in front."""
    front = np.flatnonzero(z + shift > 0.0)
    if len(front) < keep:
        return float("inf"), None
    projected = xy[front] / (z[front] + shift)[:, None]
    for _ in range(steps):
        focal = float(np.sum(projected * uv[front])) / max(float(np.sum(projected * projected)), 1e-300)
        squared = np.sum((focal * projected - uv[front]) ** 2, axis=1)
        best = np.argpartition(squared, keep - 1)[:keep]
        front, projected = front[best], projected[best]
    focal = float(np.sum(projected * uv[front])) / max(float(np.sum(projected * projected)), 1e-300)
    return float(np.sum((focal * projected - uv[front]) ** 2)), front


def _robust_inliers(xy, z, uv) -> np.ndarray:
    """Indices of the points the bulk agrees on (module doc): a least-trimmed-squares scan over
    the shift, then every point within OUTLIER_SIGMAS robust deviations of that camera."""
    count = len(z)
    keep = max(MIN_VALID_POINTS, int(math.ceil(TRIM_KEEP * count)))
    # over the median depth: shifts that put most points behind the camera are never the answer,
    # and an outlier's very negative z bounds nothing (unlike the plain fit's nearest point)
    z_ref = float(np.median(z))
    low, high = np.quantile(z, [0.1, 0.9])
    scale = float(high - low) or float(np.ptp(z)) or 1.0

    def cost(log_t):
        return _trimmed_cost(xy, z, uv, math.exp(log_t) * scale - z_ref, keep)[0]

    shift = math.exp(_minimise_log(cost, iterations=40)) * scale - z_ref  # the refits below refine it
    _, kept = _trimmed_cost(xy, z, uv, shift, keep, CONCENTRATION_STEPS)
    if kept is None:
        return np.arange(count)
    return _within(xy, z, uv, shift, kept)


def _within(xy, z, uv, shift: float, fitted: np.ndarray, focal: float | None = None) -> np.ndarray:
    """The points within OUTLIER_SIGMAS robust deviations of the camera (``focal``, or the focal
    for ``shift`` fitted to the points ``fitted``)."""
    front = z + shift > 0.0
    projected = np.where(front[:, None], xy / np.where(front, z + shift, 1.0)[:, None], 0.0)
    if focal is None:
        focal = float(np.sum(projected[fitted] * uv[fitted])) / max(float(np.sum(projected[fitted] ** 2)), 1e-300)
    distance = np.hypot(*(focal * projected - uv).T)
    # the fitted points' median residual norm is 1.1774 sigma for a 2-D Gaussian (Rayleigh median)
    sigma = float(np.median(distance[fitted])) / 1.1774
    floor = 1e-6 * float(np.sqrt(np.mean(uv * uv)))  # float32 rounding on a noise-free map
    return np.flatnonzero(front & (distance <= OUTLIER_SIGMAS * max(sigma, floor)))


def solve_focal_shift(
    uv: np.ndarray, xyz: np.ndarray, *, iterations: int = 80, focal: float | None = None
) -> tuple[float, float]:
    """(focal, shift) minimising sum |f * xy / (z + s) - uv|^2 over the inliers (module doc),
    with every inlier's z + s > 0; a given ``focal`` (one camera for a shot) is kept and only the
    shift solved. The search runs over t = z_min + s (depth of the nearest inlier), in log t
    (:func:`_minimise_log`)."""
    uv = np.asarray(uv, np.float64).reshape(-1, 2)
    xyz = np.asarray(xyz, np.float64).reshape(-1, 3)
    xy, z = xyz[:, :2], xyz[:, 2]
    _check_points(xy, z)
    inliers = _robust_inliers(xy, z, uv)
    given = focal
    for _ in range(REFITS):
        _check_points(xy[inliers], z[inliers])
        focal, shift = _least_squares(uv[inliers], xy[inliers], z[inliers], iterations, given)
        if len(inliers) == len(z):
            break  # a clean map: exactly the plain least squares
        again = _within(xy, z, uv, shift, inliers, given)
        if np.array_equal(again, inliers):
            break
        inliers = again
    return focal, shift


def _check_points(xy, z) -> None:
    if len(z) < MIN_VALID_POINTS:
        raise DegenerateGeometryError(
            f"only {len(z)} valid point(s), and at least {MIN_VALID_POINTS} are needed for a stable "
            "focal length and shift"
        )
    z_min, z_max = float(z.min()), float(z.max())
    magnitude = max(abs(z_min), abs(z_max), float(np.abs(xy).max()))
    span = z_max - z_min
    if float(np.ptp(xy, axis=0).max()) <= 1e-9 * max(magnitude, 1e-30) and span <= 1e-9 * max(magnitude, 1e-30):
        raise DegenerateGeometryError("every valid point is the same point")
    if span <= 1e-6 * max(abs(z_min), abs(z_max), 1e-30):
        raise DegenerateGeometryError(
            "every valid point lies at one depth, so the depth offset (and with it the field of view) "
            "cannot be recovered"
        )


def _least_squares(uv, xy, z, iterations: int, focal: float | None = None) -> tuple[float, float]:
    """(focal, shift) of the plain least squares: the focal fitted with the shift, or the one given."""
    z_min, scale = float(z.min()), float(z.max() - z.min())

    def cost(log_t):
        shift = math.exp(log_t) * scale - z_min
        if focal is None:
            return _focal_for_shift(xy, z, uv, shift)[1]
        residual = focal * xy / (z + shift)[:, None] - uv
        return float(np.sum(residual * residual))

    shift = math.exp(_minimise_log(cost, iterations)) * scale - z_min
    return (_focal_for_shift(xy, z, uv, shift)[0] if focal is None else focal), shift


def _valid_samples(points, mask, grid: int, min_points: int):
    """(xyz, uv) of an HxWx3 point map's finite, masked pixels on the solver's subsample."""
    points = np.asarray(points)
    if points.ndim != 3 or points.shape[2] != 3:
        raise ValueError(f"points must be HxWx3, got shape {points.shape}")
    height, width = points.shape[:2]
    valid = np.isfinite(points).all(axis=2)
    if mask is not None:
        mask = np.asarray(mask, bool)
        if mask.shape != (height, width):
            raise ValueError(f"mask shape {mask.shape} does not match points {points.shape[:2]}")
        valid &= mask
    return _subsample(points, view_plane_uv(height, width), valid, grid, min_points)


def shift_for_focal(
    points: np.ndarray, mask: np.ndarray | None, focal: float, *, grid: int = 64, min_points: int = 1024
) -> float:
    """The z-shift of an HxWx3 affine point map for a given ``focal`` (MoGe's convention; one
    camera for a shot, models/adapters/shot_camera.py), as robust to outliers as the joint fit."""
    xyz, uv = _valid_samples(points, mask, grid, min_points)
    return solve_focal_shift(uv, xyz, focal=focal)[1]


def recover_focal_shift(
    points: np.ndarray, mask: np.ndarray | None = None, *, grid: int = 64, min_points: int = 1024
) -> tuple[float, float]:
    """(focal, shift) of an HxWx3 affine point map (principal point at the centre).

    `focal` is relative to half the image diagonal (MoGe's convention; pixels = focal * diag / 2),
    `shift` is added to z. Solved on a `grid` x `grid` nearest subsample of the valid pixels, refined
    to a denser grid when fewer than `min_points` valid samples land on it (small masks).
    """
    xyz, uv = _valid_samples(points, mask, grid, min_points)
    focal, shift = solve_focal_shift(uv, xyz)
    if math.isfinite(focal) and focal > 0:
        fov = math.degrees(2.0 * math.atan(1.0 / focal))  # focal is relative to the half diagonal
        if not FOV_RANGE_DEG[0] <= fov <= FOV_RANGE_DEG[1]:
            raise DegenerateGeometryError(
                f"the fitted camera would have a {fov:.1f} degree diagonal field of view, outside the "
                f"plausible {FOV_RANGE_DEG[0]:g}-{FOV_RANGE_DEG[1]:g} degrees"
            )
    return focal, shift
