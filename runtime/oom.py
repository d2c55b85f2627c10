"""Recognising out-of-memory failures. ORT raises plain `Exception` subclasses whose only
reliable signal is the message text, so this matches text.

The CUDA provider formats library errors as ``"<lib> failure <code>: <name or text> ; GPU=<id> ;
hostname=... ; expr=..."`` (cuda_call.cc), with the text from ``cudaGetErrorString``, its own
cuBLAS name table, or ``cudnnGetErrorString``. Only the allocation failures are matched, so an
illegal address or a bad parameter is reported as the error it is, not as memory to free.
"""

from __future__ import annotations

import re

from .errors import InferenceOutOfMemoryError, MemoryBudgetError, first_line

_REQUESTED = re.compile(r"(?:requested buffer of size|requested bytes of) (\d+)")  # BFCArena's two texts

GPU_OOM_MARKERS = (
    "CUDA failure 2: out of memory",  # cudaErrorMemoryAllocation (2) as cudaGetErrorString says it
    "CUDA error cudaErrorMemoryAllocation",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",  # cuDNN 8
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",  # cuDNN 9 (ALLOC_FAILED is gone)
    "8007000E",  # DirectML E_OUTOFMEMORY
)
ARENA_OOM_MARKERS = (
    # BFCArena (bfc_arena.cc); the same code path for the CPU arena and CUDA's gpu_mem_limit
    "Failed to allocate memory for requested buffer of size",
    "Available memory of",
)
HOST_OOM_MARKERS = (
    "bad_alloc",
    "bad allocation",
    "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",  # cuDNN 9: host RAM for its own plans
)


def out_of_memory_resource(exc: BaseException, *, on_gpu: bool) -> str | None:
    """ "GPU memory" / "system memory" when `exc` is an out-of-memory failure, else None."""
    if isinstance(exc, MemoryError):
        return "system memory"
    text = str(exc)
    if any(marker in text for marker in HOST_OOM_MARKERS):
        return "system memory"
    if any(marker in text for marker in GPU_OOM_MARKERS):
        return "GPU memory"
    if any(marker in text for marker in ARENA_OOM_MARKERS):
        return "GPU memory" if on_gpu else "system memory"
    return None


def out_of_memory_error(exc: MemoryError, *, model: str = "", device: str = "CPU"):
    """A bare ``MemoryError`` (numpy's "Unable to allocate 1.2 GiB for an array with shape ...", a
    failed ``bytearray``) as the runtime's out-of-memory error, keeping what was asked for."""
    if isinstance(exc, InferenceOutOfMemoryError):
        return exc
    asked = first_line(exc) if str(exc).strip() else "an allocation failed"
    return InferenceOutOfMemoryError(
        f"Out of system memory: {asked.rstrip('.')}. The memory this process may still take (free RAM, "
        "its address-space limit `ulimit -v`, its container's memory.max) is smaller: use a smaller "
        "image or a model with a smaller scale, raise the limit, or close programs that use memory.",
        model=model,
        device=device,
        resource="system memory",
        detail=str(exc),
    )


def run_out_of_memory_error(handle, resource: str, cause: BaseException) -> InferenceOutOfMemoryError:
    """A model run that ran out of `resource` (``out_of_memory_resource``) on `handle`'s device
    (runtime/operation.py has freed what it held), with what the artist can do about it."""
    return InferenceOutOfMemoryError(
        f"Out of {resource} while running {handle.model_name} on {handle.device_label}. "
        "Try a smaller tile size or a lower resolution, or close other programs using the memory"
        + (", or switch the device to CPU in the add-on preferences." if handle.gpu_device_id is not None else "."),
        model=handle.model_name,
        device=handle.device_label,
        resource=resource,
        detail=str(cause),
    )


def requested_bytes(text: str) -> int | None:
    """The one allocation ORT's arena could not make, if its message says."""
    match = _REQUESTED.search(text or "")
    return int(match.group(1)) if match else None


def not_shrinking_with_tiles(exc: InferenceOutOfMemoryError, tile: int) -> InferenceOutOfMemoryError:
    """The tiler's last word when even its smallest tile ran out: smaller tiles are no advice."""
    if isinstance(exc, MemoryBudgetError):
        return exc  # the budget's own message already says what was short and what was done
    asked = requested_bytes(exc.detail)
    block = f"; it asked for {asked / 2**20:,.0f} MiB in one block" if asked else ""
    return InferenceOutOfMemoryError(
        f"Out of {exc.resource} while running {exc.model} on {exc.device}, even with {tile} px tiles, the "
        f"smallest{block}: what this model needs does not shrink with the tile size. Close programs "
        "using the memory, raise the memory limit, or use another model or device.",
        model=exc.model,
        device=exc.device,
        resource=exc.resource,
        detail=exc.detail,
    )
