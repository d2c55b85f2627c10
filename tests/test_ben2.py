"""BEN2 adapter against the real onnxruntime, on small BEN2-shaped models with known outputs."""

import threading

import numpy as np
import pytest
from builders_families import ben2_like_model, photo
from lean_image_ai.models.adapters import ben2
from lean_image_ai.models.adapters.resampling import pil_lanczos, torch_bilinear
from lean_image_ai.models.imaging import resize
from lean_image_ai.runtime import (
    InvalidImageError,
    InvalidModelOutputError,
    ModelContractError,
    OperationCancelled,
)
from PIL import Image
from recording import cpu_options as opts

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_STD = np.array([0.229, 0.224, 0.225])
SCALE = 4.0
# float32 ORT vs a float64 numpy reference; the min-max step divides by the output's spread
# (about 0.3 here), so errors of a few 1e-7 grow to ~1e-6. 1e-4 leaves margin and still fails
# for a wrong resize kernel or normalisation (checked below, differences > 1e-2).
TOL = 1e-4
# fp16 at both model boundaries: ~1e-3 relative on the input, again on the output, x 1/spread
TOL_FP16 = 1e-2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("ben2")
    return {
        "fixed": ben2_like_model(d / "fixed.onnx", size=64, scale=SCALE),
        "dynamic": ben2_like_model(d / "dynamic.onnx", fixed=False, scale=SCALE),
        "fp16": ben2_like_model(d / "fp16.onnx", size=1024, fp16=True, scale=SCALE),
        "const_high": ben2_like_model(d / "const_high.onnx", output="constant", constant=0.8),
        "const_low": ben2_like_model(d / "const_low.onnx", output="constant", constant=0.2),
        "nan": ben2_like_model(d / "nan.onnx", output="nan"),
        "four_channels": ben2_like_model(d / "four.onnx", channels=4),
        "rank3_input": ben2_like_model(d / "rank3.onnx", input_rank=3),
        "decoy_first": ben2_like_model(d / "decoy.onnx", extra_first_output=True, scale=SCALE),
        "rank3_output": ben2_like_model(d / "rank3_out.onnx", output_rank=3, scale=SCALE),
    }


def reference_matte(image, model_hw, *, mean=IMAGENET_MEAN, std=IMAGENET_STD, kernel=None, scale=SCALE):
    """What the adapter must compute for a ben2_like_model (sigmoid of the scaled channel mean),
    through BEN2's own steps: Pillow's LANCZOS on the 8-bit picture, the model, the raw matte
    bilinear (no antialias) to the source size, min-max last. `kernel`: the pipeline before issue
    42 (one float resize in, min-max, a cubic resize out), for contrast."""
    if kernel is not None:
        rgb = np.clip(np.asarray(image, np.float32) / 255.0, 0, 1)
        resized = np.clip(resize(rgb, model_hw, kernel=kernel), 0, 1).astype(np.float64)
    elif image.dtype == np.uint8:
        pil = Image.fromarray(image).resize((model_hw[1], model_hw[0]), Image.LANCZOS)
        resized = np.asarray(pil).astype(np.float64) / 255.0
    else:
        resized = np.clip(pil_lanczos(np.clip(image.astype(np.float32), 0, 1), model_hw), 0, 1).astype(
            np.float64
        )
    raw = 1.0 / (1.0 + np.exp(-scale * ((resized - mean) / std).mean(axis=2)))
    if kernel is not None:
        matte = (raw - raw.min()) / (raw.max() - raw.min())
        return np.clip(resize(matte.astype(np.float32), image.shape[:2], kernel="cubic"), 0, 1)
    raw = torch_bilinear(raw.astype(np.float32), image.shape[:2], antialias=False).astype(np.float64)
    return (raw - raw.min()) / (raw.max() - raw.min())


# ---- numerics ----------------------------------------------------------------------------------


def test_matte_matches_reference_at_odd_source_size(models, runtime):
    image = photo(37, 53)
    result = ben2.run(image, models["fixed"], options=opts(runtime))
    assert isinstance(result, ben2.MatteResult)
    assert result.matte.shape == (37, 53) and result.matte.dtype == np.float32
    assert result.rgba.shape == (37, 53, 4) and result.rgba.dtype == np.float32
    assert 0.0 <= result.matte.min() and result.matte.max() <= 1.0
    expected = reference_matte(image, (64, 64))
    np.testing.assert_allclose(result.matte, expected, atol=TOL)
    # the comparison is sensitive enough to catch the float lanczos in and cubic out it replaced
    wrong_kernel = reference_matte(image, (64, 64), kernel="lanczos3")
    assert np.abs(wrong_kernel - result.matte).max() > 100 * TOL
    assert result.warnings == []


