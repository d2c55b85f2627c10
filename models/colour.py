"""Colour encoding of frames for the models, in numpy only (bpy-free): the sRGB transfer functions
and straight versus premultiplied alpha.

The models take straight alpha and sRGB-encoded colour. Blender's float images hold scene-linear,
premultiplied colour (operators/image_io.py's ImageInfo says which case an image is in): a
front-end converts with :func:`to_model_rgb` on the way in and :func:`from_model_rgb` on the way
out. "Linear" means Linear Rec.709; another working space gets its primaries wrong.
"""

from __future__ import annotations

import numpy as np


def linear_to_srgb(values: np.ndarray) -> np.ndarray:
    """Standard sRGB OETF (IEC 61966-2-1), piecewise; float32. Values > 1 follow the curve."""
    x = np.asarray(values, dtype=np.float32)
    high = 1.055 * np.power(np.maximum(x, 0.0031308), 1.0 / 2.4, dtype=np.float32) - 0.055
    return np.where(x <= 0.0031308, x * 12.92, high).astype(np.float32, copy=False)


def srgb_to_linear(values: np.ndarray) -> np.ndarray:
    """Standard sRGB EOTF (inverse of :func:`linear_to_srgb`); float32."""
    v = np.asarray(values, dtype=np.float32)
    high = np.power((np.maximum(v, 0.04045) + 0.055) / 1.055, 2.4, dtype=np.float32)
    return np.where(v <= 0.04045, v / 12.92, high).astype(np.float32, copy=False)


def _convert_rgb(array: np.ndarray, fn) -> np.ndarray:
    arr = np.asarray(array, dtype=np.float32)
    if arr.ndim == 3 and arr.shape[-1] in (2, 4):  # keep alpha as is
        out = arr.copy()
        colour = slice(0, arr.shape[-1] - 1)
        out[..., colour] = fn(arr[..., colour])
        return out
    return fn(arr)


def unpremultiply(array: np.ndarray) -> np.ndarray:
    """RGBA (or grey+alpha) with colour divided by alpha where alpha > 0; a new float32 array."""
    out = np.array(array, dtype=np.float32, copy=True)
    alpha = out[..., -1:]
    np.divide(out[..., :-1], alpha, out=out[..., :-1], where=alpha > 0)
    return out


def premultiply(array: np.ndarray) -> np.ndarray:
    """RGBA (or grey+alpha) with colour multiplied by alpha; a new float32 array."""
    out = np.array(array, dtype=np.float32, copy=True)
    out[..., :-1] *= out[..., -1:]
    return out


def to_model_rgb(array: np.ndarray, is_linear: bool, *, premultiplied: bool = False) -> np.ndarray:
    """Values for a model (straight alpha, sRGB-encoded colour); alpha itself is untouched.

    ``premultiplied`` colour is divided by alpha first; linear colour then gets the sRGB OETF.
    Use ``info.is_linear`` / ``info.premultiplied`` from :func:`image_info`. Returns the input
    (as float32) when there is nothing to do.
    """
    arr = np.asarray(array, dtype=np.float32)
    if premultiplied:
        arr = unpremultiply(arr)
    if not is_linear:
        return arr
    return _convert_rgb(arr, linear_to_srgb)


def from_model_rgb(array: np.ndarray, is_linear: bool, *, premultiplied: bool = False) -> np.ndarray:
    """Inverse of :func:`to_model_rgb`: sRGB, straight model output -> the target image's encoding."""
    arr = np.asarray(array, dtype=np.float32)
    if is_linear:
        arr = _convert_rgb(arr, srgb_to_linear)
    if premultiplied:
        arr = premultiply(arr)
    return arr
