"""Seams, exactness and reach on Real-ESRGAN's trained weights (tools/ncnn_to_onnx.py's
conversions, cached in ~/.cache/lean_image_ai/trained_models), on tests/trained_weights.py's
natural-looking image. Seeded exports reach far less than trained files (tests/test_real_models.py
keeps them for shapes and memory); what the job says about its seams is checked here.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.adapters.upscale.plan import REACH_FEATHER, ROUNDING_LEVELS, SEAM_LEVELS
from lean_image_ai.models.base import RunOptions
from lean_image_ai.models.tiles import reach_cache
from lean_image_ai.models.tiles.receptive import graph_receptive_field
from lean_image_ai.runtime import Runtime
from trained_weights import ANIME_X2, ANIME_X3, ANIME_X4, X4PLUS, natural_image, trained_model

pytestmark = pytest.mark.trained_models


@pytest.fixture(autouse=True)
def models_folder(tmp_path, monkeypatch):
    """The stage files and reach records go to a scratch models folder, never the user's."""
    monkeypatch.setenv("LEAN_IMAGE_AI_MODELS_DIR", str(tmp_path / "models"))
    reach_cache.forget_in_process()
    yield tmp_path / "models"
    reach_cache.forget_in_process()


@pytest.fixture
def runtime():
    runtime = Runtime()
    yield runtime
    runtime.clear("test teardown")


def _run(runtime, image, model, **settings):
    return upscale.run(image, model, options=RunOptions(device="cpu", runtime=runtime), **settings)


def _levels(a, b) -> np.ndarray:
    return np.abs(a.astype(np.float64) - b) * 255.0


@pytest.mark.parametrize("name", [ANIME_X4, ANIME_X2])
def test_compact_tiles_are_bit_identical_at_the_default_overlap(runtime, name):
    image = natural_image(120, 150, seed=3)
    whole = _run(runtime, image, trained_model(name), tile_size=None)
    tiled = _run(runtime, image, trained_model(name), tile_size=64)
    assert tiled.overlap == graph_receptive_field(trained_model(name)).radius and tiled.feather == 0
    assert tiled.exact and tiled.seams == "exact"
    np.testing.assert_array_equal(tiled.image, whole.image)


def test_x3_is_not_called_exact_and_stays_within_what_it_says(runtime):
    """x3's bicubic tail (0.75 of the x4 net's output) is not tile-invariant to the bit."""
    image = natural_image(120, 150, seed=3)
    whole = _run(runtime, image, trained_model(ANIME_X3), tile_size=None)
    tiled = _run(runtime, image, trained_model(ANIME_X3), tile_size=64)
    assert not tiled.exact and tiled.feather == 0  # covered radius: cropped, blending would mix in less context
    assert tiled.seams.startswith(f"tiles cropped; at most {ROUNDING_LEVELS} levels from one whole-image run")
    assert _levels(tiled.image, whole.image).max() <= ROUNDING_LEVELS


def test_a_compact_net_reaches_no_farther_than_its_graph_radius():
    from lean_image_ai.models.tiles.reach import measure_reach, probe_crop

    model = trained_model(ANIME_X4)
    runtime = Runtime()
    try:
        found = measure_reach(
            lambda window: _run(runtime, window, model, tile_size=None).image, probe_crop(natural_image(160, 160))
        )
    finally:
        runtime.clear("test teardown")
    assert 0 < found <= graph_receptive_field(model).radius == 18


def test_an_explicit_overlap_below_the_radius_is_feathered(runtime):
    image = natural_image(120, 150, seed=3)
    model = trained_model(ANIME_X4)
    tiled = _run(runtime, image, model, tile_size=64, overlap=8)
    assert (tiled.overlap, tiled.feather, tiled.exact) == (8, 4, False)
    assert tiled.seams == "tiles blended; not exact"
    whole = _run(runtime, image, model, tile_size=None)
    assert _levels(tiled.image, whole.image).max() > 0  # a real seam: "not exact" is no label


