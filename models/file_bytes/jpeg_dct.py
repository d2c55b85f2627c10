"""The forward DCT and quantisation of a JPEG's 8x8 blocks as Blender's writer computes them
(libjpeg-turbo with JDCT_FLOAT on x86-64 SIMD): the AAN float DCT of jfdctflt.c in float32, the same
operations in the same order, then each coefficient times its float32 divisor, rounded to nearest
even (jsimd_quantize_float's cvtps2dq). An exact DCT rounded half up gave a file that decoded a few
levels away from Blender's in some blocks; this one decodes to Blender's very pixels
(tests/test_jpeg_bytes.py). Vectorised over blocks: a block's rows and columns are the first two
axes of an (8, 8, blocks) array, so every step is one numpy operation on all blocks."""

from __future__ import annotations

import numpy as np

_F = np.float32
# jcdctmgr.c: the AAN DCT's outputs are scaled by these (times 8); the divisors undo it
_AAN_SCALE = np.array([1.0, 1.387039845, 1.306562965, 1.175875602, 1.0, 0.785694958, 0.541196100, 0.275899379])


def divisors(table: np.ndarray) -> np.ndarray:
    """(8, 8, 1) float32: jcdctmgr.c's fdtbl for a quantisation table (natural order)."""
    scale = table.reshape(8, 8).astype(np.float64) * _AAN_SCALE[:, None] * _AAN_SCALE[None, :] * 8.0
    return (1.0 / scale).astype(np.float32)[:, :, None]


def _one_pass(data: np.ndarray) -> np.ndarray:
    """jfdctflt.c's 8-point pass along the first axis of ``data`` (8, ...)."""
    x = data
    tmp0, tmp7 = x[0] + x[7], x[0] - x[7]
    tmp1, tmp6 = x[1] + x[6], x[1] - x[6]
    tmp2, tmp5 = x[2] + x[5], x[2] - x[5]
    tmp3, tmp4 = x[3] + x[4], x[3] - x[4]
    out = np.empty_like(data)
    # even part
    tmp10, tmp13 = tmp0 + tmp3, tmp0 - tmp3
    tmp11, tmp12 = tmp1 + tmp2, tmp1 - tmp2
    np.add(tmp10, tmp11, out=out[0])
    np.subtract(tmp10, tmp11, out=out[4])
    z1 = (tmp12 + tmp13) * _F(0.707106781)
    np.add(tmp13, z1, out=out[2])
    np.subtract(tmp13, z1, out=out[6])
    # odd part
    tmp10, tmp11, tmp12 = tmp4 + tmp5, tmp5 + tmp6, tmp6 + tmp7
    z5 = (tmp10 - tmp12) * _F(0.382683433)
    z2 = _F(0.541196100) * tmp10 + z5
    z4 = _F(1.306562965) * tmp12 + z5
    z3 = tmp11 * _F(0.707106781)
    z11, z13 = tmp7 + z3, tmp7 - z3
    np.add(z13, z2, out=out[5])
    np.subtract(z13, z2, out=out[3])
    np.add(z11, z4, out=out[1])
    np.subtract(z11, z4, out=out[7])
    return out


def quantised(samples: np.ndarray, block_divisors: np.ndarray, zigzag: np.ndarray) -> np.ndarray:
    """(blocks, 64) int32 coefficients in ``zigzag`` order of ``samples`` ((8 rows, 8 columns,
    blocks) float32, levels minus 128)."""
    columns_done = _one_pass(samples.transpose(1, 0, 2)).transpose(1, 0, 2)  # each row's pass
    coefficients = _one_pass(columns_done)  # then each column's
    coefficients *= block_divisors
    np.rint(coefficients, out=coefficients)
    return coefficients.reshape(64, -1)[zigzag].T.astype(np.int32)
