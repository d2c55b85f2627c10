"""models/adapters/upscale/ and the embedded bicubic model, on real onnxruntime sessions.

Tolerances: tiled vs untiled results use atol 1e-5 (float32 summation order only, see
test_tiling.py). The fp16 model is compared with its fp32 twin at atol 2e-2: fp16 weights and
activations keep ~3 significant digits on outputs of magnitude ~1-3.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from builders_upscale import resize_model
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.base import RunOptions
from lean_image_ai.models.imaging import resize
from lean_image_ai.runtime import Runtime
from lean_image_ai.runtime.errors import (
    InvalidImageError,
    InvalidModelOutputError,
    ModelContractError,
    OperationCancelled,
)
from onnx_builders import sr_model
from recording import RecordingFactory
from recording import cpu_options as opts

ATOL = 1e-5
TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("upscale-models")
    return {
        "x2": sr_model(folder / "sr2.onnx", scale=2, mid_channels=8, seed=1),
        "x4": sr_model(folder / "sr4.onnx", scale=4, mid_channels=8, seed=2),
        "fixed": sr_model(folder / "sr2_64.onnx", scale=2, mid_channels=8, seed=1, tile=64),
        "fp16": sr_model(folder / "sr2_fp16.onnx", scale=2, mid_channels=8, seed=1, fp16=True),
        "x1_5": resize_model(folder / "x1_5.onnx", factor=1.5),
        "x1_5_fixed": resize_model(folder / "x1_5_fixed.onnx", factor=1.5, tile=64, out_shape=[1, 3, 96, 96]),
        "grey_input": resize_model(folder / "grey.onnx", channels=1),
        "nan": resize_model(folder / "nan.onnx", nan=True),
    }


def picture(height, width, channels=3, seed=0):
    return np.random.default_rng(seed).random((height, width, channels), dtype=np.float32)


# ---- the embedded default model -----------------------------------------------------------------


def _build_assets_module():
    spec = importlib.util.spec_from_file_location("build_assets", REPO_ROOT / "tools" / "build_assets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stored_bicubic_model_is_exactly_what_the_build_script_makes():
    assert upscale.DEFAULT_MODEL_PATH == REPO_ROOT / "models" / "assets" / "bicubic_x2.onnx"
    stored = upscale.DEFAULT_MODEL_PATH.read_bytes()
    assert stored == _build_assets_module().build("bicubic_x2.onnx")
    assert 100 < len(stored) < 1000


def keys_cubic_x2_reference(image: np.ndarray, a: float = -0.5) -> np.ndarray:
    """Bicubic x2 written out per output pixel: half-pixel centres, 4 taps, edge clamping."""

    def weight(d):
        d = abs(d)
        if d <= 1:
            return (a + 2) * d**3 - (a + 3) * d**2 + 1
        if d < 2:
            return a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a
        return 0.0

    def axis(values, axis_index):
        n = values.shape[axis_index]
        out = []
        for o in range(2 * n):
            centre = (o + 0.5) / 2 - 0.5
            base = int(np.floor(centre))
            acc = 0.0
            for tap in range(base - 1, base + 3):
                source = np.take(values, min(max(tap, 0), n - 1), axis=axis_index)
                acc = acc + weight(centre - tap) * source
            out.append(acc)
        return np.stack(out, axis=axis_index)

    return axis(axis(image.astype(np.float64), 0), 1)


def test_bicubic_model_matches_an_independent_bicubic(fresh_runtime):
    session = ort.InferenceSession(str(upscale.DEFAULT_MODEL_PATH), providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape[:2]) for i in session.get_inputs()] == [("input", [1, 3])]
    assert isinstance(session.get_inputs()[0].shape[2], str)  # dynamic height and width
    rgb = picture(7, 9, seed=3)
    # through the shared runtime, as the add-on runs it
    with fresh_runtime.operation("bicubic") as op:
        handle = op.session(upscale.DEFAULT_MODEL_PATH, "cpu")
        out = op.run(handle, {"input": rgb.transpose(2, 0, 1)[None].copy()}, last=True)["output"]
    got = out[0].transpose(1, 2, 0)
    expected = keys_cubic_x2_reference(rgb)
    assert got.shape == (14, 18, 3)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    # and the numpy resize used for alpha has the same kernel
    np.testing.assert_allclose(resize(rgb, (14, 18), "cubic"), expected, rtol=0, atol=1e-5)


def test_default_model_upscales_2x(fresh_runtime):
    result = upscale.run(picture(30, 20), options=opts(fresh_runtime))
    assert result.scale == 2 and result.image.shape == (60, 40, 3) and result.image.dtype == np.float32


# ---- scale, tiling, shapes ----------------------------------------------------------------------


def untiled(runtime, model, image, **kwargs):
    return upscale.run(image, model, options=opts(runtime), tile_size=None, **kwargs)


@pytest.mark.parametrize("name,scale", [("x2", 2), ("x4", 4)])
def test_scale_is_read_from_the_model_and_tiles_match_untiled(fresh_runtime, models, name, scale):
    image = picture(37, 53, seed=scale)
    reference = untiled(fresh_runtime, models[name], image)
    result = upscale.run(image, models[name], options=opts(fresh_runtime), tile_size=40, overlap=8)
    assert result.scale == scale == reference.scale
    assert result.image.shape == (37 * scale, 53 * scale, 3)
    # the window that ran: 53 columns in three tiles of 17-18, the middle one with 2 x 8 of overlap
    assert result.tile_size_used == 34
    np.testing.assert_allclose(result.image, reference.image, rtol=0, atol=ATOL)
    inside = (reference.image > 0.01) & (reference.image < 0.99)
    assert inside.mean() > 0.2  # clipping to [0, 1] left plenty of values to compare


def test_fixed_shape_model_is_fed_its_size_and_matches_its_dynamic_twin(recorded, models):
    runtime, factory = recorded
    image = picture(50, 70, seed=5)
    result = upscale.run(image, models["fixed"], options=opts(runtime), tile_size=200)
    assert {tuple(r["shape"]) for r in factory.runs} == {(1, 3, 64, 64)}
    assert result.tile_size_used == 64 and any("fixed 64x64" in w for w in result.warnings)
    # 50 rows fill a 64-row input only by reflection at the bottom: the reference is padded alike
    padded = np.pad(image, ((0, 14), (0, 0), (0, 0)), mode="reflect")
    reference = untiled(runtime, models["x2"], padded).image[:100]
    np.testing.assert_allclose(result.image, reference, rtol=0, atol=ATOL)


def test_non_integer_scale_is_a_contract_error(fresh_runtime, models):
    with pytest.raises(ModelContractError, match="whole-number scale"):
        upscale.run(picture(20, 20), models["x1_5"], options=opts(fresh_runtime))
    # declared in the file: refused before any run
    with pytest.raises(ModelContractError, match="64x64 to 96x96"):
        upscale.run(picture(20, 20), models["x1_5_fixed"], options=opts(fresh_runtime))


def test_wrong_input_channels_is_a_contract_error_naming_both(fresh_runtime, models):
    with pytest.raises(ModelContractError) as info:
        upscale.run(picture(8, 8), models["grey_input"], options=opts(fresh_runtime))
    assert "expected 3 channels, found 1" in str(info.value) and "super-resolution model" in str(info.value)


def test_nan_output_is_refused(fresh_runtime, models):
    with pytest.raises(InvalidModelOutputError, match="NaN"):
        upscale.run(picture(8, 8), models["nan"], options=opts(fresh_runtime))


def test_fp16_model_gets_float16_and_returns_float32(recorded, models):
    runtime, factory = recorded
    image = picture(24, 31, seed=8)
    result = upscale.run(image, models["fp16"], options=opts(runtime), tile_size=None)
    assert result.image.dtype == np.float32 and result.image.shape == (48, 62, 3)
    reference = untiled(runtime, models["x2"], image)
    np.testing.assert_allclose(result.image, reference.image, rtol=0, atol=2e-2)
    assert np.abs(result.image - reference.image).max() > 0  # it really ran in half precision


# ---- image kinds ----------------------------------------------------------------------------------


def test_rgba_keeps_alpha_at_scale_through_the_model(recorded):
    runtime, factory = recorded
    image = picture(21, 17, channels=4, seed=11)
    result = upscale.run(image, options=opts(runtime), tile_size=None)
    assert result.image.shape == (42, 34, 4)
    assert len(factory.runs) == 2  # colour, then alpha as a grey image
    alpha = result.image[:, :, 3]
    # the bicubic model on a grey alpha is a cubic resize of it (borders: reflect vs clamp context)
    expected = np.clip(resize(image[:, :, 3], (42, 34), "cubic"), 0, 1)
    np.testing.assert_allclose(alpha[3:-3, 3:-3], expected[3:-3, 3:-3], rtol=0, atol=1e-5)
    colour = upscale.run(image[:, :, :3], options=opts(runtime), tile_size=None)
    np.testing.assert_allclose(result.image[:, :, :3], colour.image, rtol=0, atol=ATOL)


def test_rgba_alpha_through_the_model_tiled_is_the_grey_run_averaged(recorded, models):
    """The alpha's tiles are pasted from the model's NCHW outputs like the colour's: tiled equals
    one window, and the alpha is the mean of the model's three channels on the grey alpha."""
    runtime, _factory = recorded
    image = picture(45, 38, channels=4, seed=13)
    image[:, :, 3] = 0.3 + 0.4 * image[:, :, 3]  # the bicubic model keeps it inside [0, 1]: no clip
    for model in (models["x2"], upscale.DEFAULT_MODEL_PATH):
        tiled = upscale.run(image, model, options=opts(runtime), tile_size=32)
        whole = upscale.run(image, model, options=opts(runtime), tile_size=None)
        assert tiled.exact and tiled.image.shape == (90, 76, 4)
        np.testing.assert_allclose(tiled.image, whole.image, rtol=0, atol=ATOL)
        colour = upscale.run(image[:, :, :3], model, options=opts(runtime), tile_size=None)
        np.testing.assert_array_equal(whole.image[:, :, :3], colour.image)
    grey = upscale.run(np.repeat(image[:, :, 3:4], 3, axis=2), options=opts(runtime), tile_size=None).image
    assert grey.min() > 0.0 and grey.max() < 1.0
    np.testing.assert_allclose(whole.image[:, :, 3], grey.mean(axis=2), rtol=0, atol=1e-6)


