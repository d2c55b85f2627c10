"""MoGe-2 adapter: the numpy focal/shift solver against scipy, and the adapter end to end on a
MoGe-2-like ONNX model (tests/builders_moge2.py) whose point map is an analytic tilted plane."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from builders_moge2 import PLANE, expected_depth, moge2_like_model
from lean_image_ai.models.adapters import moge2, moge2_solver
from lean_image_ai.runtime.errors import (
    InvalidModelOutputError,
    ModelContractError,
    OperationCancelled,
)
from recording import cpu_options as opts
from scipy.optimize import least_squares

SHRINK_KEY = "memory.enable_memory_arena_shrinkage"
FOCAL, SHIFT, SCALE = 1.2, -1.5, 2.5  # the builder's defaults


# ---- helpers ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("moge2")
    return {
        "good": moge2_like_model(folder / "moge2.onnx"),
        "fp16": moge2_like_model(folder / "moge2_fp16.onnx", fp16=True),
        "scale_named": moge2_like_model(
            folder / "moge2_scale.onnx",
            scale_name="scale",
            scale_rank=0,
            num_tokens_rank=1,
            with_normal=False,
        ),
        "no_tokens": moge2_like_model(folder / "no_tokens.onnx", num_tokens_input=False),
        "points_rank3": moge2_like_model(folder / "points_rank3.onnx", points_rank=3),
        "nan": moge2_like_model(folder / "nan.onnx", poison="nan"),
    }


def red_image(height, width, valid=None):
    """Red where the builder's mask should be valid (its mask reads the red channel)."""
    image = np.zeros((height, width, 3), np.float32)
    image[..., 0] = 1.0 if valid is None else valid.astype(np.float32)
    image[..., 1] = 0.3
    return image


def expected_intrinsics(model_size, source_size, focal=FOCAL):
    """MoGe's infer(): fx, fy from the focal and the SOURCE's aspect (square pixels), whatever the
    grid the model ran at (its aspect differs by the rounding to whole patches)."""
    height, width = source_size
    aspect = width / height
    fx_norm = focal / 2 * math.sqrt(1 + aspect**2) / aspect
    fy_norm = focal / 2 * math.sqrt(1 + aspect**2)
    return fx_norm * width, fy_norm * height, 2 * math.atan(0.5 / fx_norm), 2 * math.atan(0.5 / fy_norm)


# ---- solver ------------------------------------------------------------------------------------


def synthetic_points(height, width, focal, shift, *, noise=0.0, invalid=0.0, seed=0):
    """A curved surface seen with a known focal; z stored minus `shift`; garbage where invalid."""
    rng = np.random.default_rng(seed)
    uv = moge_uv_reference(height, width)
    u, v = uv[..., 0], uv[..., 1]
    depth = 3.0 + 0.8 * u - 0.5 * v + 0.3 * np.sin(4 * u) * np.cos(3 * v)
    points = np.stack([depth * u / focal, depth * v / focal, depth - shift], axis=-1)
    points += noise * depth[..., None] * rng.standard_normal(points.shape)
    mask = rng.random((height, width)) >= invalid
    bad = ~mask
    points[bad] = rng.uniform(-50, 50, (int(bad.sum()), 3))  # points the solver must ignore
    points[bad & (rng.random((height, width)) < 0.3)] = np.nan
    return points.astype(np.float32), mask, uv


def moge_uv_reference(height, width):
    """MoGe's normalized_view_plane_uv written the way MoGe writes it (linspace over spans)."""
    aspect = width / height
    span_x = aspect / (1 + aspect**2) ** 0.5
    span_y = 1 / (1 + aspect**2) ** 0.5
    u = np.linspace(-span_x * (width - 1) / width, span_x * (width - 1) / width, width)
    v = np.linspace(-span_y * (height - 1) / height, span_y * (height - 1) / height, height)
    return np.stack(np.meshgrid(u, v, indexing="xy"), axis=-1)


def scipy_reference(points, mask, uv):
    """Joint (focal, shift) least squares with scipy on every valid pixel."""
    xyz = points[mask].astype(np.float64)
    uvs = uv[mask]
    xy, z = xyz[:, :2], xyz[:, 2]
    z_min, span = z.min(), z.max() - z.min()

    def residual(params):
        focal, shift = params
        return (focal * xy / (z + shift)[:, None] - uvs).ravel()

    solution = least_squares(
        residual,
        [1.0, -z_min + span],
        bounds=([-np.inf, -z_min + 1e-6 * span], [np.inf, np.inf]),
        method="trf",
        xtol=1e-14,
        ftol=1e-14,
        gtol=1e-14,
    )
    return solution.x


