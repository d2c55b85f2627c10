"""A whole job as plain data (bpy-free): what every front-end builds and one runner executes.

The command line, the farm's driver and workers, Process Sequence and Reconstruct Shot each turn
what the user gave (arguments, operator properties) into a :class:`JobSpec`, and
models/batch/runner.py runs it. It holds values only (no open files, no Blender data, no
callables), so it pickles and goes through JSON unchanged: a farm or a worker process receives the
very job the front-end built.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace

from ..runtime.settings import MemoryBudgets


@dataclass
class ShotOptions:
    """The shot-wide options (models/batch/shot_batch.py's ShotSettings makes them work)."""

    depth_range: str = "per-frame"  # per-frame, auto-shot or A:B
    align_depth: bool = False
    camera: str = "per-frame"  # per-frame or shot
    fov: float | None = None  # degrees; None: fitted
    preview: int | None = None  # only this frame, with the same settings (the command line's --preview)


@dataclass
class JobSpec:
    family_id: str
    model: str = ""  # a catalog id or an ONNX file (one rule: models/store/library.py)
    model_path: str = ""  # a file given as a file (Blender's Model File)
    models_dir: str = ""  # "": the default models folder
    # inputs: one image, a folder or a pattern; None: the command line's generated demo image
    source: str | None = None
    frames: tuple[int, int, int] | None = None  # A-B:S as range(A, B + 1, S)'s start, stop, step
    frame_list: list[tuple[int, str]] | None = None  # explicit (number, file) frames instead (a farm chunk)
    # outputs: a file, a folder or a pattern; None: the family's default beside the input
    output: str | None = None
    output_list: list[str] | None = None  # one file per frame of frame_list
    writes_files: bool = True  # False: each result goes to the front-end (Reconstruct Shot's meshes)
    # outputs named as frames of a sequence; None: when there is more than one frame, a range, a
    # pattern or a folder (a single image keeps its name)
    in_sequence: bool | None = None
    overwrite: bool = False
    skip_existing: bool = False
    shard: tuple[int, int] | None = None  # I/N
    stop_on_error: bool = False
    values: dict = field(default_factory=dict)  # the family's option values
    device: str = "auto"
    ram_budget: int | None = None  # bytes; None: no limit
    vram_budget: int | None = None
    shot: ShotOptions = field(default_factory=ShotOptions)
    farm: bool = False  # frames written as computed elsewhere: no first pass over the whole shot

    @property
    def budgets(self) -> MemoryBudgets:
        return MemoryBudgets(self.ram_budget, self.vram_budget)

    @property
    def frame_range(self) -> range | None:
        return range(*self.frames) if self.frames is not None else None

    def with_frames(self, frames: range | None) -> JobSpec:
        return replace(self, frames=None if frames is None else (frames.start, frames.stop, frames.step))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        data = json.loads(text)
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"a job with fields this version does not know: {', '.join(sorted(unknown))}")
        data["shot"] = ShotOptions(**data.get("shot", {}))
        for name in ("frames", "shard"):  # JSON has lists, the job tuples
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        if data.get("frame_list") is not None:
            data["frame_list"] = [(int(n), str(p)) for n, p in data["frame_list"]]
        return cls(**data)
