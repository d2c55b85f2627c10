"""Depth Anything 3 adapter against the real onnxruntime, on small DA3-shaped models."""

import threading

import numpy as np
import pytest
from builders_families import SKY_WEIGHTS, da3_like_model, photo
from lean_image_ai.models.adapters import da3
from lean_image_ai.models.adapters.resampling import cv2_resize
from lean_image_ai.models.imaging import resize
from lean_image_ai.runtime import (
    InvalidImageError,
    InvalidModelOutputError,
    ModelContractError,
    OperationCancelled,
)
from recording import cpu_options as opts

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_STD = np.array([0.229, 0.224, 0.225])
DEPTH_SCALE, DEPTH_OFFSET = 2.0, 3.0
# float32 ORT vs a float64 numpy reference on values of a few units: errors ~1e-6; 1e-4 still
# fails for a wrong resize kernel or normalisation (checked below, differences > 1e-2)
TOL = 1e-4
# fp16 at both model boundaries: ~1e-3 relative on inputs of a few units and on depth ~3..10
TOL_FP16 = 3e-2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("da3")
    return {
        "fixed": da3_like_model(d / "fixed.onnx", fixed_hw=(280, 504)),
        "dynamic": da3_like_model(d / "dynamic.onnx", fixed_hw=None),
        "relu_sky": da3_like_model(d / "relu.onnx", fixed_hw=(28, 42), sky_relu=True),
        "sky_first": da3_like_model(d / "sky_first.onnx", fixed_hw=(28, 42), sky_first=True),
        "depth_rank3": da3_like_model(d / "rank3.onnx", fixed_hw=(28, 42), depth_rank=3, with_sky=False),
        "unnamed": da3_like_model(
            d / "unnamed.onnx", fixed_hw=(28, 42), depth_name="predicted", sky_name="sky_logits"
        ),
        "features": da3_like_model(d / "features.onnx", fixed_hw=(28, 42), extra_multichannel=True),
        "fp16": da3_like_model(d / "fp16.onnx", fixed_hw=None, fp16=True),
        "nan": da3_like_model(d / "nan.onnx", fixed_hw=(28, 42), nan=True),
        "four_channels": da3_like_model(d / "four.onnx", fixed_hw=(28, 42), channels=4),
        "small": da3_like_model(d / "small.onnx", fixed_hw=(28, 42)),
    }


def upstream_resize(image, model_hw, process_res=504):
    """DA3's InputProcessor by hand: the long side to 504, then each side to the model's, cv2's
    cubic where a side grows and area where none does, on uint8 for an 8-bit picture."""
    h, w = image.shape[:2]
    if max(h, w) != process_res:
        scale = process_res / max(h, w)
        step = (max(1, round(h * scale)), max(1, round(w * scale)))
        image = cv2_resize(image, step, "cubic" if scale > 1 else "area")
    if image.shape[:2] != tuple(model_hw):
        grows = model_hw[0] > image.shape[0] or model_hw[1] > image.shape[1]
        image = cv2_resize(image, model_hw, "cubic" if grows else "area")
    return image.astype(np.float64) / 255.0 if image.dtype == np.uint8 else image.astype(np.float64)


def normalised_input(image, model_hw, kernel=None):
    """`kernel`: the pipeline before issue 42 (one antialiased resize on float), for contrast."""
    if kernel is None:
        image = image if image.dtype == np.uint8 else np.clip(np.asarray(image, np.float32), 0, 1)
        resized = upstream_resize(image, model_hw)
    else:
        rgb = np.clip(np.asarray(image, np.float32) / 255.0, 0, 1)
        resized = np.clip(resize(rgb, model_hw, kernel=kernel), 0, 1).astype(np.float64)
    return (resized - IMAGENET_MEAN) / IMAGENET_STD


def reference_depth(rgb, model_hw, kernel=None):
    depth = DEPTH_SCALE * normalised_input(rgb, model_hw, kernel).mean(axis=2) + DEPTH_OFFSET
    return resize(depth.astype(np.float32), np.shape(rgb)[:2], kernel="linear")


def reference_sky(rgb, model_hw, activation):
    """activation: None (logits), "sigmoid", "relu" (DA3's head) or "relu+sigmoid"."""
    sky = normalised_input(rgb, model_hw) @ SKY_WEIGHTS.astype(np.float64)
    if activation and activation.startswith("relu"):
        sky = np.maximum(sky, 0.0)
    if activation and activation.endswith("sigmoid"):
        sky = 1.0 / (1.0 + np.exp(-sky))
    return resize(sky.astype(np.float32), np.shape(rgb)[:2], kernel="linear")


