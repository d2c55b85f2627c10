"""What every model adapter shares: job options, progress, contract checks, output checks.

Adapter shape (one module per family): `run(images, model_path, options) -> result(s)`, where
`images` is one image, a list of frames, or a lazy frame source (anything with `__len__` and
`__iter__`, read one frame at a time, e.g. models/batch/sequence.py's); several frames are ONE runtime
operation (only the final run of the final frame releases memory: models/frame_loop.py runs that
loop for every adapter). With `options.on_result` each frame's result is handed out as soon as it
is ready instead of being collected, so a long sequence keeps memory flat.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Sequence, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..runtime.errors import InvalidModelOutputError, ModelContractError
from ..runtime.settings import MemoryBudgets

if TYPE_CHECKING:  # the runtime itself loads where a model runs (the worker), not with these options
    from ..runtime import Runtime, SessionHandle

ProgressCallback = Callable[[float, str], None]


@dataclass
class RunOptions:
    device: str = "auto"
    progress: ProgressCallback | None = None  # (fraction 0..1, stage text)
    cancel: object = None  # threading.Event or callable -> bool; checked between runs
    runtime: Runtime | None = None  # default: the process-wide runtime
    on_result: Callable[[object], None] | None = None  # each frame's result, in order (not kept)
    budgets: MemoryBudgets | None = None  # the job's memory budgets (None: the runtime's settings')

    def get_runtime(self) -> Runtime:
        from ..runtime import get_runtime

        return self.runtime or get_runtime()

    def report(self, fraction: float, stage: str) -> None:
        if self.progress is not None:
            self.progress(min(max(float(fraction), 0.0), 1.0), stage)


def as_frames(images) -> tuple[Sized, bool]:
    """(frames, was_single): one image (ndarray), a sequence of them, or a lazy frame source
    (sized and iterable: iterated once, in order)."""
    if isinstance(images, np.ndarray):
        return [images], True
    if isinstance(images, Sequence) and not isinstance(images, (str, bytes)):
        return list(images), False
    if isinstance(images, Sized) and isinstance(images, Iterable):
        return images, False
    return [np.asarray(images)], True


class ResultSink:
    """Where an adapter puts each frame's result: handed to ``options.on_result`` when set (the
    caller writes and drops it), else kept and returned."""

    def __init__(self, options: RunOptions):
        self._emit = options.on_result
        self._kept: list = []
        self._seen: list[weakref.ref] = []  # every result handed out, to tell which still live

    def add(self, result) -> None:
        self._seen = [ref for ref in self._seen if ref() is not None]
        with contextlib.suppress(TypeError):  # a result type without weak references is not counted
            self._seen.append(weakref.ref(result))
        if self._emit is not None:
            self._emit(result)
        else:
            self._kept.append(result)

    def held_bytes(self) -> int:
        """Bytes of the arrays of this job's results still alive (kept here, or not yet dropped by
        whoever took them): the memory report's "results still held"."""
        buffers: dict[int, int] = {}
        for result in (ref() for ref in self._seen):
            if result is not None:
                for array in _arrays_in(vars(result).values()):
                    root = _owner(array)
                    buffers[id(root)] = int(root.nbytes)
        return sum(buffers.values())

    def value(self, single: bool):
        if single and self._kept:
            return self._kept[0]
        return self._kept


def _arrays_in(values) -> Iterable[np.ndarray]:
    """The arrays among a result's fields, and those in its dicts, lists and tuples (DA3's extras:
    its confidence map is as large as its depth)."""
    for value in values:
        if isinstance(value, np.ndarray):
            yield value
        elif isinstance(value, dict):
            yield from _arrays_in(value.values())
        elif isinstance(value, list | tuple):
            yield from _arrays_in(value)


def _owner(array: np.ndarray) -> np.ndarray:
    """The array that owns a view's memory (the memory held is the owner's, counted once)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def check_contract(
    handle: SessionHandle, family: str, *, inputs: Sequence[dict], outputs: Sequence[dict]
) -> None:
    """Each spec dict may hold `rank`, `channels` (dim 1 for NCHW), `types` (allowed ORT types).

    Raises a ModelContractError that names what the family expects and what the file has.
    """
    problems = []
    if len(handle.inputs) != len(inputs):  # an extra input would only fail later, in ORT's words
        names = ", ".join(f"'{i.name}'" for i in handle.inputs)
        problems.append(f"expected {len(inputs)} input(s), found {len(handle.inputs)} ({names})")
    if len(handle.outputs) < len(outputs):
        problems.append(f"expected at least {len(outputs)} output(s), found {len(handle.outputs)}")
    for kind, specs, infos in (("input", inputs, handle.inputs), ("output", outputs, handle.outputs)):
        for index, (spec, info) in enumerate(zip(specs, infos, strict=False)):
            label = f"{kind} {index} '{info.name}'"
            if "rank" in spec and len(info.shape) != spec["rank"]:
                problems.append(f"{label}: expected rank {spec['rank']}, found shape {list(info.shape)}")
            elif (
                "channels" in spec
                and isinstance(info.shape[1], int)
                and info.shape[1] not in _as_tuple(spec["channels"])
            ):
                problems.append(f"{label}: expected {spec['channels']} channels, found {info.shape[1]}")
            if "types" in spec and info.type not in spec["types"]:
                problems.append(f"{label}: expected type {' or '.join(spec['types'])}, found {info.type}")
    if problems:
        raise ModelContractError(
            f"{handle.model_name} does not look like a {family} model: "
            + "; ".join(problems)
            + ". Choose a model exported for this family (see the add-on's model list)."
        )


def squeeze_batch(array, ndim: int) -> np.ndarray:
    """Drop leading batch-of-one axes until ``ndim`` axes are left (as far as they are 1)."""
    array = np.asarray(array)
    while array.ndim > ndim and array.shape[0] == 1:
        array = array[0]
    return array


def _as_tuple(value):
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def check_finite(array: np.ndarray, model_name: str, output_name: str) -> np.ndarray:
    if not np.isfinite(array).all():
        bad = int((~np.isfinite(array)).sum())
        raise InvalidModelOutputError(
            f"{model_name} produced {bad} NaN/Inf value(s) in '{output_name}'; nothing was written. "
            "An fp16 model can overflow on unusual input: try the fp32 export or the CPU device."
        )
    return array


def fixed_hw(shape: Sequence) -> tuple[int, int] | None:
    """(H, W) when an NCHW input's spatial size is fixed in the model, else None."""
    if (
        len(shape) == 4
        and isinstance(shape[2], int)
        and isinstance(shape[3], int)
        and shape[2] > 0
        and shape[3] > 0
    ):
        return shape[2], shape[3]
    return None


FLOAT_TYPES = ("tensor(float)", "tensor(float16)")
