"""What a batch did, frame by frame: written, skipped, failed, the warnings (bpy-free).

A module of its own, apart from models/batch/sequence.py's BatchRun and its threads: Blender's
process reads reports (every job's end) and never loads a module that makes threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
