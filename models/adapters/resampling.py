"""The upstream pipelines' resize operations, in numpy (Blender ships no cv2, torch or Pillow).

Each trained model was trained and evaluated through its own project's resize, so the adapters
resize as that project does, to the same weights, edges and rounding:

* `cv2_resize`: OpenCV's INTER_AREA (box overlap, for shrinking) and INTER_CUBIC (Keys a=-0.75,
  no antialiasing, edges replicated), used by Depth Anything 3. Both resample each row first, then
  the columns, as OpenCV does. Area is OpenCV's to the level on uint8 (its float32 sums in its order). Cubic is
  float32 too: the opencv-python wheels resize 8-bit cubic with Intel IPP, which it matches but
  for a rare last level (a few pixels in 500k); OpenCV's own code (IPP off, or a build without
  it) sums 11-bit fixed-point coefficients and differs from IPP in ~4 % of the pixels by a level.
* `torch_bilinear`: `F.interpolate(mode="bilinear", align_corners=False)`, with or without
  `antialias` (MoGe-2's input resize, MoGe-2's and BEN2's output resizes).
* `pil_lanczos`: Pillow's `Image.resize(..., LANCZOS)` (BEN2's input resize), on uint8 with Pillow's
  own 22-bit fixed-point coefficients and its rounding after each of its two passes.

uint8 images stay uint8 where upstream rounds (cv2 and Pillow on 8-bit photos); float images are
resampled in float32 with the same weights (upstream has no float path to copy: nothing is rounded).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

# Pillow's fixed point for 8-bit images (libImaging/Resample.c): 32 - 8 bits - 2 guard bits
PIL_PRECISION_BITS = 22
# OpenCV's INTER_AREA skips a partial source pixel covering less than this (computeResizeAreaTab)
CV2_AREA_EPSILON = 1e-3
CV2_CUBIC_A = -0.75


def _cubic(x: np.ndarray, a: float) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return np.where(x <= 1.0, near, np.where(x < 2.0, far, 0.0))


def _triangle(x: np.ndarray) -> np.ndarray:
    return np.maximum(0.0, 1.0 - np.abs(x))


def _pil_lanczos(x: np.ndarray) -> np.ndarray:
    # Pillow's window is half-open, [-3, 3)
    return np.where((x >= -3.0) & (x < 3.0), np.sinc(x) * np.sinc(x / 3.0), 0.0)


# ---- bands: (out_size, taps) source indices and float64 weights --------------------------------


@lru_cache(maxsize=64)
def centred_band(in_size: int, out_size: int, kernel: str) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's and torch's (align_corners=False, no antialias) convention: the kernel at its
    natural width around `(i + 0.5) * scale - 0.5`, taps beyond an edge read the edge pixel."""
    scale = in_size / out_size
    centres = (np.arange(out_size) + 0.5) * scale - 0.5
    if kernel == "linear":
        taps, function = np.arange(0, 2), _triangle
    elif kernel == "cubic":
        taps, function = np.arange(-1, 3), lambda x: _cubic(x, CV2_CUBIC_A)
    else:
        raise ValueError(f"unknown kernel {kernel!r}")
    positions = np.floor(centres)[:, None] + taps[None, :]
    weights = function(positions - centres[:, None])
    return _frozen(np.clip(positions, 0, in_size - 1).astype(np.int64), weights)