def test_rgba_alpha_with_resize_mode_and_constant_alpha(recorded, models):
    runtime, factory = recorded
    image = picture(21, 17, channels=4, seed=12)
    result = upscale.run(image, models["x2"], options=opts(runtime), alpha_mode="resize")
    expected = np.clip(resize(image[:, :, 3], (42, 34), "cubic"), 0, 1)
    np.testing.assert_allclose(result.image[:, :, 3], expected, rtol=0, atol=1e-6)
    assert len(factory.runs) == 1
    image[:, :, 3] = 0.5  # flat alpha: no model run needed for it in either mode
    result = upscale.run(image, models["x2"], options=opts(runtime), alpha_mode="model")
    assert len(factory.runs) == 2 and (result.image[:, :, 3] == 0.5).all()


def test_grey_uint16_and_grey_alpha_sources(fresh_runtime):
    grey = (picture(10, 12, 1)[:, :, 0] * 255).astype(np.uint8)
    result = upscale.run(grey, options=opts(fresh_runtime))
    assert result.image.shape == (20, 24, 3)
    np.testing.assert_allclose(result.image[:, :, 0], result.image[:, :, 1])
    deep = (picture(10, 12, 3) * 65535).astype(np.uint16)
    as_float = upscale.run(deep.astype(np.float32) / 65535, options=opts(fresh_runtime))
    np.testing.assert_allclose(
        upscale.run(deep, options=opts(fresh_runtime)).image, as_float.image, atol=1e-6
    )
    grey_alpha = picture(6, 5, 2)
    assert upscale.run(grey_alpha, options=opts(fresh_runtime)).image.shape == (12, 10, 4)