# ---- resize rule and numerics ------------------------------------------------------------------


def test_fixed_shape_model_gets_exactly_its_size(models, runtime, factory):
    image = photo(37, 53)
    result = da3.run(image, models["fixed"], options=opts(runtime))
    assert isinstance(result, da3.DepthResult)
    assert factory.fed == [{"pixel_values": ((1, 3, 280, 504), np.dtype(np.float32))}]
    assert result.model_size == (280, 504)
    assert result.depth.shape == (37, 53) and result.depth.dtype == np.float32
    np.testing.assert_allclose(result.depth, reference_depth(image, (280, 504)), atol=TOL)
    # the one-step antialiased cubic on float this replaced differs measurably
    assert np.abs(reference_depth(image, (280, 504), kernel="cubic") - result.depth).max() > 100 * TOL
    # 53:37 stretched to 504:280 is a 23% aspect change: the user is told
    assert any("stretched" in w for w in result.warnings)


def test_fixed_shape_model_does_not_warn_for_a_matching_aspect(models, runtime):
    result = da3.run(photo(1080, 1920), models["fixed"], options=opts(runtime))
    assert result.depth.shape == (1080, 1920)
    assert result.warnings == []


@pytest.mark.parametrize(
    "source, fed",
    [((1080, 1920), (280, 504)), ((37, 53), (350, 504)), ((53, 37), (504, 350)), ((1, 1), (504, 504))],
)
def test_dynamic_model_long_side_504_in_multiples_of_14(models, runtime, factory, source, fed):
    image = photo(*source, seed=1)
    result = da3.run(image, models["dynamic"], options=opts(runtime))
    assert factory.fed[0]["pixel_values"][0] == (1, 3, *fed)
    assert result.model_size == fed and fed[0] % 14 == 0 and fed[1] % 14 == 0 and max(fed) == 504
    assert result.depth.shape == source
    np.testing.assert_allclose(result.depth, reference_depth(image, fed), atol=TOL)


def test_process_res_and_multiple_are_honoured(models, runtime, factory):
    # 37x53 -> long side 112: 37 * 112 / 53 = 78.2 -> 5 x 16 = 80; 53 -> 112 = 7 x 16
    result = da3.run(photo(37, 53), models["dynamic"], options=opts(runtime), process_res=112, multiple=16)
    assert factory.fed[0]["pixel_values"][0] == (1, 3, 80, 112)
    assert result.model_size == (80, 112)


def test_sky_logits_become_a_probability(models, runtime):
    image = photo(37, 53, seed=2)
    result = da3.run(image, models["fixed"], options=opts(runtime))
    assert set(result.extras) == {"sky"}
    sky = result.extras["sky"]
    assert sky.shape == (37, 53) and sky.dtype == np.float32
    assert 0.0 <= sky.min() and sky.max() <= 1.0
    np.testing.assert_allclose(sky, reference_sky(image, (280, 504), "sigmoid"), atol=TOL)


def test_relu_sky_scores_stay_raw_unless_sigmoid_is_forced(models, runtime):
    image = photo(37, 53, seed=3)
    raw = da3.run(image, models["relu_sky"], options=opts(runtime)).extras["sky"]
    expected = reference_sky(image, (28, 42), "relu")
    assert expected.max() > 1.0  # raw scores above 1 prove no sigmoid was applied
    np.testing.assert_allclose(raw, expected, atol=TOL)
    forced = da3.run(image, models["relu_sky"], options=opts(runtime), sky_activation="sigmoid")
    expected = reference_sky(image, (28, 42), "relu+sigmoid")
    np.testing.assert_allclose(forced.extras["sky"], expected, atol=TOL)


def test_sky_activation_none_keeps_logits(models, runtime):
    image = photo(37, 53, seed=4)
    result = da3.run(image, models["small"], options=opts(runtime), sky_activation="none")
    np.testing.assert_allclose(result.extras["sky"], reference_sky(image, (28, 42), None), atol=TOL)
    assert result.extras["sky"].min() < 0


def test_depth_is_found_by_name_not_position(models, runtime):
    image = photo(20, 30, seed=5)
    result = da3.run(image, models["sky_first"], options=opts(runtime))
    np.testing.assert_allclose(result.depth, reference_depth(image, (28, 42)), atol=TOL)
    assert set(result.extras) == {"sky"}