@lru_cache(maxsize=64)
def support_band(in_size: int, out_size: int, kernel: str) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's convention (torch's antialias copies it): the kernel stretched by the shrink
    factor around `(i + 0.5) * scale`, taps beyond an edge dropped and the rest renormalised."""
    function, support = {"lanczos3": (_pil_lanczos, 3.0), "linear": (_triangle, 1.0)}[kernel]
    scale = in_size / out_size
    filter_scale = max(scale, 1.0)
    reach = support * filter_scale
    centres = (np.arange(out_size) + 0.5) * scale
    # C's (int) truncates toward zero; a negative start is clamped to 0 either way
    first = np.maximum(np.trunc(centres - reach + 0.5), 0).astype(np.int64)
    stop = np.minimum(np.trunc(centres + reach + 0.5), in_size).astype(np.int64)
    taps = int(math.ceil(reach)) * 2 + 1
    positions = first[:, None] + np.arange(taps)[None, :]
    inside = positions < stop[:, None]
    weights = np.where(inside, function((positions - centres[:, None] + 0.5) * (1.0 / filter_scale)), 0.0)
    total = weights.sum(axis=1, keepdims=True)
    weights = np.divide(weights, total, out=np.zeros_like(weights), where=total != 0)
    return _frozen(np.minimum(positions, in_size - 1), weights)


@lru_cache(maxsize=64)
def area_band(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's INTER_AREA when shrinking: each output pixel averages the source interval it
    covers, partial pixels by their overlap (OpenCV's computeResizeAreaTab, its 1e-3 cut-offs)."""
    if out_size > in_size:
        raise ValueError(
            f"INTER_AREA enlarging ({in_size} -> {out_size}) is OpenCV's bilinear; not needed here"
        )
    scale = 1.0 / (out_size / in_size)  # as cv::resize derives it (a last-bit difference shows)
    rows = []
    for out in range(out_size):
        start, end = out * scale, (out + 1) * scale
        first, last = math.ceil(start), math.floor(end)
        cell = min(scale, in_size - start)
        taps = []
        if first - start > CV2_AREA_EPSILON:
            taps.append((first - 1, (first - start) / cell))
        taps += [(j, 1.0 / cell) for j in range(first, min(last, in_size))]
        if end - last > CV2_AREA_EPSILON and last < in_size:
            taps.append((last, min(min(end - last, 1.0), cell) / cell))
        rows.append(taps)
    width = max(len(r) for r in rows)
    indices = np.zeros((out_size, width), np.int64)
    weights = np.zeros((out_size, width), np.float64)
    for out, taps in enumerate(rows):
        for k, (j, w) in enumerate(taps):
            indices[out, k], weights[out, k] = j, w
        indices[out, len(taps) :] = taps[-1][0]  # zero weight, a valid index
    return _frozen(indices, weights)


