"""What MoGe-2's adapter feeds the export (issue 42), on the MoGe-2-like ONNX model
(tests/builders_moge2.py): a dynamic-size export gets the picture's own size, whose plain shrink
is MoGe's antialiased encoder input, and returns its maps at that size; a fixed-size export gets
the encoder's input stretched to its size, its maps resized here."""

from __future__ import annotations

import numpy as np
import pytest
from builders_moge2 import expected_depth, moge2_like_model
from lean_image_ai.models.adapters import moge2
from lean_image_ai.models.adapters.resampling import torch_bilinear
from recording import cpu_options as opts
from test_moge2 import FOCAL, SCALE, red_image


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("moge2_feed")
    return {
        "good": moge2_like_model(folder / "moge2.onnx"),
        "fixed": moge2_like_model(folder / "fixed.onnx", fixed_hw=(56, 84)),
    }


@pytest.mark.parametrize("size", [(1000, 1300), (520, 600)])
def test_a_picture_larger_than_the_grid_is_fed_at_its_size_and_shrinks_to_the_encoders_input(
    models, recorded, size
):
    # MoGe's encoder reads the picture bilinear WITH antialias at the grid's size; the export's
    # ONNX mode shrinks without: fed the preimage at the picture's size, its own shrink gives the
    # encoder's input, and its outputs come at the picture's size (2.4x and 1.2x shrinks here)
    runtime, factory = recorded
    height, width = size
    picture = red_image(height, width)
    picture[..., 1] = np.linspace(0.0, 1.0, width)[None, :] * np.linspace(1.0, 0.2, height)[:, None]
    picture[::7, ::5, 2] = 1.0  # detail the antialias smooths and a plain shrink aliases
    result = moge2.run(picture, models["good"], options=opts(runtime), num_tokens=1200)
    image = factory.sessions[0].feeds[0]["image"]
    assert image.shape == (1, 3, height, width) and result.points.shape == (height, width, 3)
    shrunk = torch_bilinear(image[0].transpose(1, 2, 0), result.model_size, antialias=False)
    encoder = torch_bilinear(picture, result.model_size, antialias=True)
    np.testing.assert_allclose(shrunk, encoder, atol=1e-5)
    assert np.abs(torch_bilinear(picture, result.model_size, antialias=False) - encoder).max() > 0.1
    expected = expected_depth(height, width, height, width, focal=FOCAL) * SCALE
    np.testing.assert_allclose(result.depth, expected, rtol=1e-5)


def test_a_fixed_size_export_is_fed_the_stretched_encoder_input_and_its_maps_resized(models, recorded):
    # a fixed input cannot take the picture's size: it gets MoGe's encoder input at its own size
    # (stretched, and said so), and its maps are resized to the picture here (moge2_outputs.py)
    runtime, factory = recorded
    picture = red_image(90, 120)
    picture[..., 1] = np.linspace(0.0, 1.0, 120)[None, :]
    result = moge2.run(picture, models["fixed"], options=opts(runtime))
    image = factory.sessions[0].feeds[0]["image"]
    assert image.shape == (1, 3, 56, 84) and result.model_size == (56, 84)
    np.testing.assert_allclose(image[0].transpose(1, 2, 0), torch_bilinear(picture, (56, 84), antialias=True), atol=1e-6)
    assert any("fixed 84x56 input" in w and "stretched" in w for w in result.warnings)
    assert result.points.shape == (90, 120, 3) and result.normal.shape == (90, 120, 3)
    np.testing.assert_allclose(np.linalg.norm(result.normal, axis=2), 1.0, atol=1e-5)
    expected = expected_depth(56, 84, 90, 120, focal=FOCAL) * SCALE
    # z resized once, as MoGe resizes; the outermost pixels hold the edge where the plane goes on
    np.testing.assert_allclose(result.depth[1:-1, 1:-1], expected[1:-1, 1:-1], rtol=5e-4)