def test_one_pixel_and_empty_images(fresh_runtime):
    one = upscale.run(np.array([[[0.2, 0.4, 0.6]]], np.float32), options=opts(fresh_runtime))
    np.testing.assert_allclose(one.image, np.broadcast_to([0.2, 0.4, 0.6], (2, 2, 3)), atol=1e-6)
    with pytest.raises(InvalidImageError, match="no pixels"):
        upscale.run(np.zeros((0, 5, 3), np.float32), options=opts(fresh_runtime))


def test_nan_inf_and_hdr_input_are_sanitised_with_warnings(fresh_runtime, tmp_path):
    image = picture(8, 8)
    image[1, 1, 0] = np.nan
    image[2, 2, 1] = np.inf
    image[3, 3] = 4.0  # HDR highlight
    result = upscale.run(image, options=opts(fresh_runtime))
    # the embedded bicubic model is a plain resampling: the highlight keeps its value (issue 33)
    assert np.isfinite(result.image).all() and 1.0 < result.image.max() <= 4.0
    text = " ".join(result.warnings)
    assert "NaN/Inf" in text and "clipped" not in text
    # a trained model takes [0, 1]: clipped, and said with what
    trained = upscale.run(image, resize_model(tmp_path / "x2.onnx"), options=opts(fresh_runtime))
    assert trained.image.max() <= 1.0 and "1 pixel(s) outside [0, 1]" in " ".join(trained.warnings)