def test_first_output_is_depth_when_none_is_named_depth(models, runtime):
    image = photo(20, 30, seed=5)
    result = da3.run(image, models["unnamed"], options=opts(runtime))
    np.testing.assert_allclose(result.depth, reference_depth(image, (28, 42)), atol=TOL)
    # a name containing "sky" is enough for the logits -> probability rule
    np.testing.assert_allclose(
        result.extras["sky_logits"], reference_sky(image, (28, 42), "sigmoid"), atol=TOL
    )


def test_rank3_depth_without_sky(models, runtime):
    image = photo(20, 30, seed=6)
    result = da3.run(image, models["depth_rank3"], options=opts(runtime))
    np.testing.assert_allclose(result.depth, reference_depth(image, (28, 42)), atol=TOL)
    assert result.extras == {}


def test_multichannel_output_is_skipped_with_a_warning(models, runtime):
    result = da3.run(photo(20, 30), models["features"], options=opts(runtime))
    assert set(result.extras) == {"sky"}
    assert any("'features'" in w and "not a single-channel map" in w for w in result.warnings)


def test_fp16_model_gets_float16_feeds(models, runtime, factory):
    image = photo(37, 53, seed=7)
    result = da3.run(image, models["fp16"], options=opts(runtime))
    assert factory.fed[0]["pixel_values"] == ((1, 3, 350, 504), np.dtype(np.float16))
    assert result.depth.dtype == np.float32 and result.extras["sky"].dtype == np.float32
    np.testing.assert_allclose(result.depth, reference_depth(image, (350, 504)), atol=TOL_FP16)


# ---- image formats -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [
        photo(37, 53, channels=4),
        photo(37, 53)[:, :, 0],
        photo(37, 53, dtype=np.uint16),
        photo(1, 1),
        photo(37, 53, dtype=np.float32) * 5.0,  # HDR floats
    ],
    ids=["rgba", "grey", "uint16", "1x1", "hdr_float"],
)
def test_every_supported_format_comes_back_at_source_resolution(models, runtime, image):
    result = da3.run(image, models["small"], options=opts(runtime))
    h, w = image.shape[:2]
    assert result.depth.shape == (h, w) and result.extras["sky"].shape == (h, w)
    assert np.isfinite(result.depth).all()


def test_rgba_alpha_does_not_change_depth(models, runtime):
    rgba = photo(37, 53, channels=4, seed=8)
    with_alpha = da3.run(rgba, models["small"], options=opts(runtime)).depth
    without = da3.run(np.ascontiguousarray(rgba[:, :, :3]), models["small"], options=opts(runtime)).depth
    np.testing.assert_array_equal(with_alpha, without)


def test_uint16_matches_reference(models, runtime):
    image = photo(37, 53, dtype=np.uint16, seed=9)
    result = da3.run(image, models["small"], options=opts(runtime))
    np.testing.assert_allclose(result.depth, reference_depth(image / 65535.0, (28, 42)), atol=TOL)


def test_zero_pixel_image_is_rejected(models, runtime):
    with pytest.raises(InvalidImageError, match="no pixels"):
        da3.run(np.zeros((4, 0), np.uint8), models["small"], options=opts(runtime))


# ---- bad models and arguments ------------------------------------------------------------------


def test_nan_depth_raises_and_returns_nothing(models, runtime):
    with pytest.raises(InvalidModelOutputError, match="NaN"):
        da3.run(photo(9, 11), models["nan"], options=opts(runtime))


def test_wrong_channel_count_names_expected_and_found(models, runtime, factory):
    with pytest.raises(ModelContractError) as info:
        da3.run(photo(9, 11), models["four_channels"], options=opts(runtime))
    message = str(info.value)
    assert "expected 3 channels" in message and "found 4" in message and "Depth Anything 3" in message
    assert factory.fed == []


def test_bad_arguments_are_rejected_before_loading(models, runtime, factory):
    with pytest.raises(ValueError, match="sky_activation"):
        da3.run(photo(), models["small"], options=opts(runtime), sky_activation="softmax")
    with pytest.raises(ValueError, match="positive"):
        da3.run(photo(), models["small"], options=opts(runtime), multiple=0)
    assert factory.sessions == []


# ---- operations: frames, release, reuse, cancel, progress --------------------------------------


def test_frames_are_one_operation_and_only_the_final_run_releases(models, runtime, factory):
    frames = [photo(20, 30, seed=s) for s in range(3)]
    results = da3.run(frames, models["small"], options=opts(runtime))
    assert len(results) == 3
    for frame, result in zip(frames, results, strict=True):
        np.testing.assert_allclose(result.depth, reference_depth(frame, (28, 42)), atol=TOL)
    (session,) = factory.sessions
    assert session.shrink_entries[:2] == ["", ""] and session.shrink_entries[2] != ""
    da3.run(frames[:2], models["small"], options=opts(runtime))
    assert len(factory.sessions) == 1 and runtime.sessions_created == 1
    assert session.shrink_entries[3] == "" and session.shrink_entries[4] != ""
    ends = runtime.events.recent("operation_end")
    assert [(e["operation"], e["outcome"]) for e in ends] == [("depth", "success")] * 2


