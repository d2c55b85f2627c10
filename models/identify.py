"""What a family's ``identify(model)`` sees of a loaded ONNX model, and what it answers (bpy-free).

Each family declares how to recognise its own model (models/family.py ``Family.identify``); the
family check (models/store/family_check.py) asks every registered family, in their declared
order, and the surest answer says what the file looks like. A :class:`ModelView` holds what can be
known without running the model (input and output names and shapes, each output's producing op
read from the file) and, when the check may run it, the outputs of one small probe image: many
exports have dynamic shapes and no telling names, and then only the values say what the model is.
The graph is read from the file itself (a few protobuf fields, no onnx package: Blender has none).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..runtime.onnx_wire import fields

PROBE_SIDE = 56  # a multiple of 14 (ViT patches) and 8 (window attention); small enough to be quick
PROBE_NUM_TOKENS = 1200  # MoGe-2's lowest resolution level
SHAPE_ONLY_OPS = frozenset(
    {"Identity", "Cast", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Transpose", "Slice", "Resize", "Upsample"}
)
SURE = 1.0  # a sign no other family shows: a name, a final Sigmoid, a whole-multiple output
LIKELY = 0.5  # only the probe's values point to the family


@dataclass(frozen=True)
class Match:
    """A family's answer: how sure it is that the model is its own (0: not), and why, in words."""

    confidence: float
    why: str = ""


NO = Match(0.0)


@dataclass(frozen=True)
class Plane:
    """The first output that is one plane at the probe's size, as the probe left it."""

    name: str
    low: float
    high: float
    finite: bool
    op: str  # its producing op (through shape-only ops)

    @property
    def span(self) -> str:
        return f"values {self.low:.3g} to {self.high:.3g} on a probe image"


# ---- the graph, read from the file ------------------------------------------------------------


def final_ops(path: str | os.PathLike) -> dict[str, str]:
    """Each graph output's producing op, looked through shape-only ops (Identity, Cast, Reshape,
    Resize..., and a Concat of one input): ``{"output": "Sigmoid"}``. Empty when the file cannot
    be read this way."""
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _final_ops(buf)
    except (OSError, ValueError, IndexError):
        return {}


def _text(buf, span) -> str:
    return bytes(buf[span[0] : span[1]]).decode("utf-8", "replace")


def _node(buf, span) -> tuple[list[str], list[str], str]:
    """A NodeProto's inputs (field 1), outputs (2) and op type (4)."""
    ins, outs, op = [], [], ""
    for n, w, v in fields(buf, *span):
        if w == 2 and n == 1:
            ins.append(_text(buf, v))
        elif w == 2 and n == 2:
            outs.append(_text(buf, v))
        elif w == 2 and n == 4:
            op = _text(buf, v)
    if op == "Concat" and len(ins) == 1:
        op = "Identity"  # a batch of one joined (BEN2's forward: torch.cat over its frames)
    return ins, outs, op


def _final_ops(buf) -> dict[str, str]:
    graph = next((v for n, w, v in fields(buf) if n == 7 and w == 2), None)
    if graph is None:
        return {}
    producer: dict[str, tuple[str, str | None]] = {}  # tensor -> (op type, its first input)
    outputs: list[str] = []
    for number, wire, span in fields(buf, *graph):
        if wire != 2:
            continue
        if number == 1:
            _note_producer(buf, span, producer)
        elif number == 12:  # ValueInfoProto: name 1
            outputs.extend(_text(buf, v) for n, w, v in fields(buf, *span) if n == 1 and w == 2)
    return {name: _producing_op(producer, name) for name in outputs}


def _note_producer(buf, span, producer: dict) -> None:
    ins, outs, op = _node(buf, span)
    for name in outs:
        producer[name] = (op, ins[0] if ins else None)


def _producing_op(producer: dict, tensor: str) -> str:
    """The op that makes ``tensor``, looked through shape-only ops (at most 64 of them)."""
    op = ""
    for _ in range(64):
        op, source = producer.get(tensor, ("", None))
        if op not in SHAPE_ONLY_OPS or source is None:
            break
        tensor = source
    return op


# ---- shapes -------------------------------------------------------------------------------------


def spatial(shape) -> tuple | None:
    """(channels, height, width) of an NCHW or NHW/CHW-like shape, ints or None for dynamic."""
    dims = [d if isinstance(d, int) and d > 0 else None for d in shape]
    if len(dims) == 4:
        return dims[1], dims[2], dims[3]
    if len(dims) == 3:
        return 1 if dims[0] == 1 else dims[0], dims[1], dims[2]
    return None


def whole_multiple(in_hw, out_hw) -> int | None:
    """The factor when ``out_hw`` is the same whole multiple > 1 of ``in_hw`` in both sides."""
    (ih, iw), (oh, ow) = in_hw, out_hw
    if ih and iw and oh % ih == 0 and ow % iw == 0 and oh // ih == ow // iw and oh // ih > 1:
        return oh // ih
    return None