def test_view_plane_uv_matches_moges_definition():
    for height, width in ((7, 11), (48, 64), (101, 37)):
        np.testing.assert_allclose(
            moge2_solver.view_plane_uv(height, width), moge_uv_reference(height, width), atol=1e-12
        )


SOLVER_CASES = [  # (h, w, focal, shift): several aspects, shifts of both signs
    (48, 64, 1.3, -1.0),
    (64, 48, 0.9, 2.0),
    (24, 96, 2.2, 0.5),
    (61, 37, 1.0, -2.5),
    (150, 200, 1.6, 1.0),
]


@pytest.mark.parametrize("height,width,focal,shift", SOLVER_CASES)
@pytest.mark.parametrize("noise,invalid", [(0.0, 0.0), (1e-3, 0.2), (3e-3, 0.4)])
def test_solver_recovers_known_values_and_agrees_with_scipy(height, width, focal, shift, noise, invalid):
    points, mask, uv = synthetic_points(height, width, focal, shift, noise=noise, invalid=invalid)
    ours_f, ours_s = moge2_solver.recover_focal_shift(points, mask)
    ref_f, ref_s = scipy_reference(points, mask, uv)
    # noise-free: float32 input is the only error; noisy: 1e-3..3e-3 relative noise per point
    f_tol, s_tol = (1e-6, 1e-6) if noise == 0 else (5e-3, 1e-2)
    for f, s in ((ours_f, ours_s), (ref_f, ref_s)):
        assert abs(f / focal - 1) < f_tol
        assert abs(s - shift) < s_tol * 3  # shift in units of depth (about 3 here)
    # same samples (maps up to 64 a side use every valid pixel): the same optimum
    same_samples = max(height, width) <= 64
    agree = 1e-6 if same_samples else 2e-3
    assert abs(ours_f / ref_f - 1) < agree
    assert abs(ours_s - ref_s) < agree * 3


def test_solver_sparse_mask_refines_its_grid():
    points, _, _ = synthetic_points(300, 400, 1.4, 0.7)
    mask = np.zeros((300, 400), bool)
    mask[140:150, 200:212] = True  # 120 pixels: a 64x64 grid would hit only a handful
    focal, shift = moge2_solver.recover_focal_shift(points, mask)
    assert abs(focal / 1.4 - 1) < 1e-4
    assert abs(shift - 0.7) < 1e-3


@pytest.mark.parametrize("count", [1, 3, moge2_solver.MIN_VALID_POINTS - 1])
def test_solver_refuses_too_few_valid_points(count):
    points, _, _ = synthetic_points(16, 16, 1.0, 0.0, noise=0.01)
    mask = np.zeros(256, bool)
    mask[np.linspace(0, 255, count).astype(int)] = True
    with pytest.raises(moge2_solver.DegenerateGeometryError, match=f"only {count} valid point.*at least 16"):
        moge2_solver.recover_focal_shift(points, mask.reshape(16, 16))


def test_solver_refuses_a_constant_depth_map():
    uv = moge2_solver.view_plane_uv(32, 48)
    points = np.concatenate([uv * 2.0 / 0.8, np.full((32, 48, 1), 2.0)], axis=-1)
    with pytest.raises(moge2_solver.DegenerateGeometryError, match="one depth"):
        moge2_solver.recover_focal_shift(points)


def test_solver_refuses_identical_points():
    points = np.broadcast_to(np.array([0.3, -0.2, 1.5], np.float32), (24, 24, 3))
    with pytest.raises(moge2_solver.DegenerateGeometryError, match="same point"):
        moge2_solver.recover_focal_shift(points)


@pytest.mark.parametrize("focal", [0.003, 200.0])  # 179.7 and 0.6 degrees
def test_solver_refuses_an_implausible_field_of_view(focal):
    points, mask, _ = synthetic_points(40, 60, focal, 0.5)
    with pytest.raises(moge2_solver.DegenerateGeometryError, match="field of view, outside"):
        moge2_solver.recover_focal_shift(points, mask)


def test_solver_accepts_the_smallest_allowed_point_count():
    points, _, _ = synthetic_points(40, 40, 1.2, 0.5)
    mask = np.zeros(1600, bool)
    mask[np.linspace(0, 1599, moge2_solver.MIN_VALID_POINTS).astype(int)] = True
    focal, shift = moge2_solver.recover_focal_shift(points, mask.reshape(40, 40))
    assert abs(focal / 1.2 - 1) < 1e-6 and abs(shift - 0.5) < 1e-5


# ---- token count and input size ----------------------------------------------------------------


