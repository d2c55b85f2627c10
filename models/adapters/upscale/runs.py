"""The model runs of one upscale job: each output written into a buffer the job owns, bound with
the model's scale (known from fixed shapes, hinted by the graph or by what this session showed
before, else learned from the first output)."""

from __future__ import annotations

import math
import weakref

import numpy as np

from ....runtime.errors import (
    InferenceError,
    InferenceOutOfMemoryError,
    ModelContractError,
    SessionClosedError,
)
from ...base import fixed_hw
from ...identify import LIKELY, NO, SURE, Match, spatial, whole_multiple
from ...tiles.receptive import graph_receptive_field
from ...tiles.tiling import whole_scale

# The whole-number output/input size ratio each session's runs showed (the model's scale), so the
# next job on the same cached session binds even its first run's output into its own buffer. Only
# an upscale knows it, so it is kept here, weakly by session handle: it goes with the handle, and a
# session loaded again (a new handle) starts without it, never with an evicted one's.
_LEARNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def learned_scale(handle) -> int | None:
    """The scale this session's runs showed (None: none yet, or it proved to vary)."""
    return _LEARNED.get(handle)


class ModelRuns:
    """The runs of one upscale operation on its session (the frame loop's, re-acquired after an
    out-of-memory eviction), and the buffers their outputs are written into."""

    def __init__(self, loop):
        self.loop = loop
        self.op = loop.op
        self.scale: int | None = None  # known from fixed shapes, a hint, or the first output
        self.hinted = False  # `scale` is only a hint (`scale_hint`), not yet seen in an output
        self.told_plan: tuple | None = None  # the auto tile plan last emitted as a `tile_plan` event
        self._buffers: dict[str, np.ndarray] = {}  # slot -> flat buffer from runtime.scratch

    @property
    def handle(self):
        return self.loop.handle

    def _buffer(self, slot: str, shape: tuple, dtype) -> np.ndarray:
        """The slot's buffer as a C-contiguous `shape` (a prefix of it: an edge tile's smaller
        output fits the buffer of a full one), a larger one taken when it does not fit."""
        count = math.prod(shape)
        flat = self._buffers.get(slot)
        if flat is None or flat.dtype != np.dtype(dtype) or flat.size < count:
            if flat is not None:
                self.op.runtime.scratch.give(flat)
            flat = self._buffers[slot] = self.op.runtime.scratch.take(count, dtype)
        return flat[:count].reshape(shape)

    def close(self) -> None:
        """The job's buffers back to the runtime, to be kept warm or let go (runtime/release/scratch.py)."""
        for flat in self._buffers.values():
            self.op.runtime.scratch.give(flat)
        self._buffers.clear()

    def reacquire(self, _tile, _error: InferenceOutOfMemoryError) -> None:
        self.loop.reacquire()

    def infer(self, feed: np.ndarray, *, last: bool, slot: str = "colour") -> np.ndarray:
        """The model's 1x3xHxW output for a 1x3xhxw feed. Once the scale is known (or hinted:
        `scale_hint`) the output is written by the runtime straight into a buffer this job owns
        (one per `slot`, reused from tile to tile: the tiler pastes it before the next run), so
        nothing is copied out of the arena and no new array is made per tile. Unknown, the output
        comes out of the arena and is copied (and the arena needs a release run of its own)."""
        handle = self.handle
        in_name, out_name = handle.inputs[0].name, handle.outputs[0].name
        out = None
        if self.scale is not None:
            shape = (1, 3, feed.shape[2] * self.scale, feed.shape[3] * self.scale)
            out = {out_name: self._buffer(slot, shape, handle.outputs[0].dtype)}
        try:
            output = self.op.run(handle, {in_name: feed}, last=last, output_names=[out_name], out=out)[out_name]
        except InferenceError as exc:
            if out is None or isinstance(exc, SessionClosedError) or not self.hinted:
                raise
            # a hinted scale this input does not have (a model whose factor depends on the size):
            # run it unbound, as if nothing were known, and learn the scale from its output
            _LEARNED.pop(handle, None)
            self.scale, self.hinted = None, False
            return self.infer(feed, last=last, slot=slot)
        if output.ndim != 4 or output.shape[1] != 3:
            raise ModelContractError(
                f"{handle.model_name} returned '{out_name}' with shape {list(output.shape)}; an upscale "
                "model must return 1x3xHxW."
            )
        # NaN/Inf: the tiler checks each tile's owned part while it pastes it (`not_finite`)
        self.hinted = False  # an output of the hinted scale came back: it is the model's
        if self.scale is None and output.shape[2] % feed.shape[2] == 0:
            found = output.shape[2] // feed.shape[2]
            if output.shape[3] == feed.shape[3] * found:  # else the tiler reports the contract error
                self.scale = found
                if fixed_hw(handle.outputs[0].shape) is None:  # a fixed output's factor varies
                    _LEARNED[handle] = found
        return output


def scale_hint(handle) -> int | None:
    """The scale to bind the first run's output with before any output was seen: the one this
    session showed before (`learned_scale`: without it, that first run would return its
    output in arena memory, to be copied out, 200 MB for a 1024 px input at x4, and released by a
    run of its own), else the one the graph walk read (Conv strides, DepthToSpace, Resize factors).
    A wrong hint costs one failed run (`ModelRuns.infer` retries unbound), never a result."""
    learned = learned_scale(handle)
    if learned is not None:
        return learned
    field_ = graph_receptive_field(handle.model_path)
    walked = field_.scale
    if field_.radius is None or field_.is_global or walked is None or walked < 1 or not float(walked).is_integer():
        return None
    return int(walked)


def static_scale(handle) -> int | None:
    """The scale from fixed input/output shapes, when the model declares both."""
    fixed_in, fixed_out = fixed_hw(handle.inputs[0].shape), fixed_hw(handle.outputs[0].shape)
    if fixed_in is None or fixed_out is None:
        return None
    return whole_scale(fixed_in, fixed_out, handle.model_name)


def identify(model) -> Match:
    """The upscale family's sign: an image output (3 channels) at the same whole multiple > 1 of
    the input's height and width, from fixed shapes, else from the probe."""
    return _from_fixed_shapes(model) or _from_probe(model) or NO


def _from_fixed_shapes(model) -> Match | None:
    in_hw = model.input_hw
    for out in model.outputs if in_hw and None not in in_hw else ():
        dims = spatial(out.shape)
        factor = whole_multiple(in_hw, dims[1:]) if dims and dims[0] == 3 and None not in dims else None
        if factor:
            (ih, iw), (oh, ow) = in_hw, dims[1:]
            return Match(SURE, f"output '{out.name}' is {factor}x the input ({iw}x{ih} -> {ow}x{oh})")
    return None


def _from_probe(model) -> Match | None:
    probed = model.probe()
    images = [(n, np.shape(a)) for n, a in (probed[1].items() if probed else ()) if np.ndim(a) == 4 and np.shape(a)[1] == 3]
    for name, shape in images:
        (ih, iw), (oh, ow) = probed[0], shape[-2:]
        factor = whole_multiple(probed[0], shape[-2:])
        if factor:
            return Match(SURE, f"output '{name}' came out {factor}x the probe ({iw}x{ih} -> {ow}x{oh})")
        if oh > ih and ow > iw:  # a scale this family refuses, with its own words, when it runs
            return Match(LIKELY, f"output '{name}' came out larger than the probe ({iw}x{ih} -> {ow}x{oh})")
    return None
