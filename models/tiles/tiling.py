"""Tiled inference for image-to-image models, independent of any model family (numpy only): a
plan's windows run one by one (tile_plan.py says where they go and what the words mean), each
result pasted into the output as it comes.

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
from .tile_plan import Tile, TilePlan, cut_window, size_pair


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
        current = size_pair(self.plan.tile_size) if self.plan.tile_size is not None else None
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
