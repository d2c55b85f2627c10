"""Image plumbing shared by every model family, in numpy only (Blender ships numpy, not Pillow).

Images are HxW, HxWxC (C = 1..4) arrays: uint8, uint16 or float (float = [0, 1] display values,
HDR allowed). Everything here returns float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ..runtime.errors import InvalidImageError


@dataclass
class PreparedImage:
    rgb: np.ndarray  # HxWx3 float32, finite; HDR values kept (callers clip when the model needs)
    alpha: np.ndarray | None  # HxW float32 in [0, 1], or None when the source had none
    source_dtype: np.dtype
    warnings: list[str] = field(default_factory=list)

    @property
    def size(self) -> tuple[int, int]:
        return self.rgb.shape[0], self.rgb.shape[1]

    @property
    def kind(self) -> str:
        """What the source's samples were: "8-bit", "16-bit" or "float" (the result is written alike)."""
        if np.issubdtype(self.source_dtype, np.floating):
            return "float"
        return "16-bit" if self.source_dtype == np.uint16 else "8-bit"


def check_shape(shape: tuple[int, ...], name: str = "image") -> None:
    """InvalidImageError unless ``shape`` is an image's: HxW or HxWxC with C from 1 to 4."""
    if len(shape) not in (2, 3) or (len(shape) == 3 and shape[2] not in (1, 2, 3, 4)):
        raise InvalidImageError(
            f"{name} has shape {tuple(shape)}; expected HxW (grey), HxWx2 (grey+alpha), HxWx3 (RGB) or HxWx4 (RGBA)."
        )


def prepare_image(image, *, name: str = "image") -> PreparedImage:
    """Validate and convert any supported image to float32 RGB (+ optional alpha)."""
    array = np.asarray(image)
    check_shape(array.shape, name)
    if array.ndim == 2:
        array = array[:, :, None]
    height, width, channels = array.shape
    if height == 0 or width == 0:
        raise InvalidImageError(f"{name} has no pixels ({width}x{height}); load or render the image first.")
    source_dtype = array.dtype
    if array.dtype in (np.uint8, np.uint16):
        data = array.astype(np.float32)
        data /= 255.0 if array.dtype == np.uint8 else 65535.0  # in place: one full-size float array, not two
    elif np.issubdtype(array.dtype, np.floating):
        data = array.astype(np.float32, copy=True)
    elif array.dtype == np.bool_:
        data = array.astype(np.float32)
    else:
        raise InvalidImageError(f"{name} has pixel type {array.dtype}; use uint8, uint16 or float.")
    warnings = []
    # min and max first (NaN propagates, an infinity is one of them): no mask for a clean image
    if not (np.isfinite(data.min()) and np.isfinite(data.max())):
        bad = ~np.isfinite(data)
        count = int(bad.any(axis=2).sum())
        # a few NaN/Inf pixels (fireflies in a render) must not poison a whole model run
        data = np.nan_to_num(data, nan=0.0, posinf=1.0, neginf=0.0)
        warnings.append(
            f"{name}: {count} pixel(s) had NaN/Inf values and were replaced (NaN/-Inf -> 0, +Inf -> 1)."
        )
    if channels in (1, 2):
        rgb = np.repeat(data[:, :, :1], 3, axis=2)
    else:
        rgb = data[:, :, :3]
    alpha = None
    if channels in (2, 4):
        alpha = np.clip(data[:, :, -1], 0.0, 1.0)
    return PreparedImage(np.ascontiguousarray(rgb), alpha, source_dtype, warnings)


def to_nchw(rgb: np.ndarray, dtype=np.float32) -> np.ndarray:
    """HxWx3 -> 1x3xHxW, contiguous (what ONNX image models take)."""
    return np.ascontiguousarray(rgb.transpose(2, 0, 1)[None], dtype=dtype)


def from_nchw(tensor: np.ndarray) -> np.ndarray:
    """1xCxHxW -> HxWxC float32."""
    array = np.asarray(tensor)
    if array.ndim == 4:
        array = array[0]
    return np.ascontiguousarray(array.transpose(1, 2, 0), dtype=np.float32)


# ImageNet's per-channel statistics, which most vision backbones were trained with.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def normalization_constants(mean, std) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean/std from a catalog entry; None means 0 and 1 (plain /255 input)."""
    mean = (0.0, 0.0, 0.0) if mean is None else tuple(float(v) for v in mean)
    std = (1.0, 1.0, 1.0) if std is None else tuple(float(v) for v in std)
    if any(v == 0 for v in std):
        raise ValueError(f"std must not contain 0, got {std}")
    return mean, std


def normalize(rgb: np.ndarray, mean, std) -> np.ndarray:
    return (rgb - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)


