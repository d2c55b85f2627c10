"""The integer samples Blender's writer stores of a result image (bpy-free), so a file the add-on
encodes a band at a time holds what Blender's writer gave (a Process Sequence frame, issue #37
item 3).

A byte image's samples are its bytes: a float value x became ``floor(x * 255 + 0.5)`` (clipped) when
the pixels went in. A 16-bit file is written from a float buffer (operators/results.py
save_product: colour linear and premultiplied), found by comparing with Blender 5.0.1's own files:

- colour: OpenColorIO turns the buffer to sRGB as it is, premultiplied (no division by alpha
  first), with OCIO's CPU renderer of the sRGB "moncurve" (an ExponentWithLinearTransform, gamma
  2.4, offset 0.055): its break point and slope derived from those two (slope 12.9232, not 12.92)
  and its power taken by OCIO's SSE polynomial approximation (``ssePower``, src/OpenColorIO/SSE.h),
  about 15 bits exact, so the exact power function differs by one step in a tenth of the samples;
- values ("Non-Color", depth): no transform;
- a PNG then holds colour (and values) divided by alpha where alpha is not 0, a TIFF the
  premultiplied colour, flagged associated alpha (Pillow's "RGBa");
- each sample ``floor(clip(x, 0, 1) * 65535 + 0.5)`` in float32.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
EXPONENT_BITS = np.int32(0x7F800000)
ONE_BITS = np.int32(0x3F800000)
# Chebyshev (minimax) polynomials of OCIO's SSE.h: log2 over [1, 2[, exp2 over [0, 1[, highest power first
LOG2_POLYNOMIAL = tuple(F32(c) for c in (4.487361286440374006195e-2, -4.165637071209677112635e-1, 1.631148826119436277100,
                                         -3.550793018041176193407, 5.091710879305474367557, -2.800364054395965731506))
EXP2_POLYNOMIAL = tuple(F32(c) for c in (1.353416792833547468620e-2, 5.201146058412685018921e-2, 2.414427569091865207710e-1,
                                         6.930038344665415134202e-1, 1.000002593370603213644))


def _moncurve_inverse(gamma: float, offset: float) -> tuple[np.float32, ...]:
    """OCIO's renderer parameters of the inverse moncurve (GammaOpUtils.cpp ComputeParamsRev):
    power, scale, offset, break point, slope, each rounded to float32 as OCIO keeps them."""
    power = 1.0 / gamma
    break_point = (offset * gamma / ((gamma - 1.0) * (1.0 + offset))) ** gamma
    slope = ((gamma - 1.0) / offset) ** (gamma - 1.0) * ((1.0 + offset) / gamma) ** gamma
    return F32(power), F32(1.0 + offset), F32(offset), F32(break_point), F32(slope)


SRGB_POWER, SRGB_SCALE, SRGB_OFFSET, SRGB_BREAK, SRGB_SLOPE = _moncurve_inverse(2.4, 0.055)


def _polynomial(coefficients: tuple[np.float32, ...], x: np.ndarray) -> np.ndarray:
    """Horner's rule one float32 multiply and add at a time, as the SSE code (no fused multiply-add)."""
    result = coefficients[0] * x
    for coefficient in coefficients[1:-1]:
        result += coefficient
        result *= x
    result += coefficients[-1]
    return result


def _sse_log2(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.int32)
    mantissa = ((bits & ~EXPONENT_BITS) | ONE_BITS).view(F32)
    exponent = ((bits & EXPONENT_BITS) >> 23) - 127
    return _polynomial(LOG2_POLYNOMIAL, mantissa) + exponent.astype(F32)


def _sse_exp2(x: np.ndarray) -> np.ndarray:
    floor = x.astype(np.int32) - (x < 0)  # truncation, one less below zero (as cvttps + cmpnle)
    whole = ((floor + 127) << 23).astype(np.int32).view(F32)
    fraction = x - floor.astype(F32)
    result = whole * _polynomial(EXP2_POLYNOMIAL, fraction)
    result[floor < -126] = 0.0  # underflow
    result[floor > 127] = np.inf
    return result


def sse_power(x: np.ndarray, exponent: np.float32) -> np.ndarray:
    """OCIO's ``ssePower``: exp2(exponent * log2(x)) by its polynomials; 0 where x <= 0."""
    x = np.ascontiguousarray(x, F32)
    result = _sse_exp2(exponent * _sse_log2(x))
    result[~(x > 0)] = 0.0
    return result


def linear_to_srgb(x: np.ndarray) -> np.ndarray:
    """Blender's (OpenColorIO's) sRGB encoding of linear values, as its writer applies it."""
    x = np.ascontiguousarray(x, F32)
    encoded = sse_power(x, SRGB_POWER)
    encoded *= SRGB_SCALE
    encoded -= SRGB_OFFSET
    low = x <= SRGB_BREAK
    encoded[low] = x[low] * SRGB_SLOPE
    return encoded


def sixteen_bit(buffer: np.ndarray, *, is_data: bool, associated_alpha: bool) -> np.ndarray:
    """uint16 RGBA samples of a band of Blender's float buffer ``buffer`` (``(H, W, 4)``, colour
    linear and premultiplied, or values as they are): what Blender writes to a 16-bit PNG
    (``associated_alpha`` False: colour divided by alpha) or TIFF (True)."""
    samples = np.array(buffer, F32)
    alpha = samples[..., 3:]
    if not is_data:
        samples[..., :3] = linear_to_srgb(samples[..., :3])
    if not associated_alpha:
        np.divide(samples[..., :3], alpha, out=samples[..., :3], where=alpha != 0)  # alpha 0: kept as is
    return quantised(samples, 65535, np.uint16)


def eight_bit(values: np.ndarray) -> np.ndarray:
    """uint8 samples of float values as a byte image takes them (``floor(x * 255 + 0.5)``, clipped)."""
    return quantised(values, 255, np.uint8)


def quantised(values: np.ndarray, top: int, dtype) -> np.ndarray:
    scaled = np.multiply(values, F32(top), dtype=F32)
    scaled += F32(0.5)
    np.clip(scaled, 0.0, top, out=scaled)
    return scaled.astype(dtype)  # truncation after +0.5: round half up