def test_the_reach_is_measured_once_per_model_content_and_kept_in_the_models_folders_cache(runtime, tmp_path):
    """A catalog radius past MAX_EXACT_RADIUS sends the compact net down the deep-net path: its
    first tiled job probes the reach (on the fixed probe), keeps it in the models folder's cache
    (nothing beside the file), and the next job reads it."""
    model = shutil.copy(trained_model(ANIME_X4), tmp_path / "net.onnx")
    image = natural_image(200, 230, seed=4)
    first = _run(runtime, image, model, tile_size=160, model_overlap=100)
    record = json.loads(reach_cache.record_path(reach_cache.content_hash(model)).read_text())
    assert record["reach"] is not None and 0 < record["reach"] <= 18
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "net.onnx"]
    assert first.overlap == 32 and first.feather == REACH_FEATHER  # the least overlap covers it
    assert first.seams.startswith(f"tiles blended; at most {SEAM_LEVELS} levels")
    runs = [e["runs"] for e in runtime.events.recent() if e["event"] == "operation_end"]
    reach_cache.forget_in_process()  # a new process: only the file remains
    _run(runtime, image, model, tile_size=160, model_overlap=100)
    again = [e["runs"] for e in runtime.events.recent() if e["event"] == "operation_end"]
    assert again[-1] == runs[-1] - 2  # the same tiles, without the probe's two runs


def _eight_bit(image):
    return np.round(np.clip(image, 0, 1) * 255).astype(np.int16)


def test_x4plus_by_default_is_staged_exact_and_about_one_run_of_compute(runtime):
    """Trained RRDBNet's default plan: the body over the whole image, the head in windows that
    cover its own radius: the very pixels of one whole-image run, at about 1.0x the compute."""
    model = trained_model(X4PLUS)
    image = natural_image(72, 96, seed=5)
    staged = _run(runtime, image, model, memory_budget_bytes=64 << 20)  # the head in several windows
    whole = _run(runtime, image, model, tile_size=None)
    assert staged.plan["staged"] and staged.exact and staged.seams == "exact" and staged.plan["windows"] > 2
    assert staged.plan["compute"] <= 1.1
    np.testing.assert_array_equal(staged.image, whole.image)


@pytest.mark.parametrize(
    ("size", "budget", "window"),
    [((96, 224), 108_000_000, [96, 216]), ((224, 224), 243_000_000, [216, 216])],
    ids=["one seam", "a 2x2 grid"],
)
def test_x4plus_body_windows_hold_the_bound(runtime, size, budget, window):
    """A budget too small for the whole body: its windows overlap the reach measured on the fixed
    probe, blended; within SEAM_LEVELS (8-bit) and 1.0 level (float) of one run."""
    model = trained_model(X4PLUS)
    image = natural_image(*size, seed=5)
    whole = _run(runtime, image, model, tile_size=None)
    tiled = _run(runtime, image, model, memory_budget_bytes=budget)
    assert tiled.plan["staged"] and tiled.plan["window"] == window and not tiled.exact
    found = json.loads(reach_cache.record_path(reach_cache.content_hash(model)).read_text())["reach"]
    assert found is None or 64 < found  # 0.25 levels on the fixed probe: past 2 levels' 50-56 px
    assert tiled.overlap == 104  # the reach rounded up to 16 px (or the probe's 96 px), plus the blend
    eight = np.abs(_eight_bit(tiled.image) - _eight_bit(whole.image))
    floats = _levels(tiled.image, whole.image)
    print(f"x4plus body {window}: max {eight.max()} levels, float max {floats.max():.3f}")
    assert floats.max() > 0  # there is a seam to measure
    assert eight.max() <= SEAM_LEVELS and floats.max() <= 1.0


def test_x4plus_at_its_default_plan_is_within_the_levels_it_promises(runtime):
    """Trained RRDBNet: a one-pixel change reaches far past the old bounded 32 px overlap (which
    left seams of tens of levels). The default plan covers the measured reach and blends outside it."""
    model = trained_model(X4PLUS)
    image = natural_image(96, 448, seed=5)
    whole = _run(runtime, image, model, tile_size=None)
    tiled = _run(runtime, image, model, tile_size=400)  # a row of tiles whose windows miss the far side
    assert not tiled.exact and tiled.feather == REACH_FEATHER and tiled.overlap > 32
    assert tiled.seams.startswith(f"tiles blended; at most {SEAM_LEVELS} levels from one whole-image run")
    levels = _levels(tiled.image, whole.image)
    print(f"x4plus, overlap {tiled.overlap}: max {levels.max():.3f} levels, p99.9 {np.percentile(levels, 99.9):.3f}")
    assert levels.max() > 0  # there is a seam to measure
    assert levels.max() <= SEAM_LEVELS and np.percentile(levels, 99.9) <= 1
