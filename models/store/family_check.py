"""Does an ONNX file fit the family it is used as? (bpy-free)

A model of the wrong family often runs without an error when its shapes happen to fit (a depth
model used for background removal writes a plausible cut-out), so the file is compared with each
family's contract, and what it looks like is said in words. The rules, strongest first:

- **MoGe-2 geometry**: an output named ``points`` (its adapter then checks the rest of the export's
  contract by name: inputs ``image`` and ``num_tokens``, outputs ``normal``, ``mask``, ``metric_scale``).
- **Depth (DA3)**: an output named ``depth``; without that name, one channel at the input size
  that is unbounded (leaves [0, 1]) and positive on a probe.
- **Super-resolution**: an image output (3 channels) whose height and width are the same whole
  multiple > 1 of the input's (from fixed shapes, else from the probe).
- **Background removal (BEN2 matte)**: one channel at the input size that ends in a Sigmoid (seen
  in the graph through shape-only ops), or stays within [0, 1] on a probe.

A file is **refused** for a family when it matches another family by a strong sign (the names,
a final Sigmoid, a whole-multiple output); when only the probe's values point elsewhere, or the
file matches no family at all, it is used with a **warning** (the family's adapter still checks
shapes and values when it runs). The probe is one run on a small generated image through the
shared runtime; the graph is read from the file itself (a few protobuf fields, no onnx package:
Blender has none).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...runtime import get_runtime
from ...runtime.errors import ModelContractError
from ...runtime.onnx_wire import fields
from ..family import command_of

PROBE_SIDE = 56  # a multiple of 14 (ViT patches) and 8 (window attention); small enough to be quick
PROBE_NUM_TOKENS = 1200  # MoGe-2's lowest resolution level
SHAPE_ONLY_OPS = frozenset(
    {"Identity", "Cast", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Transpose", "Slice", "Resize", "Upsample"}
)
LOOKS = {
    "ben2": "a background-removal (matte) model",
    "da3": "a depth model",
    "moge2": "a MoGe-2 geometry model",
    "upscale": "a super-resolution model",
}


def _looks(family: str) -> str:
    return LOOKS.get(family, f"a {family} model")


@dataclass
class Finding:
    """What the file looks like: a family id (or None) and why; ``strong`` when the sign is one no
    other family shows (names, a final Sigmoid, a whole-multiple output)."""

    looks_like: str | None
    why: str
    strong: bool = False


@dataclass
class Verdict:
    family: str
    finding: Finding
    probed: bool = False

    @property
    def fits(self) -> bool:
        return self.finding.looks_like == self.family

    @property
    def refused(self) -> bool:
        return not self.fits and self.finding.looks_like is not None and self.finding.strong

    @property
    def warning(self) -> str | None:
        """The line to show when the file is used anyway (None when it fits)."""
        if self.fits or self.refused:
            return None
        return self.message()

    def message(self) -> str:
        asked, f = _looks(self.family), self.finding
        if self.fits:
            return f"it looks like {asked}: {f.why}."
        if f.looks_like is None:
            return f"it does not show the contract of {asked} ({f.why}); {command_of(self.family)} uses it, as asked."
        looks, use, asked_by = _looks(f.looks_like), command_of(f.looks_like), command_of(self.family)
        if self.refused:
            return f"this looks like {looks}: {f.why}. Use {use} for it ({asked_by} cannot use it)."
        return f"this looks like {looks}: {f.why}. It may not work with {asked_by}; if it is {looks}, use {use}."


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


def _final_ops(buf) -> dict[str, str]:
    graph = next((v for n, w, v in fields(buf) if n == 7 and w == 2), None)
    if graph is None:
        return {}
    producer: dict[str, tuple[str, str | None]] = {}  # tensor -> (op type, its first input)
    outputs: list[str] = []
    for number, wire, span in fields(buf, *graph):
        if wire != 2:
            continue
        if number == 1:  # NodeProto: input 1, output 2, op_type 4
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
            for name in outs:
                producer[name] = (op, ins[0] if ins else None)
        elif number == 12:  # ValueInfoProto: name 1
            outputs.extend(_text(buf, v) for n, w, v in fields(buf, *span) if n == 1 and w == 2)
    found = {}
    for name in outputs:
        tensor, op = name, ""
        for _ in range(64):
            op, source = producer.get(tensor, ("", None))
            if op not in SHAPE_ONLY_OPS or source is None:
                break
            tensor = source
        found[name] = op
    return found


# ---- what the file looks like -------------------------------------------------------------------


def _spatial(shape) -> tuple | None:
    """(channels, height, width) of an NCHW or NHW/CHW-like shape, ints or None for dynamic."""
    dims = [d if isinstance(d, int) and d > 0 else None for d in shape]
    if len(dims) == 4:
        return dims[1], dims[2], dims[3]
    if len(dims) == 3:
        return 1 if dims[0] == 1 else dims[0], dims[1], dims[2]
    return None


def _image_input(handle):
    return next((i for i in handle.inputs if len(i.shape) in (3, 4) and "int" not in i.type), None)


def graph_finding(handle, ops: dict[str, str]) -> Finding | None:
    """A strong finding from names, fixed shapes and final ops alone; None when a probe must tell."""
    in_names = {i.name.lower() for i in handle.inputs}
    out_names = {o.name.lower() for o in handle.outputs}
    if "points" in out_names:  # the rest of MoGe-2's contract is its adapter's to check, by name
        named = sorted(in_names & {"image", "num_tokens"})
        inputs = f"inputs {' and '.join(repr(n) for n in named)}, " if named else ""
        return Finding("moge2", f"{inputs}an output named 'points'", strong=True)
    if "depth" in out_names:
        return Finding("da3", "an output named 'depth'", strong=True)
    image = _image_input(handle)
    if image is None or _spatial(image.shape) is None:
        return None
    _, ih, iw = _spatial(image.shape)
    for out in handle.outputs:
        dims = _spatial(out.shape)
        if dims is None:
            continue
        c, oh, ow = dims
        if c == 1 and ops.get(out.name) == "Sigmoid":
            return Finding("ben2", f"one channel ('{out.name}') ending in a Sigmoid", strong=True)
        if c == 3 and None not in (ih, iw, oh, ow):
            factor = _whole_multiple((ih, iw), (oh, ow))
            if factor:
                return Finding("upscale", f"output '{out.name}' is {factor}x the input ({iw}x{ih} -> {ow}x{oh})", strong=True)
    return None


def _whole_multiple(in_hw, out_hw) -> int | None:
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
        dims = _spatial(info.shape)
        if dims is None or "int" in info.type:
            return None
        c, h, w = dims
        c, h, w = c or 3, h or PROBE_SIDE, w or PROBE_SIDE
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        planes = [xx / max(w - 1, 1), yy / max(h - 1, 1), 0.5 + 0.4 * np.sin(xx / 5.0) * np.cos(yy / 7.0)]
        image = np.stack([planes[k % 3] for k in range(c)])
        feeds[info.name] = image.reshape(info_shape(info.shape, c, h, w)).astype(info.dtype)
    return feeds


def info_shape(shape, c, h, w) -> list[int]:
    return [1, c, h, w] if len(shape) == 4 else [c, h, w]


def probe_finding(handle, feeds: dict, outputs: dict[str, np.ndarray], ops: dict[str, str]) -> Finding:
    image = _image_input(handle)
    ih, iw = feeds[image.name].shape[-2:]
    for name, array in outputs.items():
        arr = np.asarray(array)
        if arr.ndim == 4 and arr.shape[1] == 3:
            factor = _whole_multiple((ih, iw), arr.shape[-2:])
            if factor:
                return Finding("upscale", f"output '{name}' came out {factor}x the probe ({iw}x{ih} -> {arr.shape[-1]}x{arr.shape[-2]})", strong=True)
    for name, array in outputs.items():
        arr = np.asarray(array, np.float64)
        if arr.ndim < 2 or tuple(arr.shape[-2:]) != (ih, iw) or arr.size != ih * iw:
            continue
        if not np.isfinite(arr).all():
            return Finding(None, f"output '{name}' holds NaN or infinity on a probe image")
        low, high = float(arr.min()), float(arr.max())
        span = f"values {low:.3g} to {high:.3g} on a probe image"
        if ops.get(name) == "Sigmoid":
            return Finding("ben2", f"one channel ('{name}') ending in a Sigmoid", strong=True)
        if 0.0 <= low and high <= 1.0:
            return Finding("ben2", f"one channel ('{name}') at the input size within [0, 1] ({span})")
        if low > 0.0:
            return Finding("da3", f"one channel ('{name}') at the input size, unbounded and positive ({span})")
        return Finding(None, f"one channel ('{name}') at the input size with negative values ({span})")
    shapes = ", ".join(f"'{n}' {list(np.shape(a))}" for n, a in outputs.items())
    return Finding(None, f"on a {iw}x{ih} probe its outputs are {shapes}")


# ---- the check ----------------------------------------------------------------------------------

Runner = Callable[[dict], dict]  # feeds -> {output name: array}, through the shared runtime


def check(family: str, handle, run: Runner | None = None) -> Verdict:
    """Compare the loaded model (a runtime SessionHandle) with ``family``'s contract; ``run``
    makes the probe when the graph alone cannot tell (None: the graph only)."""
    ops = final_ops(handle.model_path)
    finding = graph_finding(handle, ops)
    if finding is not None or run is None:
        return Verdict(family, finding or Finding(None, "the graph alone does not tell"))
    feeds = probe_feeds(handle)
    if feeds is None:
        names = ", ".join(f"'{i.name}' {i.type}" for i in handle.inputs)
        return Verdict(family, Finding(None, f"its inputs ({names}) are not an image this check can make"))
    return Verdict(family, probe_finding(handle, feeds, run(feeds), ops), probed=True)


_job_verdicts: dict[tuple, Verdict] = {}


def require(family: str, handle) -> Verdict:
    """Before a job: refuse a file that is plainly another family's (graph only: no run is added
    to the job); the verdict is kept per file and family."""
    path = Path(handle.model_path)
    try:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns, family)
    except OSError:
        key = (str(path), None, None, family)
    verdict = _job_verdicts.get(key)
    if verdict is None:
        verdict = _job_verdicts[key] = check(family, handle)
    if verdict.refused:
        raise ModelContractError(f"{path.name}: {verdict.message()}")
    return verdict


@contextlib.contextmanager
def loaded_on_cpu(path, reason: str, runtime=None) -> Iterator:
    """``path``'s session handle on the CPU, through the shared runtime, for a look at it
    (ModelFileError when onnxruntime cannot load it). A session this opens is evicted again (a
    check must not keep weights in memory); one already cached for a job is left alone."""
    runtime = runtime or get_runtime()
    before = {id(h) for h in runtime.cached_sessions()}
    handle = runtime.session(Path(path), "cpu")
    try:
        yield handle
    finally:
        if id(handle) not in before:
            runtime.evict(handle, reason=reason)


def check_file(family: str, path: str | os.PathLike, runtime, *, probe: bool = True) -> tuple[Verdict, object]:
    """At registration: load ``path`` on the CPU (``loaded_on_cpu``), check it with a probe run
    when the graph cannot tell. Returns (verdict, the handle's inputs and outputs as (inputs, outputs))."""
    with loaded_on_cpu(path, "family check", runtime) as handle, runtime.operation("family check") as op:
        runner = (lambda feeds: op.run(handle, feeds, last=True)) if probe else None
        return check(family, handle, runner), (handle.inputs, handle.outputs)


__all__ = ["Finding", "Verdict", "check", "check_file", "final_ops", "loaded_on_cpu", "require"]