def test_num_tokens_levels_and_limits():
    assert [moge2.num_tokens_for_level(level) for level in (0, 1, 5, 9)] == [1200, 1466, 2533, 3600]
    with pytest.raises(ValueError, match="0..9"):
        moge2.num_tokens_for_level(10)
    with pytest.raises(ValueError, match=r"\[1200, 3600\]"):
        moge2.resolve_num_tokens(num_tokens=5000)
    assert moge2.resolve_num_tokens(resolution_level=0, num_tokens=2000) == 2000  # explicit wins


@pytest.mark.parametrize("height,width", [(101, 157), (1080, 1920), (1920, 1080), (50, 1000), (333, 333)])
@pytest.mark.parametrize("tokens", [1200, 3600])
def test_model_input_size_rule(height, width, tokens):
    model_h, model_w = moge2.model_input_size(height, width, tokens)
    assert model_h % 14 == 0 and model_w % 14 == 0
    rows, cols = model_h // 14, model_w // 14
    assert abs(rows * cols / tokens - 1) < 0.1
    # aspect within the rounding of one patch per side
    aspect = width / height
    assert (cols - 0.5) / (rows + 0.5) <= aspect <= (cols + 0.5) / (rows - 0.5)


# ---- adapter on the ONNX model -----------------------------------------------------------------


@pytest.mark.parametrize("size", [(101, 157), (77, 45)])
def test_recovers_intrinsics_fov_and_depth_at_source_size(models, recorded, size):
    runtime, _ = recorded
    height, width = size
    result = moge2.run(red_image(height, width), models["good"], options=opts(runtime))
    model_h, model_w = result.model_size
    assert model_h % 14 == 0 and model_w % 14 == 0
    assert result.points.shape == (height, width, 3) and result.depth.shape == (height, width)
    assert result.normal.shape == (height, width, 3) and result.mask.shape == (height, width)
    assert result.mask.dtype == bool and result.mask.all()
    assert result.points.dtype == np.float32 and result.intrinsics.dtype == np.float32
    assert abs(result.focal / FOCAL - 1) < 1e-5 and abs(result.shift - SHIFT) < 1e-5
    assert result.metric_scale == pytest.approx(SCALE)

    fx, fy, fov_x, fov_y = expected_intrinsics(result.model_size, size)
    np.testing.assert_allclose(
        result.intrinsics, [[fx, 0, width / 2], [0, fy, height / 2], [0, 0, 1]], rtol=1e-5, atol=1e-4
    )
    assert result.fov_x == pytest.approx(fov_x, rel=1e-5) and result.fov_y == pytest.approx(fov_y, rel=1e-5)
    # both fovs describe one camera of square pixels: the tan(fov/2) ratio is the source's aspect
    ratio = math.tan(result.fov_x / 2) / math.tan(result.fov_y / 2)
    assert (
        ratio == pytest.approx(width / height, rel=1e-9)
        and result.intrinsics[0, 0] == result.intrinsics[1, 1]
    )

    # fed at the source's size (moge2.at_source_size), the scene's uv is the source's: no resize
    expected = expected_depth(height, width, height, width, focal=FOCAL) * SCALE
    np.testing.assert_allclose(result.depth, expected, rtol=1e-5)
    # force_projection: every point lies on its pixel's ray through the intrinsics
    j, i = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    np.testing.assert_allclose(
        result.points[..., 0], (j - width / 2) / fx * result.depth, rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        result.points[..., 1], (i - height / 2) / fy * result.depth, rtol=1e-4, atol=1e-5
    )
    np.testing.assert_array_equal(result.points[..., 2], result.depth)
    # the plane really is a plane in the recovered camera space: n . X = d * scale
    n0, n1, n2, d = PLANE
    plane = result.points @ np.array([n0, n1, n2], np.float32)
    np.testing.assert_allclose(plane, d * SCALE, rtol=1e-3)
    assert result.num_tokens == 3600 and result.warnings == []


def test_without_force_projection_points_are_shifted_model_points(models, recorded):
    runtime, _ = recorded
    result = moge2.run(red_image(60, 90), models["good"], options=opts(runtime), force_projection=False)
    n0, n1, n2, d = PLANE
    plane = result.points @ np.array([n0, n1, n2], np.float32)
    np.testing.assert_allclose(plane, d * SCALE, rtol=2e-3)  # (xyz + [0, 0, shift]) * scale
    np.testing.assert_allclose(result.points[..., 2], result.depth, rtol=1e-6)