# ---- resampling (separable, as two matrix products) --------------------------------------------


def _kernel(name: str):
    if name == "lanczos3":
        return 3.0, lambda x: np.where(np.abs(x) < 3.0, np.sinc(x) * np.sinc(x / 3.0), 0.0)
    if name == "cubic":  # Keys, a = -0.5

        def cubic(x):
            x = np.abs(x)
            return np.where(
                x <= 1, (1.5 * x - 2.5) * x * x + 1, np.where(x < 2, ((-0.5 * x + 2.5) * x - 4) * x + 2, 0.0)
            )

        return 2.0, cubic
    if name == "linear":
        return 1.0, lambda x: np.maximum(0.0, 1.0 - np.abs(x))
    if name == "nearest":
        return 0.5, lambda x: ((x > -0.5) & (x <= 0.5)).astype(np.float64)
    raise ValueError(f"unknown resampling kernel {name!r}")


@lru_cache(maxsize=64)
def resample_band(in_size: int, out_size: int, kernel: str = "lanczos3") -> tuple[np.ndarray, np.ndarray]:
    """The resampling weights as a band: (out_size, taps) source indices and their float32 weights;
    antialiased when shrinking (kernel stretched by the ratio), edges clamped. A dense
    out_size x in_size product does in_size multiply-adds per output where the kernel has a
    handful (1080 vs 13 for a lanczos3 1080 -> 630 shrink): dense, MoGe-2's resizes of a 1080p
    frame took about a tenth of its run on 2 cores."""
    support, function = _kernel(kernel)
    scale = in_size / out_size
    stretch = max(scale, 1.0) if kernel != "nearest" else 1.0
    centres = (np.arange(out_size) + 0.5) * scale - 0.5
    radius = support * stretch
    taps = np.arange(int(np.floor(-radius)), int(np.ceil(radius)) + 1)
    positions = np.floor(centres)[:, None] + taps[None, :]
    weights = function((positions - centres[:, None]) / stretch)
    weights /= np.maximum(weights.sum(axis=1, keepdims=True), 1e-12)
    clamped = np.clip(positions, 0, in_size - 1).astype(np.int64)  # clamp-to-edge
    width = min(in_size, int((clamped[:, -1] - clamped[:, 0]).max()) + 1)  # positions rise along a row
    first = np.minimum(clamped[:, 0], in_size - width)
    band = np.zeros((out_size, width), np.float64)  # taps clamped onto one pixel add up there
    np.add.at(band, (np.repeat(np.arange(out_size), len(taps)), (clamped - first[:, None]).ravel()), weights.ravel())
    indices = first[:, None] + np.arange(width)
    band = band.astype(np.float32)
    indices.setflags(write=False)
    band.setflags(write=False)
    return indices, band


@lru_cache(maxsize=64)
def resample_matrix(in_size: int, out_size: int, kernel: str = "lanczos3") -> np.ndarray:
    """out_size x in_size weights: :func:`resample_band` as a dense matrix."""
    indices, weights = resample_band(in_size, out_size, kernel)
    matrix = np.zeros((out_size, in_size), np.float32)
    np.put_along_axis(matrix, indices, weights, axis=1)
    matrix.setflags(write=False)
    return matrix


RESAMPLE_BLOCK = 64  # output rows per matrix product: a band this tall spans ~64 x scale + taps inputs


@lru_cache(maxsize=64)
def _resample_blocks(in_size: int, out_size: int, kernel: str) -> tuple:
    """The band cut into dense blocks, (start, stop, first input, end input, weights): a few
    BLAS products per pass beat a gather and a multiply-add per tap (one pass over memory each)
    by 1.3-3.6x on the adapters' 1080p resizes."""
    indices, weights = resample_band(in_size, out_size, kernel)
    blocks = []
    for start in range(0, out_size, RESAMPLE_BLOCK):
        stop = min(out_size, start + RESAMPLE_BLOCK)
        low, high = int(indices[start:stop, 0].min()), int(indices[start:stop, -1].max()) + 1
        local = np.zeros((stop - start, high - low), np.float32)
        np.put_along_axis(local, indices[start:stop] - low, weights[start:stop], axis=1)
        local.setflags(write=False)
        blocks.append((start, stop, low, high, local))
    return tuple(blocks)


def _resample_rows(array: np.ndarray, out_size: int, kernel: str) -> np.ndarray:
    """Resample axis 0 of a C-contiguous float32 array."""
    rows = array.reshape(array.shape[0], -1)
    result = np.empty((out_size, rows.shape[1]), np.float32)
    for start, stop, low, high, local in _resample_blocks(array.shape[0], out_size, kernel):
        np.matmul(local, rows[low:high], out=result[start:stop])
    return result.reshape((out_size, *array.shape[1:]))