def test_plain_255_normalisation_is_mean_0_std_1(models, runtime):
    image = photo(40, 30, seed=3)
    plain = ben2.run(image, models["fixed"], options=opts(runtime), mean=(0, 0, 0), std=(1, 1, 1))
    expected = reference_matte(image, (64, 64), mean=np.zeros(3), std=np.ones(3))
    np.testing.assert_allclose(plain.matte, expected, atol=TOL)
    imagenet = ben2.run(image, models["fixed"], options=opts(runtime))
    assert np.abs(imagenet.matte - plain.matte).max() > 100 * TOL
    none = ben2.run(image, models["fixed"], options=opts(runtime), mean=None, std=None)
    np.testing.assert_array_equal(none.matte, plain.matte)


def test_matte_output_is_found_when_it_is_not_the_first_output(models, runtime):
    image = photo(20, 24, seed=1)
    result = ben2.run(image, models["decoy_first"], options=opts(runtime))
    np.testing.assert_allclose(result.matte, reference_matte(image, (64, 64)), atol=TOL)


def test_rank3_matte_output_is_accepted(models, runtime):
    image = photo(20, 24, seed=1)
    result = ben2.run(image, models["rank3_output"], options=opts(runtime))
    np.testing.assert_allclose(result.matte, reference_matte(image, (64, 64)), atol=TOL)


def test_fp16_model_gets_float16_feeds_and_works(models, runtime, factory):
    image = photo(37, 53, seed=2)
    result = ben2.run(image, models["fp16"], options=opts(runtime))
    (feed,) = factory.fed
    assert feed == {"input": ((1, 3, 1024, 1024), np.dtype(np.float16))}
    assert result.matte.shape == (37, 53) and result.matte.dtype == np.float32
    expected = reference_matte(image, (1024, 1024))
    np.testing.assert_allclose(result.matte, expected, atol=TOL_FP16)


# ---- input size --------------------------------------------------------------------------------


def test_fixed_model_size_wins_over_input_size(models, runtime, factory):
    ben2.run(photo(10, 10), models["fixed"], options=opts(runtime), input_size=128)
    assert factory.fed[0]["input"] == ((1, 3, 64, 64), np.dtype(np.float32))


@pytest.mark.parametrize("input_size, fed", [((40, 56), (40, 56)), (48, (48, 48)), (None, (1024, 1024))])
def test_dynamic_model_uses_input_size_or_1024(models, runtime, factory, input_size, fed):
    image = photo(30, 20, seed=4)
    result = ben2.run(image, models["dynamic"], options=opts(runtime), input_size=input_size)
    assert factory.fed[0]["input"][0] == (1, 3, *fed)
    assert result.matte.shape == (30, 20)
    np.testing.assert_allclose(result.matte, reference_matte(image, fed), atol=TOL)


# ---- image formats -----------------------------------------------------------------------------


def test_alpha_is_matte_times_source_alpha_exactly(models, runtime):
    image = photo(37, 53, channels=4, seed=5)
    result = ben2.run(image, models["fixed"], options=opts(runtime))
    source_alpha = image[:, :, 3].astype(np.float32) / 255.0
    np.testing.assert_array_equal(result.rgba[:, :, 3], result.matte * source_alpha)
    np.testing.assert_array_equal(result.rgba[:, :, :3], image[:, :, :3].astype(np.float32) / 255.0)
    # the matte itself ignores the source alpha (the model sees RGB only)
    np.testing.assert_allclose(
        result.matte, reference_matte(np.ascontiguousarray(image[:, :, :3]), (64, 64)), atol=TOL
    )


@pytest.mark.parametrize(
    "image",
    [
        photo(37, 53)[:, :, 0],  # grey
        np.dstack([photo(37, 53)[:, :, :1], photo(37, 53, seed=9)[:, :, :1]]),  # grey + alpha
        photo(37, 53, dtype=np.uint16),
        photo(37, 53, dtype=np.float32) * 4.0,  # HDR floats
        photo(1, 1, channels=4),
    ],
    ids=["grey", "grey_alpha", "uint16", "hdr_float", "1x1_rgba"],
)
def test_every_supported_format_comes_back_at_source_resolution(models, runtime, image):
    result = ben2.run(image, models["fixed"], options=opts(runtime))
    h, w = image.shape[:2]
    assert result.matte.shape == (h, w) and result.rgba.shape == (h, w, 4)
    assert np.isfinite(result.rgba).all()
    assert 0.0 <= result.matte.min() and result.matte.max() <= 1.0


