"""models/tiles/feather.py through run_tiled: feathered seams for an overlap below the receptive radius.

The weights of neighbouring tiles add up to 1 everywhere (corners and a split's T-junctions
included), so a model whose tiles all agree gives back exactly its untiled output; a model whose
tiles disagree near their edges gives a smooth blend instead of a step at the seam.
"""

from __future__ import annotations

import numpy as np
import pytest
from lean_image_ai.models.tiles.feather import feather_floor, ramp
from lean_image_ai.models.tiles.tile_plan import TilePlan
from lean_image_ai.models.tiles.tiling import TiledRun, run_tiled
from lean_image_ai.runtime.errors import InferenceOutOfMemoryError


def picture(height, width, seed=0):
    return np.random.default_rng(seed).random((height, width, 3), dtype=np.float32)


def upscale_nearest(window, _last, scale=2):
    return np.repeat(np.repeat(window, scale, axis=0), scale, axis=1)


def as_nchw(window, _last, scale=2):
    return upscale_nearest(window, _last, scale).transpose(2, 0, 1)[None]


@pytest.mark.parametrize("run_tile", [upscale_nearest, as_nchw], ids=["hwc", "nchw"])
def test_weights_add_up_to_one(run_tile):
    image = picture(101, 137)
    result = run_tiled(image, TiledRun(run_tile, TilePlan(48, 8, feather=4), scale=2))
    assert result.tiles_run > 4
    np.testing.assert_allclose(result.image, upscale_nearest(image, True), atol=2e-7)


def test_weights_add_up_to_one_after_a_split():
    image = picture(160, 160, seed=1)
    calls = {"n": 0}

    def once_out_of_memory(window, last):
        calls["n"] += 1
        if calls["n"] == 2:  # the second tile: the rest of the plan is halved, T-junctions appear
            raise InferenceOutOfMemoryError("out of memory", model="m", device="cpu", resource="memory")
        return upscale_nearest(window, last)

    result = run_tiled(image, TiledRun(once_out_of_memory, TilePlan(96, 8, feather=4), scale=2))
    assert len(result.splits) == 1
    np.testing.assert_allclose(result.image, upscale_nearest(image, True), atol=2e-7)


def test_a_seam_is_a_ramp_not_a_step():
    """Tiles that disagree (each adds its own offset): across the seam the result moves in small
    steps over the band instead of jumping once."""
    image = np.zeros((40, 80, 3), np.float32)

    def biased():
        offsets = iter([0.0, 0.5])
        return lambda window, _last: window + next(offsets)

    result = run_tiled(image, TiledRun(biased(), TilePlan((56, 56), 8, feather=8), scale=1)).image[0, :, 0]
    steps = np.diff(result)
    assert result[0] == 0.0 and result[-1] == pytest.approx(0.5)
    assert steps.max() <= 0.5 / 16 + 1e-6  # 16 px band: no single jump
    cropped = run_tiled(image, TiledRun(biased(), TilePlan((56, 56), 8), scale=1))
    assert np.diff(cropped.image[0, :, 0]).max() == pytest.approx(0.5)  # crop: one step


def test_ramp_is_symmetric_across_a_boundary():
    before = ramp(0, 50, 100, 6, 2)  # owned [0, 50): falls across [44, 56)
    after = ramp(50, 100, 100, 6, 2)  # owned [50, 100): rises across the same band
    band_before, band_after = before[-24:], after[:24]
    np.testing.assert_allclose(band_before + band_after, 1.0, atol=1e-7)
    assert before[0] == 1.0 and after[-1] == 1.0  # no band at the image border


def test_feather_needs_the_overlap():
    with pytest.raises(ValueError, match="overlap"):
        run_tiled(picture(20, 20), TiledRun(upscale_nearest, TilePlan(16, 2, feather=4)))


def test_splits_stop_where_owned_spans_keep_their_ramps_apart():
    def always_out_of_memory(window, last):
        raise InferenceOutOfMemoryError("out of memory", model="m", device="cpu", resource="memory")

    with pytest.raises(InferenceOutOfMemoryError):
        run_tiled(picture(300, 300), TiledRun(always_out_of_memory, TilePlan(256, 16, min_tile=32, feather=8)))
    assert feather_floor(16, 8) == 2 * 16 + 4 * 8 + 8


def test_uniform_windows_have_one_shape_and_stay_inside_the_image():
    from lean_image_ai.models.tiles.tile_plan import plan_tiles

    tiles = plan_tiles(1080, 1920, 384, 32, uniform=True)
    assert {t.window_shape for t in tiles} == {(384, 384)}
    assert all(0 <= t.wy0 and t.wy1 <= 1080 and 0 <= t.wx0 and t.wx1 <= 1920 for t in tiles)
    short = plan_tiles(300, 1000, (300 + 64, 384), 32, uniform=True)  # an axis spanned whole: one row
    assert {t.window_shape for t in short} == {(300, 384)} and len({t.y0 for t in short}) == 1
    seen = []
    image = picture(150, 230)
    result = run_tiled(
        image,
        TiledRun(
            lambda w, last: seen.append(w.shape[:2]) or upscale_nearest(w, last),
            TilePlan((150 + 16, 96), 8, feather=4, uniform=True),
            scale=2,
        ),
    )
    assert set(seen) == {(150, 96)}
    np.testing.assert_allclose(result.image, upscale_nearest(image, True), atol=2e-7)