def _frozen(indices: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    indices.setflags(write=False)
    weights.setflags(write=False)
    return indices, weights


# ---- applying a band along one axis ------------------------------------------------------------


def _along(array: np.ndarray, axis: int, band, accumulate) -> np.ndarray:
    """Resample `axis` of an HxW or HxWxC array with `band`; `accumulate(gathered, weights)`
    sums the taps (float, or Pillow's fixed point)."""
    moved = np.moveaxis(array, axis, 0)
    indices, weights = band
    result = None
    for tap in range(indices.shape[1]):
        shape = (-1,) + (1,) * (moved.ndim - 1)
        term = accumulate(moved[indices[:, tap]], weights[:, tap].reshape(shape))
        result = term if result is None else result + term
    return np.moveaxis(result, 0, axis)


def _float_taps(gathered, weights):
    return gathered.astype(np.float32) * weights.astype(np.float32)


def _resample_float(image: np.ndarray, size, bands, *, horizontal_first: bool = False) -> np.ndarray:
    """The vertical pass (`bands[0]`), then the horizontal one (`horizontal_first`: OpenCV's
    order, each row first), in float32 (float64 weights rounded once)."""
    result = np.asarray(image, np.float32)
    passes = ((1, bands[1]), (0, bands[0])) if horizontal_first else ((0, bands[0]), (1, bands[1]))
    for axis, band in passes:
        if band is not None:
            result = _along(result, axis, band, _float_taps)
    return np.ascontiguousarray(result, np.float32)


def _check_size(image: np.ndarray, size) -> tuple[int, int]:
    out_h, out_w = int(size[0]), int(size[1])
    if out_h <= 0 or out_w <= 0:
        raise ValueError(f"cannot resize to {out_w}x{out_h}")
    if image.ndim not in (2, 3) or min(image.shape[:2]) <= 0:
        raise ValueError(f"expected an HxW or HxWxC image with pixels, got shape {image.shape}")
    return out_h, out_w


# ---- the three upstream operations ------------------------------------------------------------


def cv2_resize(image: np.ndarray, size: tuple[int, int], interpolation: str) -> np.ndarray:
    """`cv2.resize(image, (w, h), interpolation=INTER_AREA or INTER_CUBIC)`: "area" only shrinks
    (or keeps) a side. uint8 in -> uint8 out, rounded to nearest as OpenCV's saturate_cast does."""
    image = np.asarray(image)
    out_h, out_w = _check_size(image, size)
    if interpolation == "area":
        band_for = area_band
    elif interpolation == "cubic":
        band_for = lambda i, o: centred_band(i, o, "cubic")  # noqa: E731
    else:
        raise ValueError(f"interpolation must be 'area' or 'cubic', got {interpolation!r}")
    in_h, in_w = image.shape[:2]
    bands = (
        band_for(in_h, out_h) if in_h != out_h else None,
        band_for(in_w, out_w) if in_w != out_w else None,
    )
    result = _resample_float(image, (out_h, out_w), bands, horizontal_first=True)
    if image.dtype != np.uint8:
        return result
    if interpolation == "area" and in_h % out_h == 0 and in_w % out_w == 0:
        # OpenCV's integer-factor area path adds half the cell before its integer division
        result = np.floor(result + 0.5)
    else:
        result = np.rint(result)  # cvRound: halves to even
    return np.clip(result, 0, 255).astype(np.uint8)


def torch_bilinear(array: np.ndarray, size: tuple[int, int], *, antialias: bool) -> np.ndarray:
    """`F.interpolate(x, size, mode="bilinear", align_corners=False, antialias=...)` on an HxW or
    HxWxC float array (channels last); float32 out."""
    array = np.asarray(array, np.float32)
    out_h, out_w = _check_size(array, size)
    in_h, in_w = array.shape[:2]

    def band(i, o):
        if i == o:
            return None
        return support_band(i, o, "linear") if antialias else centred_band(i, o, "linear")

    return _resample_float(array, (out_h, out_w), (band(in_h, out_h), band(in_w, out_w)))


def _pil_fixed_taps(gathered, weights):
    scaled = weights * (1 << PIL_PRECISION_BITS)
    # Pillow rounds each coefficient half away from zero, then sums in integers
    coefficients = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int32)
    # Pillow's own accumulator is a 32-bit int: 255 x the coefficients' sum (~1.1 x 2**22) fits
    return gathered.astype(np.int32) * coefficients


def _pil_pass_uint8(image: np.ndarray, axis: int, band) -> np.ndarray:
    total = _along(image, axis, band, _pil_fixed_taps) + (1 << (PIL_PRECISION_BITS - 1))
    return np.clip(total >> PIL_PRECISION_BITS, 0, 255).astype(np.uint8)


