"""Recognising out-of-memory failures. ORT raises plain `Exception` subclasses whose only
reliable signal is the message text, so this matches text (see DESIGN.md §2)."""

from __future__ import annotations

GPU_OOM_MARKERS = (
    "CUDA failure 2: out of memory",
    "CUDA error cudaErrorMemoryAllocation",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "8007000E",  # DirectML E_OUTOFMEMORY
)
ARENA_OOM_MARKERS = (
    "Failed to allocate memory for requested buffer of size",
    "Available memory of",
)
HOST_OOM_MARKERS = ("bad_alloc", "bad allocation")


def out_of_memory_resource(exc: BaseException, *, on_gpu: bool) -> str | None:
    """ "GPU memory" / "system memory" when `exc` is an out-of-memory failure, else None."""
    if isinstance(exc, MemoryError):
        return "system memory"
    text = str(exc)
    if any(marker in text for marker in GPU_OOM_MARKERS):
        return "GPU memory"
    if any(marker in text for marker in ARENA_OOM_MARKERS):
        return "GPU memory" if on_gpu else "system memory"
    if any(marker in text for marker in HOST_OOM_MARKERS):
        return "system memory"
    return None
