"""models/tiles/tile_plan.py and tiling.py: planning, reflect context, seam-free assembly, last-run marking, split on OOM.

Tolerance for tiled == untiled: atol 1e-5 on outputs of magnitude ~1. Every output pixel sees the
same inputs with the same weights in both runs (overlap >= receptive radius); only the float32
summation order can differ, because ORT picks conv blocking (NCHWc, GEMM tiles) per input shape.
A sum of <= 72 products of O(1) terms differs by a few ulps (~1e-7 each) in another order, so
1e-5 is loose enough for that and ~100x tighter than a real seam (an overlap one pixel short of
the receptive field changes seam pixels by > 1e-3, checked below). Measured on the CPU provider
here the difference is exactly 0.0; the margin is for providers that pick kernels per shape.
"""

from __future__ import annotations

import numpy as np
import pytest
from builders_upscale import resize_model
from lean_image_ai.models.adapters.upscale import DEFAULT_MODEL_PATH
from lean_image_ai.models.imaging import from_nchw, to_nchw
from lean_image_ai.models.tiles import tiling
from lean_image_ai.models.tiles.tile_plan import Tile, TilePlan, cut_window, plan_tiles, reflect_indices
from lean_image_ai.models.tiles.tiling import (
    TiledRun,
    auto_tile_size,
    estimate_bytes_per_pixel,
    run_tiled,
    tile_floor,
)
from lean_image_ai.runtime import Runtime
from lean_image_ai.runtime.errors import InferenceOutOfMemoryError, ModelContractError
from onnx_builders import sr_model

ATOL = 1e-5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiling-models")
    return {
        "dynamic": sr_model(folder / "sr.onnx", scale=2, mid_channels=8, seed=3),
        "fixed": sr_model(folder / "sr64.onnx", scale=2, mid_channels=8, seed=3, tile=64),
        "x4": sr_model(folder / "sr4.onnx", scale=4, mid_channels=8, seed=5),
    }


@pytest.fixture(scope="module")
def runtime():
    rt = Runtime()
    yield rt
    rt.clear("test teardown")


def image(height, width, seed=0):
    return np.random.default_rng(seed).random((height, width, 3), dtype=np.float32)


def model_fn(runtime, model, op):
    handle = op.session(model, "cpu")
    name_in, name_out = handle.inputs[0].name, handle.outputs[0].name

    def run_tile(window, last):
        return from_nchw(op.run(handle, {name_in: to_nchw(window)}, last=last)[name_out])

    return run_tile


def untiled_reference(runtime, model, picture, overlap=0, pad_to=None):
    """The definition of "untiled": one run on the image itself (the overlap plays no part).

    `pad_to` (h, w): reflect-pad at the bottom/right first, as a fixed-shape model's window is
    when the image is smaller than it, and crop the result back.
    """
    height, width = picture.shape[:2]
    if pad_to is not None:
        pads = ((0, max(0, pad_to[0] - height)), (0, max(0, pad_to[1] - width)), (0, 0))
        picture = np.pad(picture, pads, mode="reflect")
    with runtime.operation("reference") as op:
        handle = op.session(model, "cpu")
        out = from_nchw(op.run(handle, {"input": to_nchw(picture)}, last=True)["output"])
    scale = out.shape[0] // picture.shape[0]
    return out[: height * scale, : width * scale]


def tiled(runtime, model, picture, tile_size, overlap, fixed=False):
    with runtime.operation("tiled") as op:
        return run_tiled(picture, TiledRun(model_fn(runtime, model, op), TilePlan(tile_size, overlap, fixed=fixed)))


# ---- planning ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "height,width,tile,overlap,fixed",
    [(37, 53, 20, 2, False), (100, 64, 48, 16, False), (5, 3, 64, 16, True), (130, 129, 64, 16, True)],
)
def test_owned_regions_partition_the_image_and_windows_hold_the_overlap(height, width, tile, overlap, fixed):
    tiles = plan_tiles(height, width, tile, overlap, fixed=fixed)
    cover = np.zeros((height, width), np.int32)
    for t in tiles:
        cover[t.y0 : t.y1, t.x0 : t.x1] += 1
        # the overlap, clipped to the image (the model's own border handling applies there)
        assert t.wy0 <= max(0, t.y0 - overlap) and t.wx0 <= max(0, t.x0 - overlap)
        assert t.wy1 >= min(height, t.y1 + overlap) and t.wx1 >= min(width, t.x1 + overlap)
        assert t.wy0 >= 0 and t.wx0 >= 0  # only a fixed size reaches past the bottom/right
        if fixed:
            assert t.window_shape == (tile, tile)
        else:
            assert max(t.window_shape) <= tile
    assert (cover == 1).all()


