"""Issue 20's tile policy: deep nets get a bounded overlap with feathered seams and say they are
not exact; the auto tile size comes from the working memory measured for the model (not a fixed
bytes-per-pixel table), per frame, against a working target per device kind. Real onnxruntime on
a small SR net; the CUDA target is checked on the options the runtime would give the provider."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.adapters.upscale.plan import (
    AUTO_WINDOW_STEP,
    FEATHER_OVERLAP,
    MAX_EXACT_RADIUS,
    MEASURE_WINDOW,
    REACH_FEATHER,
    SEAM_LEVELS,
    plan_overlap,
    working_target,
)
from lean_image_ai.models.base import RunOptions
from lean_image_ai.models.tiles.receptive import ReceptiveField
from lean_image_ai.runtime import Runtime
from lean_image_ai.runtime.core import RuntimeSettings
from lean_image_ai.runtime.settings import MemoryBudgets
from onnx_builders import sr_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return sr_model(tmp_path_factory.mktemp("deep") / "sr.onnx", scale=2, mid_channels=8, seed=3)


def picture(height, width):
    return np.random.default_rng(0).random((height, width, 3), dtype=np.float32)


def test_a_deep_net_gets_a_bounded_feathered_overlap_and_is_never_called_exact():
    plan = plan_overlap("rrdb.onnx", ReceptiveField(349, "graph", proven=True), None)
    assert (plan.overlap, plan.feather, plan.exact) == (FEATHER_OVERLAP, FEATHER_OVERLAP // 2, False)
    assert plan.warnings and plan.warnings[0].startswith("Not exact: rrdb.onnx's receptive radius is 349 px")
    compact = plan_overlap("compact.onnx", ReceptiveField(34, "graph", proven=True), None)
    assert (compact.overlap, compact.feather, compact.exact) == (34, 0, True)  # exact where it is cheap
    asked = plan_overlap("rrdb.onnx", ReceptiveField(349, "graph", proven=True), 349)  # the artist may pay for exact
    assert (asked.overlap, asked.feather, asked.exact) == (349, 0, True)
    assert MAX_EXACT_RADIUS < 349
    # once its reach is measured: the overlap covers it (rounded up to 16 px) plus the blend's band
    reached = plan_overlap("rrdb.onnx", ReceptiveField(349, "graph", proven=True), None, reach=70)
    assert (reached.overlap, reached.feather, reached.exact) == (80 + REACH_FEATHER, REACH_FEATHER, False)
    assert reached.bound.startswith(f"at most {SEAM_LEVELS} levels from one whole-image run (measured on trained")
    assert "a one-pixel change reaches: 70 px" in reached.warnings[0]


def test_an_explicit_overlap_below_the_radius_is_feathered_too():
    asked = plan_overlap("compact.onnx", ReceptiveField(34, "graph", proven=True), 16)
    assert (asked.overlap, asked.feather, asked.exact) == (16, 8, False)
    deep = plan_overlap("rrdb.onnx", ReceptiveField(349, "graph", proven=True), 32)
    assert (deep.overlap, deep.feather, deep.exact) == (32, 16, False)


def test_a_covered_radius_that_is_not_bit_exact_is_cropped_and_not_called_exact():
    """x3's bicubic tail by 0.75: the overlap covers the radius, the bits still differ (fp32 rounding)."""
    plan = plan_overlap("x3.onnx", ReceptiveField(19, "graph", proven=True, bit_exact=False), None)
    assert (plan.overlap, plan.feather, plan.exact) == (19, 0, False)
    assert plan.bound.startswith("at most 0.01 levels from one whole-image run")


def test_the_result_the_cli_line_and_the_json_say_not_exact(model):
    runtime = Runtime()
    image = picture(200, 260)
    result = upscale.run(image, model, options=RunOptions(device="cpu", runtime=runtime), tile_size=140, model_overlap=100)
    # the net's reach (2 px) was probed on this image: the least overlap, blended outside the reach
    assert (result.exact, result.overlap, result.feather) == (False, FEATHER_OVERLAP, REACH_FEATHER)
    assert result.seams.startswith(f"tiles blended; at most {SEAM_LEVELS} levels from one whole-image run")
    assert any(w.startswith("Not exact:") for w in result.warnings)
    # the net's true radius is 2 px, far inside the 32 px overlap: blended seams equal one run
    whole = upscale.run(image, model, options=RunOptions(device="cpu", runtime=runtime), tile_size=None)
    np.testing.assert_allclose(result.image, whole.image, atol=1e-5)
    runtime.clear("test teardown")


