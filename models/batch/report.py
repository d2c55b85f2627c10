"""What a batch did, frame by frame: written, skipped, failed, the warnings (bpy-free).

A module of its own, apart from models/batch/sequence.py's BatchRun and its threads: Blender's
process reads reports (every job's end) and never loads a module that makes threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class BatchReport:
    total: int
    written: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cancelled: bool = False
    seconds: float = 0.0

    def wrote(self, number: int, notes, result) -> None:
        """A frame written: its number, the writer's notes and the result's own warnings."""
        self.written.append(number)
        self.warnings.extend(notes or [])
        self.warnings.extend(getattr(result, "warnings", None) or [])

    def summary(self) -> str:
        text = f"{len(self.written)} written, {len(self.skipped)} skipped, {len(self.failed)} failed of {self.total}"
        if self.cancelled:
            text += " (cancelled)"
        return text

    def as_dict(self) -> dict:
        return {
            "frames": self.total,
            "written": len(self.written),
            "skipped": len(self.skipped),
            "failed": [{"frame": n, "error": e} for n, e in self.failed],
            "cancelled": self.cancelled,
            "seconds": round(self.seconds, 3),
        }


class Pumped(Protocol):
    """Work a host drives in slices from its own loop, with no thread of its own there (Blender's
    timer, operators/jobs.py): this batch run, models/worker/remote_batch.py's RemoteBatchRun and
    RemoteCall, a shot's TwoPassBatch (models/batch/shot_batch.py) and the runner that makes them
    (models/batch/runner.py)."""

    def pump(self, budget: float = 0.05) -> bool:
        """Do about ``budget`` seconds of the host's side (read frames, write results); True once over."""

    def cancel(self) -> None:
        """Stop soon: no new frame is started, what was written stays."""


class PumpedBatch(Pumped, Protocol):
    """A pumped batch of frames, as the runner and the host see it."""

    @property
    def report(self) -> BatchReport:
        """Written, skipped and failed frames so far."""

    @property
    def needs_model(self) -> bool:
        """False when every frame is skipped: no model is loaded at all."""