def test_untiled_plan_is_one_window_over_the_image_itself():
    (only,) = plan_tiles(37, 53, None, 4)
    assert only == Tile(0, 0, 37, 53, 0, 0, 37, 53)
    (grown,) = plan_tiles(37, 53, None, 4, multiple=8)  # only the multiple is reflected
    assert grown == Tile(0, 0, 37, 53, 0, 0, 40, 56)


def test_windows_are_grown_to_a_multiple():
    for t in plan_tiles(37, 53, 24, 3, multiple=8):
        assert t.window_shape[0] % 8 == 0 and t.window_shape[1] % 8 == 0


def test_tile_without_room_inside_the_overlap_is_refused():
    with pytest.raises(ValueError, match="overlap"):
        plan_tiles(10, 10, 32, 16)


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_reflect_indices_match_numpy_reflect_padding_even_past_the_size(size):
    values = np.arange(size)
    for pad in (0, 1, 5, 17):
        expected = np.pad(values, (pad, pad + 3), mode="reflect")
        assert (values[reflect_indices(-pad, size + pad + 3, size)] == expected).all()


def test_cut_window_equals_slicing_the_reflect_padded_image():
    picture = image(9, 6)
    padded = np.pad(picture, ((20, 20), (20, 20), (0, 0)), mode="reflect")
    for t in (
        Tile(0, 0, 9, 6, -20, -20, 29, 26),
        Tile(2, 1, 5, 4, 1, 0, 7, 5),
        Tile(0, 0, 1, 1, -3, 2, 15, 8),
    ):
        expected = padded[t.wy0 + 20 : t.wy1 + 20, t.wx0 + 20 : t.wx1 + 20]
        np.testing.assert_array_equal(cut_window(picture, t), expected)


# ---- tiled == untiled on real models ------------------------------------------------------------


@pytest.mark.parametrize("height,width", [(37, 53), (64, 64), (7, 10)])
@pytest.mark.parametrize("tile_size,overlap", [(20, 2), (48, 16), (16, 4)])
def test_tiled_equals_untiled_on_a_conv_sr_model(runtime, models, height, width, tile_size, overlap):
    picture = image(height, width, seed=height)
    reference = untiled_reference(runtime, models["dynamic"], picture, overlap)
    result = tiled(runtime, models["dynamic"], picture, tile_size, overlap)
    assert result.scale == 2 and result.image.shape == (2 * height, 2 * width, 3)
    if height > tile_size:  # the smaller-than-a-tile case is one window, that is the point of it
        assert result.tiles_run > 1
    np.testing.assert_allclose(result.image, reference, rtol=0, atol=ATOL)
    assert np.abs(reference).max() > 0.1  # the comparison is not between two near-zero images


def test_an_overlap_below_the_receptive_field_shows_seams(runtime, models):
    picture = image(37, 53, seed=1)
    reference = untiled_reference(runtime, models["dynamic"], picture, 1)
    result = tiled(runtime, models["dynamic"], picture, 12, 1)
    assert np.abs(result.image - reference).max() > 1e-3


def test_tiled_equals_untiled_at_4x(runtime, models):
    picture = image(33, 41, seed=4)
    reference = untiled_reference(runtime, models["x4"], picture, 4)
    result = tiled(runtime, models["x4"], picture, 16, 4)
    assert result.scale == 4 and result.tiles_run > 4
    np.testing.assert_allclose(result.image, reference, rtol=0, atol=ATOL)


@pytest.mark.parametrize("height,width", [(37, 53), (100, 70), (5, 9)])
def test_fixed_shape_model_gets_exactly_its_size_and_matches_the_dynamic_twin(runtime, models, height, width):
    # same seed -> same weights: the fixed 64x64 export and the dynamic one are the same network
    picture = image(height, width, seed=7)
    seen = []
    with runtime.operation("fixed") as op:
        run_tile = model_fn(runtime, models["fixed"], op)

        def recording(window, last):
            seen.append(window.shape[:2])
            return run_tile(window, last)

        result = run_tiled(picture, TiledRun(recording, TilePlan(64, 16, fixed=True)))
    assert set(seen) == {(64, 64)}
    reference = untiled_reference(runtime, models["dynamic"], picture, pad_to=(64, 64))
    np.testing.assert_allclose(result.image, reference, rtol=0, atol=ATOL)