def test_mask_threshold_and_normals_renormalised(models, recorded):
    runtime, _ = recorded
    height, width = 97, 131
    valid = np.zeros((height, width), bool)
    valid[:, : width // 2] = True
    valid[60:, :] = True
    result = moge2.run(red_image(height, width, valid), models["good"], options=opts(runtime))
    # away from the edge the resampled red channel is clearly 0 or 1, so the mask is exact there
    far = np.ones_like(valid)
    far[:, width // 2 - 3 : width // 2 + 3] = False
    far[57:63, :] = False
    np.testing.assert_array_equal(result.mask[far], valid[far])
    assert result.mask.sum() < valid.size  # invalid pixels really came out invalid
    # normals: unit length ...
    np.testing.assert_allclose(np.linalg.norm(result.normal, axis=2), 1.0, atol=1e-5)
    # ... and the builder's field normalize(u, v, -1) at the source pixel centres, every pixel:
    # the export ran at the source's size, so nothing was resized after the normalisation
    half_diagonal = math.hypot(height, width) / 2
    u = ((np.arange(width) + 0.5) - width / 2) / half_diagonal
    v = ((np.arange(height) + 0.5) - height / 2) / half_diagonal
    field = np.stack(np.broadcast_arrays(u[None, :], v[:, None], -1.0), axis=-1)
    field /= np.linalg.norm(field, axis=2, keepdims=True)
    np.testing.assert_allclose(result.normal, field, atol=1e-5)


def test_mask_threshold_option(models, recorded):
    runtime, _ = recorded
    image = red_image(40, 40)
    image[..., 0] = 0.52  # mask = sigmoid(20 * 0.02) = 0.599
    assert moge2.run(image, models["good"], options=opts(runtime)).mask.all()
    with pytest.raises(InvalidModelOutputError, match="no valid geometry"):
        moge2.run(image, models["good"], options=opts(runtime), mask_threshold=0.7)


@pytest.mark.parametrize("level,tokens", [(0, 1200), (5, 2533), (9, 3600), (3, 2000)])
def test_num_tokens_fed_as_int64_scalar(models, recorded, level, tokens):
    runtime, factory = recorded
    explicit = 2000 if tokens == 2000 else None
    result = moge2.run(
        red_image(90, 120), models["good"], options=opts(runtime), resolution_level=level, num_tokens=explicit
    )
    fed = factory.sessions[0].feeds[0]["num_tokens"]
    assert fed.dtype == np.int64 and fed.shape == () and int(fed) == tokens
    assert 1200 <= int(fed) <= 3600
    image = factory.sessions[0].feeds[0]["image"]
    rows, cols = result.model_size[0] // 14, result.model_size[1] // 14
    assert abs(rows * cols / tokens - 1) < 0.05
    # smaller than every grid: fed as it is (MoGe's forward() takes the picture itself, and its
    # antialiased enlargement to the grid is the export's plain one)
    assert image.dtype == np.float32 and image.shape == (1, 3, 90, 120)
    np.testing.assert_array_equal(image[0].transpose(1, 2, 0), red_image(90, 120))
    assert result.num_tokens == tokens


def test_scale_named_scale_rank1_tokens_and_no_normal(models, recorded):
    runtime, factory = recorded
    result = moge2.run(red_image(50, 70), models["scale_named"], options=opts(runtime))
    assert factory.sessions[0].feeds[0]["num_tokens"].shape == (1,)  # the model's rank is respected
    assert result.metric_scale == pytest.approx(SCALE)
    assert result.normal is None
    assert abs(result.focal / FOCAL - 1) < 1e-5


def test_fp16_model_gets_float16_feeds(models, recorded):
    runtime, factory = recorded
    result = moge2.run(red_image(64, 80), models["fp16"], options=opts(runtime))
    assert factory.sessions[0].feeds[0]["image"].dtype == np.float16
    assert result.depth.dtype == np.float32
    assert abs(result.focal / FOCAL - 1) < 5e-3  # fp16 points carry ~1e-3 relative error
    np.testing.assert_allclose(result.depth, expected_depth(64, 80, 64, 80, focal=FOCAL) * SCALE, rtol=1e-2)


def test_uint8_rgba_source_and_input_warnings(models, recorded):
    runtime, _ = recorded
    rgba = np.zeros((33, 47, 4), np.uint8)
    rgba[..., 0] = 255
    rgba[..., 3] = 128
    assert moge2.run(rgba, models["good"], options=opts(runtime)).mask.all()
    image = red_image(33, 47)
    image[5, 5, 1] = np.nan
    result = moge2.run(image, models["good"], options=opts(runtime))
    assert any("NaN/Inf" in w for w in result.warnings)


# ---- contract and output errors ----------------------------------------------------------------


def test_missing_num_tokens_is_a_contract_error(models, recorded):
    runtime, factory = recorded
    with pytest.raises(ModelContractError) as info:
        moge2.run(red_image(30, 30), models["no_tokens"], options=opts(runtime))
    message = str(info.value)
    assert "no_tokens.onnx" in message and "MoGe-2" in message
    assert "no 'num_tokens' input" in message and "found inputs 'image'" in message
    assert factory.sessions[0].feeds == []  # nothing ran


def test_points_rank3_is_a_contract_error(models, recorded):
    runtime, _ = recorded
    with pytest.raises(ModelContractError) as info:
        moge2.run(red_image(30, 30), models["points_rank3"], options=opts(runtime))
    message = str(info.value)
    assert "output 'points': expected shape 1xHxWx3, found ['H', 'W', 3]" in message


def test_nan_points_raise_invalid_output(models, recorded):
    runtime, _ = recorded
    with pytest.raises(InvalidModelOutputError, match="NaN/Inf value.*'points'"):
        moge2.run(red_image(30, 40), models["nan"], options=opts(runtime))


@pytest.mark.parametrize("which", ["normal", "mask"])
def test_a_per_pixel_output_of_another_size_than_the_points_is_named(which):
    from types import SimpleNamespace

    from lean_image_ai.models.adapters import moge2_contract

    binding = SimpleNamespace(normal=SimpleNamespace(name="normal"), mask=SimpleNamespace(name="mask"))
    if which == "normal":
        outputs = {"normal": np.zeros((1, 20, 30, 3), np.float32)}
        read = lambda: moge2_contract.normal_output(outputs, binding, "m.onnx", (20, 31, 3))  # noqa: E731
    else:
        outputs = {"mask": np.zeros((1, 20, 30), np.float32)}
        read = lambda: moge2_contract.mask_output(outputs, binding, "m.onnx", (21, 30), [])  # noqa: E731
    with pytest.raises(InvalidModelOutputError, match=f"m.onnx returned '{which}' \\[20, 30.*but points.*must match"):
        read()


def test_all_invalid_mask_says_no_valid_geometry(models, recorded):
    runtime, _ = recorded
    black = np.zeros((30, 40, 3), np.float32)
    with pytest.raises(InvalidModelOutputError, match="no valid geometry in image"):
        moge2.run(black, models["good"], options=opts(runtime))


# ---- operations: frames, release, session reuse, cancel ---------------------------------------


def test_frames_are_one_operation_and_only_the_final_run_releases(models, recorded):
    runtime, factory = recorded
    sizes = [(40, 60), (61, 45), (50, 50)]
    progress = []
    frames = [red_image(h, w) for h, w in sizes]
    results = moge2.run(
        frames, models["good"], options=opts(runtime, progress=lambda f, s: progress.append((f, s)))
    )
    assert [r.depth.shape for r in results] == sizes
    assert len(factory.sessions) == 1
    session = factory.sessions[0]
    assert session.shrink_entries == ["", "", "cpu:0"]
    ends = [e for e in runtime.events.recent("operation_end") if e.get("operation") == "geometry"]
    assert ends and ends[-1]["outcome"] == "success" and ends[-1]["runs"] == 3
    fractions = [f for f, _ in progress]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any(stage == "frame 3/3" for _, stage in progress)
    # a second job reuses the cached session and again releases on its own final run
    moge2.run(frames[0], models["good"], options=opts(runtime))
    assert len(factory.sessions) == 1 and runtime.sessions_created == 1
    assert session.shrink_entries == ["", "", "cpu:0", "cpu:0"]
    assert runtime.events.recent("session_reuse")


def test_cancel_before_the_second_frame(models, recorded):
    runtime, factory = recorded
    cancel = threading.Event()

    def progress(fraction, stage):
        if stage == "frame 2/3":
            cancel.set()

    with pytest.raises(OperationCancelled):
        moge2.run(
            [red_image(30, 30)] * 3, models["good"], options=opts(runtime, progress=progress, cancel=cancel)
        )
    assert len(factory.sessions[0].feeds) == 1  # frame 2 never ran
    ends = [e for e in runtime.events.recent("operation_end") if e.get("operation") == "geometry"]
    assert ends[-1]["outcome"] == "cancelled"


def test_cancel_already_set_runs_nothing(models, recorded):
    runtime, factory = recorded
    with pytest.raises(OperationCancelled):
        moge2.run(red_image(30, 30), models["good"], options=opts(runtime, cancel=lambda: True))
    assert all(s.feeds == [] for s in factory.sessions)