def probe_feeds(handle) -> dict[str, np.ndarray] | None:
    """A small smooth test image (values in [0, 1]) for each image input, ``num_tokens`` at its
    lowest level; None when an input is neither (the file cannot be probed)."""
    feeds = {}
    for info in handle.inputs:
        if "int" in info.type and len(info.shape) <= 1:
            value = PROBE_NUM_TOKENS if "token" in info.name.lower() else 1
            feeds[info.name] = np.full([1] * len(info.shape), value, info.dtype)
            continue
        dims = spatial(info.shape)
        if dims is None or "int" in info.type:
            return None
        c, h, w = dims
        c, h, w = c or 3, h or PROBE_SIDE, w or PROBE_SIDE
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        planes = [xx / max(w - 1, 1), yy / max(h - 1, 1), 0.5 + 0.4 * np.sin(xx / 5.0) * np.cos(yy / 7.0)]
        image = np.stack([planes[k % 3] for k in range(c)])
        shape = [1, c, h, w] if len(info.shape) == 4 else [c, h, w]
        feeds[info.name] = image.reshape(shape).astype(info.dtype)
    return feeds


# ---- the view -------------------------------------------------------------------------------------

Runner = Callable[[dict], dict]  # feeds -> {output name: array}, through the shared runtime


class ModelView:
    """One loaded model (a runtime SessionHandle) as ``identify`` sees it. ``probe`` is None when
    the check may not run the model (``run`` None) or cannot make its inputs; it runs once."""

    def __init__(self, handle, ops: dict[str, str], run: Runner | None = None):
        self.inputs, self.outputs, self.ops = handle.inputs, handle.outputs, ops
        self.input_names = {i.name.lower() for i in handle.inputs}
        self.output_names = {o.name.lower() for o in handle.outputs}
        self._handle, self._run = handle, run
        self._probe: tuple[dict, dict] | None = None
        self.feeds = probe_feeds(handle) if run is not None else None

    @property
    def image_input(self):
        return next((i for i in self.inputs if len(i.shape) in (3, 4) and "int" not in i.type), None)

    @property
    def input_hw(self) -> tuple | None:
        """The image input's (height, width) as declared (None for a dynamic side); None without one."""
        image = self.image_input
        dims = spatial(image.shape) if image is not None else None
        return dims[1:] if dims is not None else None

    @property
    def probed(self) -> bool:
        return self.feeds is not None

    def probe(self) -> tuple[tuple[int, int], dict[str, np.ndarray]] | None:
        """((height, width) of the probe image, {output name: array}), or None (see the class)."""
        if self.feeds is None:
            return None
        if self._probe is None:
            self._probe = (tuple(self.feeds[self.image_input.name].shape[-2:]), self._run(self.feeds))
        return self._probe

    def plane(self) -> Plane | None:
        """The first output that came out one plane at the probe's size; None without one or a probe."""
        probed = self.probe()
        if probed is None:
            return None
        hw, outputs = probed
        for name, array in outputs.items():
            arr = np.asarray(array, np.float64)
            if arr.ndim < 2 or tuple(arr.shape[-2:]) != hw or arr.size != hw[0] * hw[1]:
                continue
            finite = bool(np.isfinite(arr).all())
            low, high = (float(arr.min()), float(arr.max())) if finite else (float("nan"), float("nan"))
            return Plane(name, low, high, finite, self.ops.get(name, ""))
        return None

    @property
    def conclusive(self) -> bool:
        """False when the probe left NaN or infinity: the values say nothing of what the model is
        (a broken export, or one that overflows in fp16), and the family's own run reports them."""
        probed = self.probe()
        return probed is not None and all(np.isfinite(np.asarray(a, np.float64)).all() for a in probed[1].values())

    def describe(self) -> str:
        """What the model looks like in words, for a model no family recognises."""
        if self._run is None:
            return "the graph alone does not tell"
        if self.feeds is None:
            names = ", ".join(f"'{i.name}' {i.type}" for i in self.inputs)
            return f"its inputs ({names}) are not an image this check can make"
        plane = self.plane()
        if plane is not None and not plane.finite:
            return f"output '{plane.name}' holds NaN or infinity on a probe image"
        if plane is not None:
            kind = "with negative values" if plane.low < 0 else "neither within [0, 1] nor all positive"
            return f"one channel ('{plane.name}') at the input size {kind} ({plane.span})"
        (ih, iw), outputs = self.probe()
        shapes = ", ".join(f"'{n}' {list(np.shape(a))}" for n, a in outputs.items())
        return f"on a {iw}x{ih} probe its outputs are {shapes}"


__all__ = ["LIKELY", "NO", "SURE", "Match", "ModelView", "Plane", "final_ops", "probe_feeds", "spatial", "whole_multiple"]