def test_tiled_equals_untiled_on_the_embedded_bicubic_model(runtime):
    # Resize cubic reads 2 input pixels each side: receptive radius 2
    picture = image(45, 38, seed=9)
    reference = untiled_reference(runtime, DEFAULT_MODEL_PATH, picture, 2)
    result = tiled(runtime, DEFAULT_MODEL_PATH, picture, 16, 2)
    assert result.tiles_run > 4
    np.testing.assert_allclose(result.image, reference, rtol=0, atol=ATOL)


# ---- last-run marking and split on OOM (plain numpy tile functions) ---------------------------


def nearest_x2(window):
    return np.repeat(np.repeat(window, 2, axis=0), 2, axis=1)


class Recorder:
    """A tile function: nearest x2, and an out-of-memory error for windows larger than `limit`."""

    def __init__(self, limit=None, always_oom=False):
        self.limit = limit
        self.always_oom = always_oom
        self.calls = []  # (window shape, last, succeeded)

    def __call__(self, window, last):
        too_big = self.always_oom or (self.limit is not None and max(window.shape[:2]) > self.limit)
        self.calls.append((window.shape[:2], last, not too_big))
        if too_big:
            raise InferenceOutOfMemoryError(
                "Out of system memory", model="m", device="CPU", resource="system memory"
            )
        return nearest_x2(window)


def test_only_the_final_tile_of_the_final_image_is_marked_last():
    recorder = Recorder()
    frames = [image(40, 50, seed=s) for s in range(3)]
    for index, frame in enumerate(frames):
        run_tiled(frame, TiledRun(recorder, TilePlan(20, 2), last=index == 2))
    flags = [last for _shape, last, _ok in recorder.calls]
    assert len(flags) > 3 * 4 and flags[-1] is True and sum(flags) == 1


def test_split_on_oom_halves_keeps_done_tiles_and_marks_the_new_final_tile():
    picture = image(70, 90, seed=2)
    recorder = Recorder(limit=32)
    from lean_image_ai.runtime.log.events import EventLog

    events, splits_seen = EventLog(), []
    reports = []
    result = run_tiled(
        picture,
        TiledRun(
            recorder,
            TilePlan(None, 4),  # one window over the whole image first: too big
            events=events,
            label="m.onnx",
            on_split=lambda size, exc: splits_seen.append((size, exc.resource)),
            progress=lambda *a: reports.append(a),
        ),
    )
    # the owned regions of the tiles that ran add up to the image, once
    assert reports[-1][0] == 1.0 and all(r[0] <= 1.0 for r in reports)
    np.testing.assert_array_equal(result.image, nearest_x2(picture))
    split_events = events.recent("tile_split")
    assert [(e["old_tile_size"], e["new_tile_size"]) for e in split_events] == [(90, 45), (45, 32)]
    assert all(e["model"] == "m.onnx" and e["reason"] == "out_of_memory" for e in split_events)
    assert [s for s, _ in splits_seen] == [(45, 45), (32, 32)]
    assert result.splits == [{k: v for k, v in e.items() if k not in ("event", "time")} for e in split_events]
    assert max(result.tile_size) == 32
    # every successful tile was run once: a region already done is never run again
    done = [shape for shape, _last, ok in recorder.calls if ok]
    assert result.tiles_run == len(done) and sum(not ok for *_, ok in recorder.calls) == 2
    flags = [last for _shape, last, ok in recorder.calls]
    assert flags[0] is True  # the untiled attempt was the final tile of its plan...
    assert flags[-1] is True and sum(flags[1:]) == 1  # ...and after the splits only the new final one is


def test_split_after_some_tiles_were_done_continues_from_there():
    picture = image(64, 64, seed=5)
    recorder = Recorder()
    calls_before_oom = 3

    def flaky(window, last):
        # the 4th call runs out of memory once; tiles 1-3 are kept
        if len(recorder.calls) == calls_before_oom and max(window.shape[:2]) > 24:
            recorder.calls.append((window.shape[:2], last, False))
            raise InferenceOutOfMemoryError("oom", model="m", device="CPU", resource="system memory")
        return recorder(window, last)

    reports = []
    result = run_tiled(picture, TiledRun(flaky, TilePlan(40, 4, min_tile=16), progress=lambda *a: reports.append(a)))
    np.testing.assert_array_equal(result.image, nearest_x2(picture))
    shapes = [shape for shape, _last, _ok in recorder.calls]
    # 2x2 tiles of 32 owned + 4 of overlap on the inner sides (clipped at the image border)
    assert all(s == (36, 36) for s in shapes[:4]) and all(max(s) <= 20 for s in shapes[4:])
    # only the failed tile's 32x32 region was planned again: 3x3 tiles of 20 (12 owned + 2 x 4)
    assert len(shapes) - 4 == 9 and result.tiles_run == 3 + 9
    assert reports[-1] == (1.0, 12, 12) and all(r[0] <= 1.0 for r in reports)
    # the failed 4th call was the final tile of the first plan; after the split only the new final one is
    assert [last for _s, last, _ok in recorder.calls].index(True) == 3
    assert sum(last for _s, last, ok in recorder.calls if ok) == 1 and recorder.calls[-1][1]