def resize(image: np.ndarray, size: tuple[int, int], kernel: str = "lanczos3") -> np.ndarray:
    """Resize HxW or HxWxC float image to (height, width)."""
    out_h, out_w = int(size[0]), int(size[1])
    if out_h <= 0 or out_w <= 0:
        raise ValueError(f"cannot resize to {out_w}x{out_h}")
    array = np.asarray(image, np.float32)
    squeeze = array.ndim == 2
    if squeeze:
        array = array[:, :, None]
    in_h, in_w, _ = array.shape
    if (in_h, in_w) == (out_h, out_w):
        result = array.copy()
    else:
        # rows, then columns as rows of the transposed image: each product reads contiguous rows
        result = array if in_h == out_h else _resample_rows(np.ascontiguousarray(array), out_h, kernel)
        if in_w != out_w:
            columns = _resample_rows(np.ascontiguousarray(result.transpose(1, 0, 2)), out_w, kernel)
            result = np.ascontiguousarray(columns.transpose(1, 0, 2))
    return result[:, :, 0] if squeeze else result


def resize_clipped(image: np.ndarray, size: tuple[int, int], kernel: str = "lanczos3") -> np.ndarray:
    """`resize`, clipped to [0, 1] (lanczos and cubic overshoot at edges) in place: its result is a
    new array, so no second one is made."""
    result = resize(image, size, kernel)
    return np.clip(result, 0.0, 1.0, out=result)


def fit_multiple(height: int, width: int, long_side: int, multiple: int) -> tuple[int, int]:
    """Depth Anything 3's own size rule (`upper_bound_resize`), in its two steps.

    1. Unless the long side already is `long_side`, scale so it is, and round each side to an
       integer (Python's round: halves to even), at least 1.
    2. Round each side to the nearest multiple of `multiple`, ties going *up*.
    Upstream then keeps a side of at least 1; here at least one `multiple` (a side under
    `multiple` / 2 only happens beyond a 1:36 aspect ratio, and no ViT takes a zero-patch side).
    """
    if max(height, width) != long_side:
        scale = long_side / float(max(height, width))
        height, width = max(1, int(round(height * scale))), max(1, int(round(width * scale)))

    def nearest(side: int) -> int:
        down = (side // multiple) * multiple
        up = down + multiple
        return up if up - side <= side - down else down

    return max(multiple, nearest(height)), max(multiple, nearest(width))


def clip_for_model(rgb: np.ndarray, high: float, model: str, *, hdr_hint: str = "") -> str | None:
    """Clip ``rgb`` (the caller's own copy) in place to [0, high] for a model trained on that range;
    what was clipped, in words, or None. ``hdr_hint``: what keeps values above 1 instead, said when
    they were clipped."""
    low, top = float(rgb.min()), float(rgb.max())  # two reads and no masks for the usual in-range image
    if low >= 0.0 and top <= high:
        return None
    outside = int(((rgb < 0.0) | (rgb > high)).any(axis=2).sum())
    np.clip(rgb, 0.0, high, out=rgb)
    if top <= high:
        kept = "; values above 1 are kept" if high > 1.0 else ""
        return f"{outside} pixel(s) below 0 (lowest {low:.6g}) were clipped to 0 for {model}{kept}."
    return (
        f"{outside} pixel(s) outside [0, 1] (lowest {low:.6g}, highest {top:.6g}) were clipped to [0, 1] for "
        f"{model}, which takes [0, 1]" + (f"; {hdr_hint}." if hdr_hint else ".")
    )


def to_rgba(array: np.ndarray) -> np.ndarray:
    """``(H, W)`` or ``(H, W, C)`` with C in 1..4 -> float32 ``(H, W, 4)`` (grey -> RGB, alpha 1)."""
    arr = np.asarray(array)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 2, 3, 4):
        raise InvalidImageError(
            f"Expected an image array of shape (H, W) or (H, W, 1..4), got shape {tuple(np.shape(array))}."
        )
    h, w, c = arr.shape
    if h == 0 or w == 0:
        raise InvalidImageError(f"The image array is empty (shape {tuple(arr.shape)}).")
    if c == 4:
        return np.ascontiguousarray(arr, dtype=np.float32)
    out = np.empty((h, w, 4), dtype=np.float32)
    if c == 3:
        out[..., :3] = arr
        out[..., 3] = 1.0
    elif c == 2:
        out[..., :3] = arr[..., :1]
        out[..., 3] = arr[..., 1]
    else:
        out[..., :3] = arr
        out[..., 3] = 1.0
    return out