def test_bad_options_are_refused(fresh_runtime):
    with pytest.raises(ValueError, match="alpha_mode"):
        upscale.run(picture(4, 4), options=opts(fresh_runtime), alpha_mode="blend")
    with pytest.raises(ValueError, match="tile_size"):
        upscale.run(picture(4, 4), options=opts(fresh_runtime), tile_size="big")


# ---- one operation, marking the final run, cancellation ---------------------------------------------


def test_frames_are_one_operation_and_only_the_final_run_releases(recorded, models):
    runtime, factory = recorded
    frames = [picture(40, 40, 4, seed=s) for s in range(3)]
    results = upscale.run(frames, models["x2"], options=opts(runtime), tile_size=32, overlap=4)
    assert isinstance(results, list) and [r.image.shape for r in results] == [(80, 80, 4)] * 3
    entries = factory.shrink_entries
    assert len(entries) == 3 * 4 * 2  # frames x tiles x (colour + alpha)
    assert entries[-1] == "cpu:0" and entries[:-1] == [""] * (len(entries) - 1)
    assert len(runtime.events.recent("memory_release")) == 1
    ends = runtime.events.recent("operation_end")
    assert [e["outcome"] for e in ends] == ["success"] and ends[0]["runs"] == len(entries)


def test_progress_is_reported_per_frame_and_tile(fresh_runtime):
    stages = []
    upscale.run(
        [picture(30, 30), picture(30, 30)],
        options=RunOptions(device="cpu", runtime=fresh_runtime, progress=lambda f, s: stages.append((f, s))),
        tile_size=24,
        overlap=2,
    )
    assert ("frame 2/2, tile 4/4" in [s for _f, s in stages]) and stages[-1] == (1.0, "done")
    fractions = [f for f, _s in stages]
    assert fractions == sorted(fractions)


def test_cancel_after_the_second_tile(recorded, models):
    runtime, factory = recorded
    cancel = threading.Event()

    def progress(fraction, stage):
        if stage.startswith("tile 2/"):
            cancel.set()

    with pytest.raises(OperationCancelled):
        upscale.run(
            picture(64, 64),
            models["x2"],
            options=opts(runtime, cancel=cancel, progress=progress),
            tile_size=24,
            overlap=2,
        )
    assert len(factory.runs) == 2
    assert runtime.events.recent("operation_end")[-1]["outcome"] == "cancelled"
    # the cancelled job still gave the arena back
    assert runtime.events.recent("memory_release")[-1]["reason"] == "cancelled"


# ---- split on a real out-of-memory error (capped CPU arena, own process) -----------------------------

OOM_SCRIPT = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from recording import RecordingFactory
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.base import RunOptions
from lean_image_ai.models.imaging import to_nchw
from lean_image_ai.runtime import InferenceOutOfMemoryError, Runtime, RuntimeSettings

model, image_path, out_path, cap = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
image = np.load(image_path)
factory = RecordingFactory()
runtime = Runtime(RuntimeSettings(cpu_arena_max_bytes=cap), session_factory=factory)
report = {}
# the same untiled window the adapter tries first, run directly: it cannot fit
padded = np.pad(image, ((16, 16), (16, 16), (0, 0)), mode="reflect")
try:
    with runtime.operation("untiled") as op:
        op.run(op.session(model, "cpu"), {"input": to_nchw(padded)}, last=True)
    report["untiled"] = "ok"
except InferenceOutOfMemoryError as exc:
    report["untiled"] = type(exc).__name__