def test_split_stops_at_the_floor_and_re_raises_the_readable_error():
    from lean_image_ai.runtime.log.events import EventLog

    recorder, events = Recorder(always_oom=True), EventLog()
    with pytest.raises(InferenceOutOfMemoryError, match="Out of system memory"):
        run_tiled(image(200, 200), TiledRun(recorder, TilePlan(100, 8, min_tile=32), events=events))
    # halved down to the floor (32, or 2 * overlap + 8), which is tried once
    assert [(e["old_tile_size"], e["new_tile_size"]) for e in events.recent("tile_split")] == [
        (100, 50),
        (50, 32),
    ]
    tried = [max(shape) for shape, *_ in recorder.calls]
    assert len(tried) == 3 and all(t <= size for t, size in zip(tried, [100, 50, 32], strict=True))


def test_fixed_shape_models_do_not_split():
    recorder = Recorder(always_oom=True)
    with pytest.raises(InferenceOutOfMemoryError):
        run_tiled(image(100, 100), TiledRun(recorder, TilePlan(64, 8, fixed=True)))
    assert len(recorder.calls) == 1


def test_non_integer_scale_from_the_first_tile_is_a_contract_error(tmp_path, runtime):
    model = resize_model(tmp_path / "x1_5.onnx", factor=1.5)
    with pytest.raises(ModelContractError, match="whole-number scale"):
        tiled(runtime, model, image(20, 20), 16, 2)


def test_progress_reports_area_and_the_current_plan():
    reports = []
    run_tiled(image(30, 30), TiledRun(Recorder(), TilePlan(19, 2), progress=lambda *a: reports.append(a)))
    assert reports[-1] == (1.0, len(reports), len(reports))
    assert all(b[0] > a[0] for a, b in zip(reports, reports[1:], strict=False))


# ---- tile size from a memory budget -------------------------------------------------------------


def test_auto_tile_size_follows_the_budget_and_the_per_pixel_estimate():
    cost = estimate_bytes_per_pixel(4)
    assert cost == 4 * 64 * (3 + 32)
    assert estimate_bytes_per_pixel(4, element_size=2) == cost // 2
    size = auto_tile_size(cost, budget_bytes=512 << 20, overlap=16)
    expected = int(np.sqrt((512 << 20) * tiling.BUDGET_FRACTION / cost)) // 16 * 16
    assert size == expected and size % 16 == 0
    assert auto_tile_size(cost, budget_bytes=2048 << 20, overlap=16) == pytest.approx(2 * size, abs=16)
    # free VRAM loses the GPU reserve first
    vram = auto_tile_size(cost, free_vram_bytes=(512 << 20) + tiling.GPU_RESERVE_BYTES, overlap=16)
    assert vram == size
    # never below the floor, never above the cap
    assert auto_tile_size(cost, budget_bytes=1, overlap=16) == tile_floor(16) == 40
    assert auto_tile_size(1, budget_bytes=1 << 40) == tiling.MAX_AUTO_TILE


def test_auto_tile_size_from_free_system_memory_is_bounded():
    size = auto_tile_size(estimate_bytes_per_pixel(2), overlap=16)
    assert tile_floor(16) <= size <= tiling.MAX_AUTO_TILE


def test_a_large_tile_is_pasted_in_bands_on_threads_like_one_pass(monkeypatch):
    from lean_image_ai.models.tiles import paste

    monkeypatch.setattr(paste, "_paste_workers", lambda: 3)  # whatever this machine's core count
    rows = 3 * paste.PASTE_BAND_ROWS + 40  # three bands, the last one uneven
    planes = np.random.default_rng(4).random((1, 3, rows, 24), dtype=np.float32) * 1.5 - 0.25

    def run_tile(window, last):
        return planes

    result = run_tiled(np.zeros((rows, 24, 3), np.float32), TiledRun(run_tile, TilePlan(None, 0), clip=(0.0, 1.0)))
    np.testing.assert_array_equal(result.image, np.clip(planes[0].transpose(1, 2, 0), 0.0, 1.0))

    planes[0, 1, rows - 5, 3] = np.nan  # in the last band only
    seen = []
    run_tiled(np.zeros((rows, 24, 3), np.float32), TiledRun(run_tile, TilePlan(None, 0), not_finite=seen.append))
    assert len(seen) == 1 and seen[0] is planes
