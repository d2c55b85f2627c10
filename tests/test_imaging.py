"""models/imaging.py resize: the banded, blocked passes give the dense resampling product's pixels."""

from __future__ import annotations

import numpy as np
import pytest
from lean_image_ai.models.imaging import RESAMPLE_BLOCK, resample_band, resample_matrix, resize

KERNELS = ("lanczos3", "cubic", "linear", "nearest")
# shrinks and enlargements, one axis unchanged, a side of 1, and sizes past one block of rows
SIZES = [
    ((37, 53), (11, 97)),
    ((1, 5), (3, 2)),
    ((64, 64), (64, 32)),
    ((9, 300), (400, 9)),
    ((5, 7), (1, 1)),
    ((3 * RESAMPLE_BLOCK + 5, 20), (RESAMPLE_BLOCK + 3, 41)),
]


def _dense(image: np.ndarray, size, kernel: str) -> np.ndarray:
    """The resize as the two dense matrix products it stands for (float64, so the reference
    carries no float32 rounding of its own)."""
    rows = resample_matrix(image.shape[0], size[0], kernel).astype(np.float64)
    cols = resample_matrix(image.shape[1], size[1], kernel).astype(np.float64)
    return np.einsum("oh,hwc,pw->opc", rows, image.astype(np.float64), cols)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("source", "size"), SIZES)
def test_resize_gives_the_dense_product(kernel, source, size):
    rng = np.random.default_rng(sum(source) + sum(size))
    image = rng.random((*source, 3), dtype=np.float32) * 2 - 0.5  # HDR and negative values too
    result = resize(image, size, kernel)
    assert result.shape == (*size, 3) and result.dtype == np.float32 and result.flags.c_contiguous
    np.testing.assert_allclose(result, _dense(image, size, kernel), rtol=0, atol=2e-6)


@pytest.mark.parametrize("channels", [None, 1, 4])
def test_resize_keeps_the_layout_and_never_returns_its_input(channels):
    shape = (20, 30) if channels is None else (20, 30, channels)
    image = np.random.default_rng(1).random(shape, dtype=np.float32)
    for size in ((20, 30), (20, 12), (7, 30), (41, 50)):
        result = resize(image, size, "cubic")
        assert result.shape == (*size, *shape[2:])
        assert not np.shares_memory(result, image)
    np.testing.assert_array_equal(resize(image, (20, 30), "cubic"), image)


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_band_holds_every_weight_of_the_matrix(kernel):
    for in_size, out_size in ((1080, 630), (504, 1920), (7, 3), (1, 4)):
        indices, weights = resample_band(in_size, out_size, kernel)
        matrix = resample_matrix(in_size, out_size, kernel)
        assert indices.min() >= 0 and indices.max() < in_size
        # outside the band the matrix is zero: nothing a dense product would add is left out
        outside = matrix.copy()
        np.put_along_axis(outside, indices, 0.0, axis=1)
        assert not outside.any()
        np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)
        # a shrink reads a handful of taps per output, not the whole input line
        assert indices.shape[1] < 16 or in_size < 16
