"""A sequence's shot options as one object, and the two-pass batch a pumped runner uses (bpy-free).

:class:`ShotSettings` holds what the shot options change (models/adapters/shot_depth.py's range and
alignment, models/adapters/shot_camera.py's focal) for every front-end. :class:`TwoPassBatch` has
:class:`~.sequence.BatchRun`'s interface (``infer_all`` on the worker, ``pump`` on the caller's
thread, ``report``) and runs a first pass whose 'write' only records two floats a frame before
the writing pass: the writing pass is made only once the first pass's last frame is recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...runtime.errors import LeanImageError, OperationCancelled
from .. import families
from ..adapters import shot_camera, shot_depth

if TYPE_CHECKING:  # a pass is a BatchRun or a RemoteBatchRun: Blender's process never loads BatchRun's threads
    from .sequence import BatchRun


class ShotSettings:
    def __init__(self, family_id: str, *, depth_range: str = shot_depth.PER_FRAME, align_depth: bool = False,
                 camera: str = shot_camera.PER_FRAME, fov: float | None = None, shard=None,
                 skip_existing: bool = False, farm: bool = False):
        self.family_id = family_id
        self.depth = None
        self.camera = None
        shot = families.get(family_id).shot
        if "depth" in shot:
            depth = shot_depth.ShotDepth(shot_depth.parse_depth_range(depth_range), align=align_depth)
            self.depth = depth if depth.changes_output else None
        if "camera" in shot:
            chosen = shot_camera.ShotCamera(camera, fov)
            self.camera = chosen if chosen.changes_output else None
        self._refuse_partial_runs(skip_existing=skip_existing, shard=shard, farm=farm)

    def _refuse_partial_runs(self, *, skip_existing: bool, shard, farm: bool) -> None:
        """A run over part of the shot (or frames written as they come) cannot honour an option
        that needs the whole shot in order or looked at first."""
        if self.depth is not None and self.depth.align and (skip_existing or shard or farm):
            # Refused, not resumed from the written file: only a float EXR holds the aligned depth
            # exactly (8/16-bit files are quantised and clipped to the range), and a frame another
            # process is computing now (frame claims) has no file yet to align to.
            breaks = "Skip Existing (--skip-existing)" if skip_existing else "a shard" if shard else "a farm"
            raise LeanImageError(
                f"Align Depth (--align-depth) aligns each frame to the one before it, so it runs the shot in "
                f"order from its first frame, and {breaks} would restart that chain part-way. Run the whole "
                "shot in one job (Overwrite, --overwrite), or turn off Align Depth."
            )
        if farm and self.needs_first_pass:
            raise LeanImageError(
                "A farm writes frames as they are computed, so it cannot look at the whole shot first. Give the "
                "shot's values: a depth range A:B (--depth-range A:B; a run with --depth-range auto-shot prints it "
                "as 'shot depth range: A..B'), a field of view (--fov DEG; --camera shot prints it)."
            )
        if shard and self.needs_first_pass:
            raise LeanImageError(
                "A shot-wide depth range (auto-shot) or one camera fitted for the shot looks at the whole "
                "shot, but a shard has only part of it. Give the shot's values instead: a depth range "
                "A:B (--depth-range A:B), a field of view (--fov DEG)."
            )

    @property
    def needs_first_pass(self) -> bool:
        return bool((self.depth and self.depth.needs_first_pass) or (self.camera and self.camera.needs_first_pass))

    @property
    def first_pass_keeps(self) -> str:
        return "depth ranges" if self.depth else "focal lengths"

    def record(self, ref, result) -> None:
        """The first pass's 'write': two floats of a frame, never the frame."""
        if self.depth is not None:
            self.depth.record(result.depth)
        if self.camera is not None:
            self.camera.record(result)

    def finish_first_pass(self) -> str:
        """Settles the shot's values; returns a line for the user."""
        lines = []
        if self.depth is not None and self.depth.needs_first_pass:
            low, high = self.depth.finish_first_pass()
            lines.append(f"shot depth range: {low:.6g}..{high:.6g} over {self.depth.frames_recorded} frame(s)")
        if self.camera is not None and self.camera.needs_first_pass:
            self.camera.finish_first_pass()
            lines.append(f"shot camera: {self.camera.describe()}")
        return "; ".join(lines)

    def adapter_kwargs(self) -> dict:
        return self.camera.adapter_kwargs() if self.camera is not None else {}

    def depth_product(self, depth, suffix: str, float_suffixes):
        """(image product, notes) of one frame's depth with the shot's range and alignment."""
        return self.depth.product(depth, suffix, float_suffixes)

    def depth_image(self, result, suffix: str, float_suffixes):
        """(image product, notes) of a result's depth with the shot's range and alignment."""
        return self.depth.product(result.depth, suffix, float_suffixes)

    @property
    def output_image(self):
        """What a job's output writes in place of the family's own image (models/outputs.py's
        ``image``): a depth sequence's shot depth; None when the shot changes no file."""
        return self.depth_image if self.depth is not None else None

    def as_dict(self) -> dict:
        fields = {}
        if self.depth is not None:
            fields.update(self.depth.as_dict())
        if self.camera is not None:
            fields["camera"] = self.camera.as_dict()
        return fields


class TwoPassBatch:
    """First pass (record) then the writing pass, each a BatchRun, with one BatchRun's interface.

    ``make_pass(write, extra_kwargs, first) -> BatchRun``: the first over every frame (nothing
    skipped: the shot's values cover the whole shot) with ``write = settings.record``, the second
    with the front-end's writer and the shot's adapter arguments."""

    def __init__(self, settings: ShotSettings, make_pass: Callable, write: Callable, cancel: threading.Event,
                 announce: Callable[[str], None] = lambda line: None):
        self._settings, self._make_pass, self._write = settings, make_pass, write
        self._cancel, self._announce = cancel, announce
        self._first = make_pass(settings.record, {}, True)
        self._second: BatchRun | None = None
        self._second_ready = threading.Event()
        self.report = self._first.report
        self.shot_line = ""  # the shot's values once the first pass is over, for the user

    @property
    def needs_model(self) -> bool:
        return self._first.needs_model

    def infer_all(self):
        """The worker: the first pass's inference, then (once pump has settled the shot's values)
        the writing pass's."""
        self._first.infer_all()
        while not self._second_ready.wait(0.02):
            if self._cancel.is_set():
                raise OperationCancelled("The batch was cancelled in its first pass; nothing was written.")
        if self._second is None:
            return self.report
        return self._second.infer_all()

    def pump(self, budget: float = 0.05, *, read: bool = True) -> bool:
        if self._second is not None:
            return self._second.pump(budget, read=read)
        try:
            if not self._first.pump(budget, read=read):
                return False
            if self._first.report.cancelled or self._cancel.is_set():
                self._second_ready.set()
                return True
            self.shot_line = self._settings.finish_first_pass()
            self._announce(self.shot_line)
            self._second = self._make_pass(self._write, self._settings.adapter_kwargs(), False)
            self.report = self._second.report
        except BaseException:
            self._second_ready.set()  # the worker ends instead of waiting for a writing pass
            raise
        self._second_ready.set()
        return False

    def cancel(self) -> None:
        self._cancel.set()