def pil_lanczos(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """`Image.resize((w, h), Image.LANCZOS)`: columns first, then rows, each pass rounded to
    uint8 on a uint8 image; float images in float32 with the same weights."""
    image = np.asarray(image)
    out_h, out_w = _check_size(image, size)
    in_h, in_w = image.shape[:2]
    rows = support_band(in_h, out_h, "lanczos3") if in_h != out_h else None
    columns = support_band(in_w, out_w, "lanczos3") if in_w != out_w else None
    if image.dtype != np.uint8:
        return _resample_float(image, (out_h, out_w), (rows, columns))
    result = image
    if columns is not None:  # Pillow's horizontal pass comes first
        result = _pil_pass_uint8(result, 1, columns)
    if rows is not None:
        result = _pil_pass_uint8(result, 0, rows)
    return np.ascontiguousarray(result)


@lru_cache(maxsize=16)
def _shrink_inverse(in_size: int, out_size: int) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """The least-norm right inverse `A^T (A A^T)^-1` of A, the bilinear shrink in -> out (no
    antialias), as its two factors: A^T as a band over the in_size pixels, and the small dense
    `(A A^T)^-1`. It exists at every ratio: output i reads the neighbours p_i, p_i + 1 with p_i
    strictly increasing, so A's columns p_i alone form a bidiagonal matrix with the nonzero
    diagonal 1 - frac(centre_i). Its smallest singular value is 0.056 at 631 -> 630 (the worst
    ratio, checked at 14, 28, 56, 126 and 630 px, up to 5x) and at least 0.7 from 2x on (disjoint pairs), so the
    preimage's values stay within ~18x of the image's: float32 holds them to float noise."""
    if in_size <= out_size:
        raise ValueError(f"a bilinear preimage is larger than its image: {in_size} <= {out_size}")
    indices, weights = centred_band(in_size, out_size, "linear")
    readers = np.repeat(np.arange(out_size), indices.shape[1])
    # one entry per (source pixel, output pixel reading it): an edge's clamped taps add up
    keys, where = np.unique(indices.ravel() * out_size + readers, return_inverse=True)
    summed = np.bincount(where.ravel(), weights=weights.ravel())
    keys, summed = keys[summed != 0], summed[summed != 0]
    sources, readers = np.divmod(keys, out_size)  # sorted by source pixel
    counts = np.bincount(sources, minlength=in_size)
    slots = np.arange(len(keys)) - np.repeat(np.cumsum(counts) - counts, counts)
    taps = max(1, int(counts.max()))
    transposed_indices = np.zeros((in_size, taps), np.int64)  # an unread pixel: weight 0
    transposed_weights = np.zeros((in_size, taps))
    transposed_indices[sources, slots] = readers
    transposed_weights[sources, slots] = summed
    gram = np.zeros((out_size, out_size))  # A A^T: tridiagonal, each source pixel's pairs of readers
    for a in range(taps):
        for b in range(taps):
            pair = (transposed_indices[:, a], transposed_indices[:, b])
            np.add.at(gram, pair, transposed_weights[:, a] * transposed_weights[:, b])
    inverse = np.linalg.inv(gram)
    inverse.setflags(write=False)
    return _frozen(transposed_indices, transposed_weights), inverse


def bilinear_preimage(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An HxWxC float32 image at `size` (no side smaller than `image`'s) whose
    `torch_bilinear(..., image's size, antialias=False)` is `image`, to float noise: along each side
    that grows, the least-norm solution (:func:`_shrink_inverse`, any ratio), separable. Its values
    may leave [0, 1]; only its shrink is meant to be read."""
    result = np.asarray(image, np.float64)
    out = (int(size[0]), int(size[1]))
    if out[0] < result.shape[0] or out[1] < result.shape[1]:
        raise ValueError(f"a bilinear preimage is larger than its image: {out} < {result.shape[:2]}")
    inverses = [_shrink_inverse(out[a], result.shape[a]) if out[a] != result.shape[a] else None for a in (0, 1)]
    # the small Gram inverses first, at the image's size, in float64; then A^T's two taps a pixel
    for axis, inverse in enumerate(inverses):
        if inverse is not None:
            result = np.moveaxis(np.tensordot(inverse[1], np.moveaxis(result, axis, 0), axes=1), 0, axis)
    result = result.astype(np.float32)
    for axis, inverse in enumerate(inverses):
        if inverse is not None:
            result = _along(result, axis, inverse[0], _float_taps)
    return np.ascontiguousarray(result, np.float32)


def antialiased_preimage(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An image at `image`'s own size whose bilinear resize to `size` WITHOUT antialias is its
    resize WITH antialias (`torch_bilinear(image, size, antialias=True)`), to float noise: along a
    side that shrinks, `image` plus the least-norm preimage of what the plain shrink misses (so it
    stays as smooth as the picture: a resize that computes its weights in float32, as torch and
    onnxruntime do, reads it within float noise, 1.2e-5 / 2.7e-5 max from F.interpolate's own
    antialiased shrink on coffee at 3840x2160 to 630x1120 / 364x644, where the least-norm preimage
    of the antialiased shrink alone, sparse and jagged, is read 2.5e-4 off); a side that grows is
    kept as it is (antialiasing changes nothing when enlarging)."""
    image = np.asarray(image, np.float32)
    height, width = image.shape[:2]
    small = (min(height, int(size[0])), min(width, int(size[1])))
    missed = torch_bilinear(image, small, antialias=True) - torch_bilinear(image, small, antialias=False)
    return image + bilinear_preimage(missed, (height, width))
