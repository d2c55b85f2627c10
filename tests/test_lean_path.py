"""The lean path: outputs bound to caller-owned memory, tiles pasted straight into the result,
a single window fed the image itself."""

from __future__ import annotations

import numpy as np
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.base import RunOptions
from onnx_builders import sr_model


def test_bound_output_is_written_in_place_and_equals_a_plain_run(tmp_path, fresh_runtime):
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    feed = np.random.default_rng(0).random((1, 3, 20, 30), dtype=np.float32)
    with fresh_runtime.operation("plain") as op:
        plain = op.run(op.session(model, "cpu"), {"input": feed}, last=True)["output"]
    target = np.full((1, 3, 40, 60), np.nan, np.float32)
    with fresh_runtime.operation("bound") as op:
        got = op.run(op.session(model, "cpu"), {"input": feed}, last=True, out={"output": target})["output"]
    assert got is target  # no copy: the runtime wrote into the caller's array
    np.testing.assert_array_equal(target, plain)
    (release,) = [e for e in fresh_runtime.events.recent("memory_release") if e["operation"] == "bound"]
    assert release["reason"] == "operation_complete"


def test_a_single_window_is_the_image_itself_and_tiles_feed_no_padding(runtime, factory, tmp_path):
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    image = np.random.default_rng(1).random((37, 45, 3), dtype=np.float32)
    options = RunOptions(device="cpu", runtime=runtime)
    whole = upscale.run(image, model, options=options)
    assert factory.fed[-1]["input"][0] == (1, 3, 37, 45) and whole.tile_size_used == 45
    tiled = upscale.run(image, model, options=options, tile_size=32)
    assert whole.exact and tiled.exact and tiled.overlap == 2
    np.testing.assert_array_equal(tiled.image, whole.image)
    assert 0.0 <= tiled.image.min() and tiled.image.max() <= 1.0  # clipped as tiles were pasted