first_job_run = len(factory.runs)
result = upscale.run(image, model, options=RunOptions(device="cpu", runtime=runtime), tile_size=None)
np.save(out_path, result.image)
runs = factory.runs[first_job_run:]
splits = runtime.events.recent("tile_split")
report.update(
    shape=list(result.image.shape),
    tile_size_used=result.tile_size_used,
    warnings=result.warnings,
    tile_splits=len(splits),
    first_split=[splits[0]["old_tile_size"], splits[0]["new_tile_size"]] if splits else None,
    oom_events=len(runtime.events.recent("out_of_memory")),
    failed_runs=sum(not r["ok"] for r in runs),
    shrink_entries_ok_runs=[r["shrink"] for r in runs if r["ok"]],
    sessions_created=runtime.sessions_created,
    arena_cap=cap,
)
print(json.dumps(report))
"""


def test_out_of_memory_splits_tiles_and_matches_the_uncapped_result(tmp_path, fresh_runtime):
    model = sr_model(tmp_path / "sr32.onnx", scale=2, mid_channels=32, seed=4)
    image = picture(384, 384, seed=6)
    np.save(tmp_path / "image.npy", image)
    cap = 16 << 20  # the untiled 32-channel intermediate alone is 32 x 416 x 416 x 4 B = 21 MiB
    done = subprocess.run(
        [sys.executable, "-c", OOM_SCRIPT, str(TESTS_DIR), str(model), str(tmp_path / "image.npy"),
         str(tmp_path / "out.npy"), str(cap)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["untiled"] == "InferenceOutOfMemoryError"
    # one window over the image itself (no padding) first, then halves
    assert report["tile_splits"] >= 1 and report["first_split"][0] == 384
    assert report["first_split"][1] == 384 // 2
    assert report["failed_runs"] == report["tile_splits"] == report["oom_events"] - 1
    assert report["sessions_created"] == report["oom_events"] + 1  # re-acquired after each eviction
    entries = report["shrink_entries_ok_runs"]
    assert len(entries) > 1 and entries[-1] == "cpu:0" and set(entries[:-1]) == {""}
    assert report["shape"] == [768, 768, 3] and any("split" in w for w in report["warnings"])
    reference = upscale.run(image, model, options=opts(fresh_runtime), tile_size=None)
    assert not fresh_runtime.events.recent("tile_split")  # uncapped: one window was enough
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), reference.image, rtol=0, atol=ATOL)


def test_cuda_fallback_warning_reaches_the_upscale_result(models, monkeypatch):
    """A CUDA request that lands on CPU (a real session reporting CPU only, as on a machine whose
    CUDA libraries fail) is a warning in the result, like BEN2/DA3/MoGe-2."""
    from lean_image_ai.runtime import core

    monkeypatch.setattr(core, "visible_cuda_count", lambda: 1)
    factory = RecordingFactory(reported_providers=["CPUExecutionProvider"])
    runtime = Runtime(
        session_factory=factory, available_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    result = upscale.run(
        picture(16, 16), models["x2"], options=RunOptions(device="cuda:0", runtime=runtime), tile_size=None
    )
    assert any("CUDA was requested" in w and "CPU" in w for w in result.warnings), result.warnings


def test_a_model_with_an_extra_input_is_refused_and_not_kept_cached(tmp_path, fresh_runtime):
    """An SR graph with a second input would fail later in ORT's own words: the contract names
    both inputs, and the session of a model that does not fit is evicted, not cached."""
    from onnx import TensorProto, helper
    from onnx_builders import save_model

    image = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "H", "W"])
    strength = helper.make_tensor_value_info("strength", TensorProto.FLOAT, [1])
    output = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, "H", "W"])
    graph = helper.make_graph([helper.make_node("Identity", ["input"], ["output"])], "two_inputs", [image, strength], [output])
    model = save_model(graph, tmp_path / "two_inputs.onnx")
    with pytest.raises(ModelContractError, match=r"expected 1 input\(s\), found 2 \('input', 'strength'\)"):
        upscale.run(np.zeros((8, 8, 3), np.float32), model, options=RunOptions(device="cpu", runtime=fresh_runtime))
    assert fresh_runtime.cached_sessions() == []
    assert [e["reason"] for e in fresh_runtime.events.recent("session_evict")] == ["model contract"]
