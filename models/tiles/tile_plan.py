"""Where a tiled run's windows go (numpy only): the tiles that cover an image, each model window
cut from it, and the plan a caller decides once (window size, overlap, split rule, blending).

Vocabulary:
- *tile size*: the side of the window a model run sees (input pixels), overlap included. For a
  model with a fixed input size it is that size; for dynamic models it is chosen (or halved on
  out-of-memory).
- *overlap*: context pixels on each side of a tile that are computed and then cropped away. When
  the overlap is at least the model's receptive radius, every output pixel sees exactly the input
  it would see in one untiled run, so the seams disappear (crop, no blending needed).
- *owned region*: the part of the image a tile's cropped result covers. Owned regions partition
  the image.

Windows are clipped to the image: at the image border the model sees what it sees in one
whole-image run (its own padding), so "untiled" means one run on the image itself, with no padded
copy, and with an overlap at least the model's receptive radius a tiled run equals it bit for bit,
borders included. Only what a fixed input size or a size multiple needs beyond the image is
gathered by reflection (numpy's "reflect" mode), never building a padded copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .tile_memory import tile_floor


@dataclass(frozen=True)
class Tile:
    """Owned region [y0, y1) x [x0, x1) and model window [wy0, wy1) x [wx0, wx1), image coordinates.

    The window may reach outside the image (negative or past the size): that part is reflected.
    """

    y0: int
    x0: int
    y1: int
    x1: int
    wy0: int
    wx0: int
    wy1: int
    wx1: int

    @property
    def owned(self) -> tuple[int, int, int, int]:
        return self.y0, self.x0, self.y1, self.x1

    @property
    def window_shape(self) -> tuple[int, int]:
        return self.wy1 - self.wy0, self.wx1 - self.wx0

    @property
    def area(self) -> int:
        return (self.y1 - self.y0) * (self.x1 - self.x0)


def size_pair(size) -> tuple[int, int]:
    if isinstance(size, (tuple, list)):
        return int(size[0]), int(size[1])
    return int(size), int(size)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple if multiple > 1 else value


def _splits(start: int, stop: int, core: int) -> list[int]:
    """Balanced cut points: as few pieces of at most `core` as possible, sizes differing by <= 1."""
    length = stop - start
    count = max(1, -(-length // core))
    return [start + (k * length) // count for k in range(count + 1)]


def plan_tiles(
    height: int,
    width: int,
    tile_size,
    overlap: int,
    *,
    fixed: bool = False,
    region: tuple[int, int, int, int] | None = None,
    multiple: int = 1,
    uniform: bool = False,
) -> list[Tile]:
    """Tiles covering `region` (default: the whole image), row-major.

    `tile_size` is an int, an (h, w) pair, or None for one window over the whole image. With
    `fixed`, every window is exactly `tile_size` (a fixed-shape model); with `uniform`, exactly
    `tile_size` capped at the image (grown into it at its borders, never past it but for a
    `multiple`); otherwise a window is the owned region plus `overlap` on each side, clipped to
    the image, grown to a `multiple`.
    """
    overlap = int(overlap)
    if overlap < 0:
        raise ValueError(f"overlap must be >= 0, got {overlap}")
    ry0, rx0, ry1, rx1 = region or (0, 0, int(height), int(width))
    if tile_size is None:
        if fixed:
            raise ValueError("a fixed-shape model needs its tile size")
        tile_h, tile_w = (ry1 - ry0) + 2 * overlap, (rx1 - rx0) + 2 * overlap
    else:
        tile_h, tile_w = size_pair(tile_size)
    core_h, core_w = tile_h - 2 * overlap, tile_w - 2 * overlap
    if core_h <= 0 or core_w <= 0:
        raise ValueError(f"tile size {tile_h}x{tile_w} leaves nothing inside an overlap of {overlap} px")
    rows = _splits(ry0, ry1, core_h)
    cols = _splits(rx0, rx1, core_w)
    tiles = []
    need_h, need_w = (tile_h, tile_w) if fixed else (None, None)
    if uniform and not fixed:
        need_h, need_w = _round_up(min(tile_h, int(height)), multiple), _round_up(min(tile_w, int(width)), multiple)
    for y0, y1 in zip(rows[:-1], rows[1:], strict=True):
        wy0, wy1 = _window(y0, y1, int(height), overlap, need_h, multiple)
        for x0, x1 in zip(cols[:-1], cols[1:], strict=True):
            wx0, wx1 = _window(x0, x1, int(width), overlap, need_w, multiple)
            tiles.append(Tile(y0, x0, y1, x1, wy0, wx0, wy1, wx1))
    return tiles


def _window(start: int, stop: int, size: int, overlap: int, fixed: int | None, multiple: int):
    """The window along one axis: the owned span plus `overlap`, clipped to the image (the model's
    own border handling then applies at the image border, exactly as in one whole-image run).
    Only what a fixed size or the size multiple needs beyond the image is reflected, and the
    window grows into the image first."""
    begin, end = max(0, start - overlap), min(size, stop + overlap)
    need = fixed if fixed is not None else _round_up(end - begin, multiple)
    extra = need - (end - begin)
    if extra < 0:  # a fixed window smaller than owned span + overlap: centre the owned span
        begin = start - (need - (stop - start)) // 2
        return begin, begin + need
    grow = min(extra, size - end)
    end, extra = end + grow, extra - grow
    grow = min(extra, begin)
    begin, extra = begin - grow, extra - grow
    return begin, end + extra


def reflect_indices(start: int, stop: int, size: int) -> np.ndarray:
    """Indices of positions [start, stop) into an axis of `size`, mirrored like np.pad 'reflect'."""
    index = np.arange(start, stop)
    if size == 1:
        return np.zeros_like(index)
    period = 2 * (size - 1)
    index = np.mod(index, period)
    return np.where(index >= size, period - index, index)


def cut_window(image: np.ndarray, tile: Tile) -> np.ndarray:
    """The tile's model window from `image` (HxWxC), reflecting past the borders.

    Inside the image it is a read-only view (callers convert it to a tensor anyway, which copies
    it; one pass fewer per tile), else a new array.
    """
    height, width = image.shape[:2]
    if tile.wy0 >= 0 and tile.wx0 >= 0 and tile.wy1 <= height and tile.wx1 <= width:
        view = image[tile.wy0 : tile.wy1, tile.wx0 : tile.wx1]
        view.flags.writeable = False
        return view
    rows = reflect_indices(tile.wy0, tile.wy1, height)
    cols = reflect_indices(tile.wx0, tile.wx1, width)
    return np.take(np.take(image, rows, axis=0), cols, axis=1)


@dataclass(frozen=True)
class TilePlan:
    """How an image is cut into model windows, and cut again when memory runs out (after
    chaiNNer's `Tiler`): what a caller decides once, and `run_tiled` reads.

    `tile_size`: the window side in input pixels, overlap included (an int or an (h, w) pair), or
    None for one window over the whole image. `fixed`: it is the model's own input size, so every
    window is exactly that and is never split. `multiple`: windows are grown to a multiple of it.
    `min_tile`: the split rule's floor (raised to what the overlap and the feather need).
    `feather`: 0 crops each tile at its owned region (exact when the overlap covers the receptive
    radius); > 0 blends neighbours across bands of 2 * feather px (models/tiles/feather.py), for an
    overlap below the radius; it needs feather <= overlap. `uniform`: every window exactly
    `tile_size`, capped at the image (grown into it at its borders: see `plan_tiles`), so the model
    sees one input shape: ORT plans and keeps memory per input shape (its memory pattern, arena
    chunks), and the clipped edge windows' other shapes each grew the arena by a window's working
    memory again. `keeps_pixels`: a smaller window gives the same pixels (the overlap covers a
    proven radius); False: memory short at run time stops the job with one line, never a split,
    so the same job gives the same pixels whatever else holds memory on the machine.
    """

    tile_size: int | tuple[int, int] | None
    overlap: int = 0
    fixed: bool = False
    multiple: int = 1
    min_tile: int = 32
    feather: int = 0
    uniform: bool = False
    keeps_pixels: bool = True

    def __post_init__(self):
        if self.feather and self.feather > self.overlap:
            raise ValueError(f"a {self.feather} px feather needs an overlap of at least that, got {self.overlap}")

    @property
    def floor(self) -> int:
        """The smallest window side a split may go down to."""
        return tile_floor(self.overlap, self.min_tile, self.feather)

    def split(self, current: tuple[int, int]) -> tuple[int, int] | None:
        """The split rule, after running out of memory: half the side, down to the floor (one
        last try at the floor itself); None when no smaller window is possible."""
        side = max(current)
        if self.fixed or side <= self.floor:
            return None
        new = max(side // 2, self.floor)
        return new, new

    def tiles(self, height: int, width: int, tile_size, region=None) -> list[Tile]:
        """The tiles of `region` (default: the whole image) with windows of `tile_size`."""
        return plan_tiles(
            height, width, tile_size, self.overlap, fixed=self.fixed, region=region, multiple=self.multiple,
            uniform=self.uniform,
        )  # fmt: skip
