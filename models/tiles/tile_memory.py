"""Memory sums for tiled jobs (numpy-free arithmetic, bpy-free): the tile side a memory budget
allows, and the refusal of a result too big to hold at all."""

from __future__ import annotations

import math
import os

from ...runtime.errors import InvalidImageError
from ...runtime.measure.memory import available_system_memory_bytes
from .feather import feather_floor

MiB = 1 << 20

# --- tile size from a memory budget ------------------------------------------------------------

SYSTEM_RESERVE_BYTES = 512 * MiB
"""Left to the OS, Blender and other programs before free system RAM counts as budget."""
GPU_RESERVE_BYTES = 384 * MiB
"""Left for the CUDA context, cuDNN workspaces and the display before free VRAM counts."""
BUDGET_FRACTION = 0.5
"""Share of the remaining budget one tile may plan to use: ORT arena growth and fragmentation,
the output copy and the estimate's own error need the rest."""
DEFAULT_FEATURE_CHANNELS = 64  # num_feat of Real-ESRGAN (RRDB and compact) and most SR nets
MAX_AUTO_TILE = 2048
FALLBACK_TILE = 512  # when no memory figure can be read at all


def estimate_bytes_per_pixel(
    scale: int = 4, *, feature_channels: int = DEFAULT_FEATURE_CHANNELS, element_size: int = 4
) -> int:
    """Peak inference memory per *input* pixel of a tile, for a typical SR network.

    Model: at the peak a conv net holds about three feature maps of `feature_channels` at input
    resolution (a conv's input, its output and one residual/concat operand) plus two tensors of
    `feature_channels` at output resolution (RRDB nets upsample features before their last convs;
    pixel-shuffle nets need less). So `element_size * C * (3 + 2 * scale**2)` bytes: 8960 B for a
    4x fp32 model, 2816 B for 2x. It overestimates small nets, which is the safe side.
    """
    scale = max(1, int(scale))
    return int(element_size * feature_channels * (3 + 2 * scale * scale))


def tile_floor(overlap: int, min_tile: int = 32, feather: int = 0) -> int:
    """The smallest tile size worth running: a tile must own at least 8 pixels per side, and with
    feathered seams room for their ramps (models/tiles/feather.py)."""
    return max(int(min_tile), feather_floor(overlap, feather))


def refuse_oversized_result(
    height: int, width: int, scale: int, channels: int, *, label: str, available: int | None = None
) -> None:
    """Refuse a job whose float32 result alone would not fit in the memory available now
    (`available`, else the OS's figure; unknown: no refusal), before it is allocated, so the job
    stops at once with what to do instead of failing after minutes of runs or swapping."""
    need = int(height) * int(scale) * int(width) * int(scale) * int(channels) * 4
    if available is None:
        available = available_system_memory_bytes()
    if available is None or need <= available:
        return
    raise InvalidImageError(
        f"A {width}x{height} image upscaled x{scale} by {label} would be {width * scale}x{height * scale} "
        f"pixels: its result alone needs {_gib(need)} of memory (float32, {channels} channels), but only "
        f"{_gib(available)} is available. Use a model with a smaller scale, or a smaller image (crop it "
        "or scale it down first), or close programs that use memory."
    )


def _gib(count: int) -> str:
    return f"{count / (1 << 30):.1f} GiB" if count >= 1 << 30 else f"{count / MiB:.0f} MiB"


def auto_tile_size(
    bytes_per_pixel: int,
    *,
    budget_bytes: int | None = None,
    free_vram_bytes: int | None = None,
    overlap: int = 0,
    min_tile: int = 32,
    max_tile: int = MAX_AUTO_TILE,
    multiple: int = 16,
) -> int:
    """Largest square tile whose estimated peak fits the memory budget.

    Budget, first that applies: `budget_bytes` (the caller's own figure, used as given);
    `free_vram_bytes` (a CUDA device's free memory, minus GPU_RESERVE_BYTES); free system RAM
    (`available_system_memory_bytes()`, minus SYSTEM_RESERVE_BYTES). Then BUDGET_FRACTION of it,
    divided by `bytes_per_pixel` (see `estimate_bytes_per_pixel`), gives the tile area.
    """
    if budget_bytes is not None:
        usable = float(budget_bytes)
    elif free_vram_bytes is not None:
        usable = float(free_vram_bytes) - GPU_RESERVE_BYTES
    else:
        free = available_system_memory_bytes()
        if free is None:
            return max(tile_floor(overlap, min_tile), min(FALLBACK_TILE, max_tile))
        usable = float(free) - SYSTEM_RESERVE_BYTES
    usable = max(0.0, usable) * BUDGET_FRACTION
    side = int(math.sqrt(usable / max(1, int(bytes_per_pixel))))
    side -= side % max(1, int(multiple))
    return int(min(max(side, tile_floor(overlap, min_tile)), max_tile))


def total_system_memory_bytes() -> int | None:
    """The machine's physical RAM (a constant of the machine, never what other processes leave
    free: a plan sized from it is the same whatever else runs); None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None

