"""A generated shot with known depth, and a DA3-shaped stand-in whose output drifts per frame.

Each frame's pixels carry everything the stand-in needs, so its per-frame noise is deterministic:
- red: the true depth code (a vertical ramp, the background, plus a square that moves across and
  comes closer); after DA3's normalisation it is r = (R/255 - 0.485) / 0.229;
  With ``noise`` it also jitters by +-1 code per pixel, so alignment cannot be exact;
- green and blue: constant per frame, the frame's scale and shift noise (g, b after normalisation).

The stand-in outputs ``depth = r * mean(g) + mean(b) + OFFSET``: the true depth code under a
per-frame scale and shift, what a relative-depth model's drift looks like.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import save_model

OFFSET = 10.0  # keeps every output depth positive
SIZE = (56, 84)  # height, width: multiples of DA3's patch (14), so no stretching


def drifting_depth_model(path) -> Path:
    """depth = x[0] * mean(x[1]) + mean(x[2]) + OFFSET over a dynamic 1x3xHxW input."""
    def ints(name, values):
        return numpy_helper.from_array(np.array(values, np.int64), name)

    initializers = [
        ints("c0", [0]), ints("c1", [1]), ints("c2", [2]), ints("c3", [3]), ints("ax", [1]),
        numpy_helper.from_array(np.array(OFFSET, np.float32), "offset"),
    ]
    nodes = [
        helper.make_node("Slice", ["pixel_values", "c0", "c1", "ax"], ["r"]),
        helper.make_node("Slice", ["pixel_values", "c1", "c2", "ax"], ["g"]),
        helper.make_node("Slice", ["pixel_values", "c2", "c3", "ax"], ["b"]),
        helper.make_node("ReduceMean", ["g"], ["gm"], axes=[2, 3], keepdims=1),
        helper.make_node("ReduceMean", ["b"], ["bm"], axes=[2, 3], keepdims=1),
        helper.make_node("Mul", ["r", "gm"], ["rg"]),
        helper.make_node("Add", ["rg", "bm"], ["rgb"]),
        helper.make_node("Add", ["rgb", "offset"], ["depth"]),
    ]
    graph = helper.make_graph(
        nodes,
        "drifting_depth",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("depth", TensorProto.FLOAT, [1, 1, "H", "W"])],
        initializers,
    )
    return save_model(graph, path)


def object_box(index: int, count: int, size=SIZE) -> tuple[slice, slice]:
    """Where the moving square is in frame ``index`` (it crosses the lower half left to right)."""
    height, width = size
    side = height // 4
    left = int(round(4 + (width - side - 8) * index / max(count - 1, 1)))
    top = height // 2
    return slice(top, top + side), slice(left, left + side)


def shot_frame(index: int, count: int, *, noise: bool = True, size=SIZE) -> np.ndarray:
    """Frame ``index`` of ``count`` (uint8 RGB). The square gets closer (a smaller red code) over
    the shot, so each frame's own min..max changes while the background stays put."""
    height, width = size
    red = np.repeat(np.linspace(120.0, 250.0, height)[:, None], width, axis=1)
    rows, cols = object_box(index, count, size)
    red[rows, cols] = 100.0 - 60.0 * index / max(count - 1, 1)
    rng = np.random.default_rng(1000 + index)
    if noise:  # a pixel-level jitter of +-1 code, as a real model's output has beside its drift
        red = red + rng.integers(-1, 2, size=red.shape)
    green = 215.0 + (rng.uniform(-35.0, 35.0) if noise else 0.0)  # scale ~1.2..2.4
    blue = 128.0 + (rng.uniform(-90.0, 90.0) if noise else 0.0)  # shift ~-1.6..+1.6
    frame = np.stack([red, np.full_like(red, green), np.full_like(red, blue)], axis=2)
    return np.round(frame).astype(np.uint8)


def background_mask(count: int, size=SIZE, margin: int = 3) -> np.ndarray:
    """Pixels the square never comes near in any frame, away from the image border."""
    mask = np.zeros(size, bool)
    mask[margin:-margin, margin:-margin] = True
    for index in range(count):
        rows, cols = object_box(index, count, size)
        mask[max(rows.start - margin, 0) : rows.stop + margin, max(cols.start - margin, 0) : cols.stop + margin] = False
    return mask


def write_shot(folder: Path, count: int, *, noise: bool = True) -> Path:
    """shot_0001.png ... as files; returns the folder."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        Image.fromarray(shot_frame(index, count, noise=noise)).save(folder / f"shot_{index + 1:04d}.png")
    return folder