def test_cancel_after_first_frame_stops_before_the_second_run(models, runtime, factory):
    cancel = threading.Event()

    def progress(fraction, stage):
        if stage == "postprocessing":
            cancel.set()

    with pytest.raises(OperationCancelled):
        da3.run(
            [photo(seed=1), photo(seed=2)],
            models["small"],
            options=opts(runtime, cancel=cancel, progress=progress),
        )
    assert len(factory.fed) == 1
    assert runtime.events.recent("operation_end")[-1]["outcome"] == "cancelled"


def test_progress_reports_stages_in_order(models, runtime):
    reports = []
    da3.run(
        [photo(seed=1), photo(seed=2)],
        models["small"],
        options=opts(runtime, progress=lambda f, s: reports.append((f, s))),
    )
    assert [s for _, s in reports] == [
        "preprocessing", "frame 1/2", "postprocessing",
        "preprocessing", "frame 2/2", "postprocessing",
        "done",
    ]  # fmt: skip
    fractions = [f for f, _ in reports]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0


def test_dynamic_model_never_warns_about_stretching(models, runtime):
    # 1x20 rounds to 28x504: an 11% aspect change from rounding to 14, not from a fixed size
    result = da3.run(photo(1, 20), models["dynamic"], options=opts(runtime))
    assert result.model_size == (28, 504) and result.warnings == []


# (height, width) -> model (height, width) by Depth Anything 3's `upper_bound_resize` at 504 / 14:
# step 1 rounds each scaled side to an integer (halves to even), step 2 to the nearest multiple of
# 14 with ties up (computed by hand from upstream's _resize_longest_side/_make_divisible_by_resize)
UPSTREAM_SIZES = [
    ((128, 16), (504, 70)),  # 63 -> tie -> 70 (one-step half-to-even rounding gave 56)
    ((35, 504), (42, 504)),  # long side already 504: no step 1; 35 is a tie -> 42
    ((376, 504), (378, 504)),
    ((1080, 1920), (280, 504)),  # 283.5 -> 284 -> 280
    ((2160, 3840), (280, 504)),
    ((480, 640), (378, 504)),
    ((100, 700), (70, 504)),
    ((504, 504), (504, 504)),
    ((1000, 1), (504, 14)),  # upstream keeps a side of 1 here; a ViT needs at least one patch
]


@pytest.mark.parametrize("source,expected", UPSTREAM_SIZES)
def test_model_size_follows_upstreams_two_step_rule(source, expected):
    from lean_image_ai.models.imaging import fit_multiple

    assert fit_multiple(source[0], source[1], 504, 14) == expected


def test_letterbox_keeps_the_aspect_in_a_fixed_input_and_crops_the_depth_back(models, runtime, factory):
    image = photo(37, 53, seed=3)
    result = da3.run(image, models["fixed"], options=opts(runtime), fixed_fit="letterbox")
    assert factory.fed == [{"pixel_values": ((1, 3, 280, 504), np.dtype(np.float32))}]
    # 53:37 into 504:280: 280 rows by round(53 * 280 / 37) = 401 columns, centred (51 left, 52 right)
    np.testing.assert_allclose(result.depth, reference_depth(image, (280, 401)), atol=TOL)
    assert result.model_size == (280, 504)
    assert any("401x280" in w and "aspect kept" in w and "letterbox" in w for w in result.warnings)
    stretched = da3.run(image, models["fixed"], options=opts(runtime))  # the default, closer to upstream
    np.testing.assert_allclose(stretched.depth, reference_depth(image, (280, 504)), atol=TOL)
    # a per-pixel model shows the two only through resampling: small, but 10 tolerances apart
    assert np.abs(stretched.depth - result.depth).max() > 10 * TOL
    assert any("stretched" in w and "fixed_fit='stretch'" in w for w in stretched.warnings)


def test_a_fit_other_than_letterbox_or_stretch_is_refused(models, runtime, factory):
    with pytest.raises(ValueError, match="fixed_fit must be one of"):
        da3.run(photo(37, 53), models["fixed"], options=opts(runtime), fixed_fit="crop")
    assert factory.fed == []
