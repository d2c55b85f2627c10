"""Tiled inference for image-to-image models, independent of any model family (numpy only).

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

Split on out-of-memory: when a run raises `InferenceOutOfMemoryError` (the runtime has already
evicted the session), the tile size is halved, the tiles not yet done are planned again with it,
`on_split` is called (the caller re-acquires its session there) and the job continues. Tiles
already done are kept. Below the floor (`min_tile`, and at least 2 * overlap + 8) the error is
re-raised as it came. Models with a fixed input size cannot be fed a smaller window, so for them
the error is re-raised at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...runtime.errors import InferenceOutOfMemoryError, MemoryBudgetError, ModelContractError
from ...runtime.oom import not_shrinking_with_tiles
from .tile_memory import (  # noqa: F401  (re-exported: the tiler's public names)
    BUDGET_FRACTION,
    DEFAULT_FEATURE_CHANNELS,
    FALLBACK_TILE,
    GPU_RESERVE_BYTES,
    MAX_AUTO_TILE,
    SYSTEM_RESERVE_BYTES,
    auto_tile_size,
    estimate_bytes_per_pixel,
    refuse_oversized_result,
    tile_floor,
)

# --- planning ------------------------------------------------------------------------------------


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


def _pair(size) -> tuple[int, int]:
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
        tile_h, tile_w = _pair(tile_size)
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


# --- running -------------------------------------------------------------------------------------


@dataclass
class TiledResult:
    image: np.ndarray  # (H*scale) x (W*scale) x C_out float32
    scale: int
    tile_size: tuple[int, int]  # window size of the final plan
    tiles_run: int  # successful runs of run_tile
    window_ran: tuple[int, int] = (0, 0)  # the largest window (h, w) that actually ran
    splits: list[dict] = field(default_factory=list)  # the tile_split event payloads


RunTile = Callable[[np.ndarray, bool], np.ndarray]


@dataclass(frozen=True)
class TiledRun:
    """One image's tiled run: what runs a window, how the image is cut, and whom the run tells.

    `run_tile(window HxWxC float32, last) -> (h*s)x(w*s)xC'`; it may also return a model's
    1xC'x(h*s)x(w*s) tensor: its owned part is pasted into the HxWxC' result transposed, in the
    same pass (and clipped to `clip` there, when given).
    `plan`: the TilePlan (window size, overlap, split rule).
    `last`: this image holds the operation's final run; then exactly the final tile of the
    *current* plan (re-planned after each split) is called with last=True.
    `scale`: the known output/input ratio, or None to read it from the first tile's output.
    `events`: a runtime EventLog; each split is emitted there as "tile_split".
    `on_split(new_tile_size, error)` after a split (the caller re-acquires its session there).
    `progress(fraction_of_area_done, tiles_done, tiles_in_plan)` after every tile.
    `not_finite(tile_result)`: called when a tile's owned part holds NaN or infinite values (it
    should raise). Seen in the paste's own pass, so checking costs no extra pass over the tile.
    `available_memory`: bytes the result may take (default: what the OS says is available); a
    larger result is refused (InvalidImageError) before it is allocated.
    """

    run_tile: RunTile
    plan: TilePlan
    last: bool = True
    scale: int | None = None
    label: str = "model"
    events: object = None
    on_split: Callable[[tuple[int, int], InferenceOutOfMemoryError], None] | None = None
    progress: Callable[[float, int, int], None] | None = None
    clip: tuple[float, float] | None = None
    not_finite: Callable[[np.ndarray], object] | None = None
    available_memory: int | None = None


def run_tiled(image: np.ndarray, run: TiledRun) -> TiledResult:
    """Run `run.run_tile` over the tiles of `run.plan` and assemble the result (see TiledRun)."""
    image = np.asarray(image)
    if image.ndim == 2:
        image = image[:, :, None]
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError("cannot tile an image without pixels")
    return _Tiler(image, run).assemble()


class _Tiler:
    """The state of one tiled run: the tiles still to run, the result so far, the splits."""

    def __init__(self, image: np.ndarray, run: TiledRun):
        self.image, self.run, self.plan = image, run, run.plan
        self.height, self.width = image.shape[:2]
        self.feather = int(run.plan.feather)
        self.scale = run.scale
        current = _pair(self.plan.tile_size) if self.plan.tile_size is not None else None
        self.pending = deque(self.plan.tiles(self.height, self.width, current))
        self.current = current if current is not None else self.pending[0].window_shape
        self.done_area = self.tiles_run = self.ran_h = self.ran_w = 0
        self.output = None
        self.splits: list[dict] = []

    def assemble(self) -> TiledResult:
        while self.pending:
            tile = self.pending[0]
            result, failure = self._try(tile)
            if failure is not None:
                self._split(failure)
                continue
            self._paste(tile, result)
            self._advance(tile)
        ran = (self.ran_h, self.ran_w)
        current = tuple(self.current)
        return TiledResult(self.output, int(self.scale), current, self.tiles_run, ran, self.splits)

    def _try(self, tile: Tile):
        """(the tile's result, None), or (None, the out-of-memory error) when a split may follow."""
        try:
            last = self.run.last and len(self.pending) == 1
            return self.run.run_tile(cut_window(self.image, tile), last), None
        except InferenceOutOfMemoryError as exc:
            if self.plan.fixed:
                raise
            if not self.plan.keeps_pixels:
                raise pixels_would_change(exc, self.current) from None
            if self.plan.split(self.current) is None:  # the smallest tile did not fit either
                raise not_shrinking_with_tiles(exc, max(self.current)) from None
            # Split and re-acquire only after this block: while it runs, the error's traceback holds
            # the frames of the failed run, and whatever they reference (the tile's buffers, any
            # session a caller's frame still holds) would live on beside the replacement session.
            return None, exc.with_traceback(None)

    def _split(self, failure: InferenceOutOfMemoryError) -> None:
        smaller = self.plan.split(self.current)
        payload = {
            "model": self.run.label,
            "old_tile_size": max(self.current),
            "new_tile_size": max(smaller),
            # over the budget: refused before the run (runtime/measure/budget.py), not run out of
            "reason": "memory_budget" if isinstance(failure, MemoryBudgetError) else "out_of_memory",
            "resource": failure.resource,
            "tiles_done": self.tiles_run,
        }
        self.current = smaller
        size = (self.height, self.width)
        self.pending = deque(
            t for old in self.pending for t in self.plan.tiles(*size, smaller, region=old.owned)
        )
        payload["tiles_left"] = len(self.pending)
        if self.run.events is not None:
            self.run.events.emit("tile_split", **payload)
        self.splits.append(payload)
        if self.run.on_split is not None:
            self.run.on_split(smaller, failure)

    def _paste(self, tile: Tile, result) -> None:
        result = np.asarray(result)
        if result.ndim == 2:
            result = result[:, :, None]
        nchw = result.ndim == 4
        out_hw, channels = (result.shape[2:], result.shape[1]) if nchw else (result.shape[:2], result.shape[2])
        self.scale = _check_scale(out_hw, tile, self.scale, self.run.label)
        self._make_room(channels)
        # paste.py's threads belong to the process that runs the model, never Blender's
        from .paste import blend, paste

        if self.feather:
            finite = blend(self.output, result, tile, self.scale, self.feather, nchw, self.run.clip)
        else:
            finite = paste(self.output, result, tile, self.scale, nchw, self.run.clip)
        if not finite and self.run.not_finite is not None:
            self.run.not_finite(result)

    def _make_room(self, channels: int) -> None:
        """The result image, allocated at the first tile (its scale and channels known then)."""
        label, available = self.run.label, self.run.available_memory
        if self.output is None:
            height, width, scale = self.height, self.width, self.scale
            refuse_oversized_result(height, width, scale, channels, label=label, available=available)
            # zeroed (pages still untouched until pasted) where tiles add their weighted pixels
            shape = (self.height * self.scale, self.width * self.scale, channels)
            self.output = (np.zeros if self.feather else np.empty)(shape, np.float32)
        elif channels != self.output.shape[2]:
            raise ModelContractError(
                f"{label} returned {channels} channel(s) for one tile and {self.output.shape[2]} for another."
            )

    def _advance(self, tile: Tile) -> None:
        self.pending.popleft()
        self.ran_h, self.ran_w = max(self.ran_h, tile.window_shape[0]), max(self.ran_w, tile.window_shape[1])
        self.tiles_run += 1
        self.done_area += tile.area
        if self.run.progress is not None:
            fraction = self.done_area / (self.height * self.width)
            self.run.progress(fraction, self.tiles_run, self.tiles_run + len(self.pending))


def pixels_would_change(exc: InferenceOutOfMemoryError, window: tuple[int, int]) -> InferenceOutOfMemoryError:
    """The one line for a plan whose windows cannot shrink without changing the result."""
    return type(exc)(
        f"Not run: {exc.model}'s {window[1]}x{window[0]} px windows did not fit in the {exc.resource} free "
        "now, and smaller windows would change its pixels (its overlap does not cover its receptive "
        "radius), so the job stops rather than give another result. Close programs using memory, or run "
        "it again when the machine is less busy.",
        model=exc.model, device=exc.device, resource=exc.resource, detail=exc.detail,
    )  # fmt: skip


def whole_scale(in_hw, out_hw, label: str) -> int:
    """The integer factor that maps ``in_hw`` to ``out_hw``; ModelContractError when there is none."""
    (in_h, in_w), (out_h, out_w) = in_hw, out_hw
    if out_h % in_h or out_w % in_w or out_h // in_h != out_w // in_w or out_h < in_h:
        raise ModelContractError(
            f"{label} maps {in_w}x{in_h} to {out_w}x{out_h}: expected a whole-number "
            "scale (the same >= 1 integer for width and height). Use a super-resolution model "
            "whose output is an integer multiple of its input."
        )
    return out_h // in_h


def _check_scale(out_hw, tile: Tile, scale: int | None, label: str) -> int:
    found = whole_scale(tile.window_shape, tuple(out_hw), label)
    if scale is not None and found != scale:
        win_h, win_w = tile.window_shape
        out_h, out_w = out_hw
        raise ModelContractError(
            f"{label} turned a {win_w}x{win_h} input into {out_w}x{out_h}; expected "
            f"{win_w * scale}x{win_h * scale} (scale {scale})."
        )
    return found
