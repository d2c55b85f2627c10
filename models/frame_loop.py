"""The frame loop every adapter shares: a job's frames as one runtime operation.

An adapter names its family, its contract check and its per-frame body; ``run_frames`` does the
rest: it opens the operation (named after the family) and the session, checks the contract and
that the file is not another family's, hands the body one `Frame` at a time, and gives out each
result (ResultSink) with the session's fallback warning added. `Frame.last` marks the frame that
holds the operation's final run: the body passes it to that frame's final run (``Frame.run`` does),
so exactly one run per session and operation carries the release (runtime/operation.py).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from ..runtime.errors import ModelContractError
from .base import ResultSink, RunOptions, as_frames
from .family import command_of
from .imaging import PreparedImage, prepare_image
from .store import family_check

if TYPE_CHECKING:  # the families import this module in Blender's process too, which loads no runtime
    from ..runtime import Operation, SessionHandle


class FrameLoop:
    """One job's operation and session, as its adapter's setup and frames see them."""

    def __init__(self, family: str, model_path, options: RunOptions, *, single: bool, count: int):
        self.family = family
        self.model_path = model_path
        self.options = options
        self.single = single  # one image, not a list of frames: messages say "image"
        self.count = count
        self.frames = None  # the frames as run_frames iterates them
        self.op: Operation | None = None
        self.handle: SessionHandle | None = None
        self.contract = None  # what the family's check returned (e.g. the output to read)
        self.family_warning: str | None = None  # the file only may be another family's: said with each result
        self._before_release: ExitStack | None = None

    @property
    def runtime(self):
        return self.op.runtime

    def open(self, op: Operation, before_release: ExitStack, check: Callable[[SessionHandle], object] | None) -> None:
        self.op, self._before_release = op, before_release
        self.handle = op.session(self.model_path, self.options.device)
        try:
            self.contract = check(self.handle) if check is not None else None
        except ModelContractError:
            # a file that is plainly another family's is refused with what it looks like ("use
            # Estimate Depth for it"), not with this family's shapes; else the contract's own words
            family_check.require(self.family, self.handle)
            raise
        # after the shapes: what fits them may still be another family's, or no family's (when the
        # graph does not tell, a probe on a CPU copy of the file does, once per file)
        warning = family_check.require(self.family, self.handle, probe=True).warning
        self.family_warning = f"{Path(self.model_path).name}: {warning}" if warning else None

    def reacquire(self) -> SessionHandle:
        """The session again, after an out-of-memory eviction dropped the one the job had."""
        self.handle = self.op.session(self.model_path, self.options.device)
        return self.handle

    def at_end(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the frames are done, before the operation ends and releases."""
        self._before_release.callback(callback)


class Frame:
    """One frame of a job: the frame itself, whether it holds the final run, how to name it and
    report on it, and the job's operation and session (``loop``)."""

    def __init__(self, loop: FrameLoop, image, index: int, last: bool):
        self.loop = loop
        self.image = image  # as the caller gave it: prepare() makes the float copy the model needs
        self.index = index
        self.last = last  # this frame holds the operation's final run

    @property
    def op(self) -> Operation:
        return self.loop.op

    @property
    def handle(self) -> SessionHandle:
        return self.loop.handle

    @property
    def contract(self):
        return self.loop.contract

    @property
    def label(self) -> str:
        """How messages name this frame: its file's name when it came from a file (a single file
        is never "frame 1"), else "image" or its place in the list."""
        name_of = getattr(self.loop.frames, "name_of", None)
        name = name_of(self.image) if name_of is not None else None
        if name:
            return name
        return "image" if self.loop.single else f"frame {self.index + 1}"

    @property
    def counter(self) -> str:
        return f"frame {self.index + 1}/{self.loop.count}"

    def report(self, within: float, stage: str) -> None:
        """Progress `within` this frame (0..1), as a fraction of the whole job."""
        self.loop.options.report((self.index + within) / self.loop.count, stage)

    def prepare(self) -> PreparedImage:
        """The frame as float32 RGB (+ alpha), a new array each call: the caller decides how long it lives."""
        return prepare_image(self.image, name=self.label)

    def run(self, feeds: dict, *, output_names=None) -> dict:
        """The frame's one model run (the final one of the job when `last`); stops here when the
        job was cancelled meanwhile."""
        outputs = self.op.run(self.handle, feeds, last=self.last, output_names=output_names)
        self.op.check_cancelled()
        return outputs


def run_frames(
    family: str,
    images,
    model_path,
    options: RunOptions | None,
    *,
    check: Callable[[SessionHandle], object] | None,
    body: Callable[[Frame], object],
    start: Callable[[FrameLoop], None] | None = None,
):
    """`body(frame)` for each frame of `images` (one image, a list, or a lazy frame source), in one
    operation; the result for one image, else the list (empty, with nothing loaded, for no frames;
    with ``options.on_result`` each result is handed there instead of kept).

    `check(handle)`: the family's contract, raising ModelContractError; what it returns is
    ``loop.contract`` (None: no contract beyond the family check's). `start(loop)`: the job's own
    setup, once, after the check and before the first frame (a tile plan, say). Each result must
    have a ``warnings`` list.
    """
    options = options or RunOptions()
    frames, single = as_frames(images)
    if not len(frames):
        return []
    results = ResultSink(options)
    loop = FrameLoop(family, model_path, options, single=single, count=len(frames))
    loop.frames = frames  # a frame source that knows its files names them (Frame.label)
    from ..runtime.session import (
        mark_last,  # the runtime loads where a model runs (the worker), not with the families
    )

    runtime = options.get_runtime()
    # named as the user runs it (remove-background, depth): the report, the picture and the log say it
    operation = runtime.operation(command_of(family), cancel=options.cancel, budgets=options.budgets)
    with operation as op, ExitStack() as before_release:
        op.count_results(results.held_bytes)
        loop.open(op, before_release, check)
        if start is not None:
            start(loop)
        for index, (image, last) in enumerate(mark_last(frames)):
            result = body(Frame(loop, image, index, last))
            if loop.handle.fallback_warning:  # a device asked for, another given: the user must hear it
                result.warnings.append(loop.handle.fallback_warning)
            if loop.family_warning:  # a file whose probe looks like another family's runs, but not in silence
                result.warnings.append(loop.family_warning)
            results.add(result)
    options.report(1.0, "done")
    return results.value(single)