def test_a_tile_size_too_small_for_the_feather_ramps_is_raised_not_a_crash(model):
    """A user's tile (e.g. 32 px) below what an overlap and its ramps need: raised, said, and run."""
    runtime = Runtime()
    image = picture(200, 260)
    result = upscale.run(image, model, options=RunOptions(device="cpu", runtime=runtime), tile_size=32, model_overlap=100)
    floor = [w for w in result.warnings if w.startswith("Tile size 32 is below the minimum")]
    assert floor and result.tile_size_used < 200 and result.seams.startswith("tiles blended")
    whole = upscale.run(image, model, options=RunOptions(device="cpu", runtime=runtime), tile_size=None)
    np.testing.assert_allclose(result.image, whole.image, atol=1e-5)
    runtime.clear("test teardown")


def test_one_window_has_no_seam_so_no_not_exact_warning(model):
    runtime = Runtime()
    result = upscale.run(picture(40, 48), model, options=RunOptions(device="cpu", runtime=runtime), tile_size=None, model_overlap=100)
    assert result.exact is True and result.seams == "exact"
    assert not [w for w in result.warnings if w.startswith("Not exact:")]
    runtime.clear("test teardown")


def test_auto_tiles_come_from_the_measured_working_memory(model):
    runtime = Runtime()
    options = RunOptions(device="cpu", runtime=runtime)
    upscale.run(picture(300, 320), model, options=options)  # the model's first job measures it (one run)
    grew = runtime.working_memory[("sr.onnx", ((1, 3, MEASURE_WINDOW, MEASURE_WINDOW),))]
    rate = grew / MEASURE_WINDOW**2
    assert rate > 0
    # a budget sized from what was measured (a test must not assume this machine's figure): its
    # working target (half of it) is a ~200 px window, so a 400x420 frame must be tiled
    budget = int(2 * rate * 200**2)
    expected = int(math.sqrt(budget / 2 / rate)) // AUTO_WINDOW_STEP * AUTO_WINDOW_STEP
    result = upscale.run(picture(400, 420), model, options=options, memory_budget_bytes=budget)
    plan = runtime.events.recent("tile_plan")[-1]
    assert "KB per pixel measured" in plan["how"]
    assert MEASURE_WINDOW < plan["tile_size"] == expected < 400  # tiled, in windows the target allows
    assert result.tile_size_used <= plan["tile_size"]
    # measured once per model: the next job plans the same from it, without a measuring run
    upscale.run(picture(400, 420), model, options=options, memory_budget_bytes=budget)
    assert runtime.events.recent("tile_plan")[-1]["tile_size"] == plan["tile_size"]
    ends = [e for e in runtime.events.recent() if e["event"] == "operation_end"]
    assert ends[-1]["runs"] == ends[-2]["runs"]  # the same windows, and neither job measured again
    # a frame that fits the target runs as one window
    upscale.run(picture(64, 80), model, options=options)
    assert runtime.events.recent("tile_plan")[-1]["tile_size"] is None
    runtime.clear("test teardown")


def test_a_small_frame_of_a_never_measured_model_needs_no_measuring_run(model):
    runtime = Runtime()
    upscale.run(picture(MEASURE_WINDOW, MEASURE_WINDOW), model, options=RunOptions(device="cpu", runtime=runtime))
    (plan,) = runtime.events.recent("tile_plan")
    assert plan["tile_size"] is None and plan["how"] == "one window (a small image)"
    (ended,) = [e for e in runtime.events.recent() if e["event"] == "operation_end"]
    assert ended["runs"] == 1  # the frame's own run only
    runtime.clear("test teardown")


@pytest.mark.parametrize(
    ("settings", "job_budgets", "budget", "gpu", "expected"),
    [
        (RuntimeSettings(), None, None, None, 2 << 30),  # CPU default
        (RuntimeSettings(ram_budget_bytes=3 << 30), None, None, None, 3 << 29),  # half the RAM budget
        (RuntimeSettings(), None, 1 << 30, None, 1 << 29),  # the caller's budget
        (RuntimeSettings(), None, None, 0, 4 << 30),  # CUDA default
        (RuntimeSettings(gpu_mem_limit_bytes=2 << 30), None, None, 0, 1 << 30),  # half of gpu_mem_limit
        (RuntimeSettings(gpu_mem_limit_bytes=2 << 30, vram_budget_bytes=1 << 30), None, None, 0, 1 << 29),
        # the job's own budgets, not the runtime's settings: RAM, and VRAM (which caps the arena too)
        (RuntimeSettings(ram_budget_bytes=3 << 30), MemoryBudgets(1 << 30), None, None, 1 << 29),
        (RuntimeSettings(gpu_mem_limit_bytes=6 << 30), MemoryBudgets(None, 2 << 30), None, 0, 1 << 30),
    ],
)
def test_the_working_target_per_device_and_limit(settings, job_budgets, budget, gpu, expected):
    op = Runtime(settings).operation("plan", budgets=job_budgets)
    handle = SimpleNamespace(gpu_device_id=gpu)
    assert working_target(op, handle, budget) == expected