def test_uint16_matches_the_same_picture_in_uint8(models, runtime):
    image16 = photo(37, 53, dtype=np.uint16)
    result = ben2.run(image16, models["fixed"], options=opts(runtime))
    np.testing.assert_allclose(result.matte, reference_matte(image16 / 65535.0, (64, 64)), atol=TOL)


def test_zero_pixel_image_is_rejected(models, runtime):
    with pytest.raises(InvalidImageError, match="no pixels"):
        ben2.run(np.zeros((0, 5, 3), np.uint8), models["fixed"], options=opts(runtime))


def test_nan_pixels_are_replaced_with_a_warning(models, runtime):
    image = photo(12, 12, dtype=np.float32)
    image[3, 4, 1] = np.nan
    result = ben2.run(image, models["fixed"], options=opts(runtime))
    assert np.isfinite(result.matte).all()
    assert any("NaN" in w for w in result.warnings)


# ---- bad models --------------------------------------------------------------------------------


@pytest.mark.parametrize("constant, expected", [(0.8, 1.0), (0.2, 0.0)])
def test_constant_output_is_all_kept_or_all_removed_with_a_warning(models, runtime, constant, expected):
    model = models["const_high" if constant > 0.5 else "const_low"]
    result = ben2.run(photo(9, 11, channels=4), model, options=opts(runtime))
    assert np.isfinite(result.matte).all()
    np.testing.assert_array_equal(result.matte, np.full((9, 11), expected, np.float32))
    assert len(result.warnings) == 1 and "constant matte" in result.warnings[0]


def test_nan_output_raises_and_returns_nothing(models, runtime):
    with pytest.raises(InvalidModelOutputError, match="NaN"):
        ben2.run(photo(9, 11), models["nan"], options=opts(runtime))


@pytest.mark.parametrize(
    "model, expected, found",
    [("four_channels", "expected 3 channels", "found 4"), ("rank3_input", "expected rank 4", "found shape")],
)
def test_wrong_contract_names_expected_and_found(models, runtime, factory, model, expected, found):
    with pytest.raises(ModelContractError) as info:
        ben2.run(photo(9, 11), models[model], options=opts(runtime))
    message = str(info.value)
    assert expected in message and found in message and "BEN2" in message
    assert factory.fed == []  # rejected before any run


# ---- operations: frames, release, reuse, cancel, progress --------------------------------------


def test_frames_are_one_operation_and_only_the_final_run_releases(models, runtime, factory):
    frames = [photo(20, 30, seed=s) for s in range(3)]
    results = ben2.run(frames, models["fixed"], options=opts(runtime))
    assert isinstance(results, list) and len(results) == 3
    for frame, result in zip(frames, results, strict=True):
        np.testing.assert_allclose(result.matte, reference_matte(frame, (64, 64)), atol=TOL)
    (session,) = factory.sessions
    assert session.shrink_entries[:2] == ["", ""]
    assert session.shrink_entries[2] != ""
    # a second job reuses the cached session and again releases on its final run only
    ben2.run(frames[:2], models["fixed"], options=opts(runtime))
    assert len(factory.sessions) == 1 and runtime.sessions_created == 1
    assert session.shrink_entries[3] == "" and session.shrink_entries[4] != ""
    ends = runtime.events.recent("operation_end")
    assert [e["operation"] for e in ends] == ["remove-background", "remove-background"]
    assert [e["outcome"] for e in ends] == ["success", "success"]


def test_cancel_after_first_frame_stops_before_the_second_run(models, runtime, factory):
    cancel = threading.Event()
    stages = []

    def progress(fraction, stage):
        stages.append(stage)
        if stage == "postprocessing":
            cancel.set()

    with pytest.raises(OperationCancelled):
        ben2.run(
            [photo(seed=1), photo(seed=2)],
            models["fixed"],
            options=opts(runtime, cancel=cancel, progress=progress),
        )
    assert len(factory.fed) == 1
    assert runtime.events.recent("operation_end")[-1]["outcome"] == "cancelled"


def test_progress_reports_stages_in_order(models, runtime):
    reports = []
    ben2.run(
        [photo(seed=1), photo(seed=2)],
        models["fixed"],
        options=opts(runtime, progress=lambda f, s: reports.append((f, s))),
    )
    stages = [s for _, s in reports]
    assert stages == [
        "preprocessing", "frame 1/2", "postprocessing",
        "preprocessing", "frame 2/2", "postprocessing",
        "done",
    ]  # fmt: skip
    fractions = [f for f, _ in reports]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0


def test_empty_frame_list_runs_nothing(models, runtime, factory):
    assert ben2.run([], models["fixed"], options=opts(runtime)) == []
    assert factory.sessions == []
