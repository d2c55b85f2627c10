"""A whole job as plain data (bpy-free): what every front-end builds and one runner executes.

The command line, the farm's driver and workers, Process Sequence and Reconstruct Shot each turn
what the user gave (arguments, operator properties) into a :class:`JobSpec`, and
models/batch/runner.py runs it. It holds values only (no open files, no Blender data, no
callables), so it pickles and goes through JSON unchanged: a farm or a worker process receives the
very job the front-end built.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields, replace

from ..runtime.errors import LeanImageError
from ..runtime.settings import MAX_BUDGET_MB, MemoryBudgets
from .batch.frame_lists import MAX_FRAME, range_problem

# JSON deeper than this is no job (a job's deepest value is a frame_list entry, three levels down):
# refused before parsing, since the parser's recursion would fail first on 100 000-deep input
MAX_JSON_DEPTH = 32


class JobSpecError(LeanImageError, ValueError):
    """A job that cannot be run as given: one line naming the field, what it got and what it takes.
    A ValueError for code that receives jobs as data, a LeanImageError for the front-ends' one line."""


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse(name: str, wants: str, value) -> JobSpecError:
    return JobSpecError(f"job field {name}: give {wants}, got {_shown(value)}.")


def _text(name: str, value, *, optional: bool = False):
    """A str field; a path object (os.PathLike) is kept as its text, so the job stays plain data."""
    if value is None and optional:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise _refuse(name, "text" + (" or null" if optional else ""), value)
    return value


def _flag(name: str, value, *, optional: bool = False):
    if (value is None and optional) or isinstance(value, bool):
        return value
    raise _refuse(name, "true or false" + (" or null" if optional else ""), value)


def _whole(name: str, value, low: int, high: int, *, optional: bool = False):
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _refuse(name, f"a whole number from {low} to {high}" + (" or null" if optional else ""), value)
    return value


def _ints(name: str, value, count: int, wants: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__") or len(value) != count or \
            any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise _refuse(name, wants, value)
    return tuple(value)


def _frames(value):
    if value is None:
        return None
    start, stop, step = _ints("frames", value, 3, "[start, stop, step] as range() takes them, or null")
    problem = range_problem(start, stop - 1, step)
    if problem:
        raise JobSpecError(f"job field frames {list(value)}: {problem}")
    return start, stop, step


def _shard(value):
    if value is None:
        return None
    index, total = _ints("shard", value, 2, "[I, N] (task I of N), or null")
    if not 1 <= index <= total:
        raise _refuse("shard", "[I, N] with 1 <= I <= N", value)
    return index, total


def _list(name: str, value, wants: str) -> list:
    if value is None:
        return None
    if isinstance(value, (str, bytes, dict, os.PathLike)) or not isinstance(value, (list, tuple)):
        raise _refuse(name, wants, value)
    return list(value)


def _frame_list(value):
    frames = _list("frame_list", value, "a list of [frame number, file] pairs, or null")
    if frames is None:
        return None
    checked = []
    for index, entry in enumerate(frames):
        where = f"frame_list[{index}]"
        if isinstance(entry, (str, bytes, dict)) or not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise _refuse(where, "a [frame number, file] pair", entry)
        checked.append((_whole(where, entry[0], 0, MAX_FRAME), _text(where, entry[1])))
    return checked


def _output_list(value, frame_list):
    outputs = _list("output_list", value, "a list of files (one per frame of frame_list), or null")
    if outputs is None:
        return None
    outputs = [_text(f"output_list[{i}]", out) for i, out in enumerate(outputs)]
    if frame_list is None or len(outputs) != len(frame_list):
        count = "no frame_list" if frame_list is None else f"{len(frame_list)} frames in frame_list"
        raise JobSpecError(f"job field output_list: {len(outputs)} files for {count}; give one file per frame.")
    return outputs


def _values(value) -> dict:
    if not isinstance(value, dict):
        raise _refuse("values", "an object of option values", value)
    for key, item in value.items():
        if not isinstance(key, str):
            raise _refuse("values", "option names as text", key)
        if not isinstance(item, (bool, int, float, str)):
            raise _refuse(f"values.{key}", "a number, true/false or text", item)
    return dict(value)


def _budget(name: str, value):
    return _whole(name, value, 1, MAX_BUDGET_MB << 20, optional=True)


def _fov(value):
    if value is None:
        return None
    # its range is the shot camera's rule (models/adapters/shot_camera.py), applied before any run
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _refuse("shot.fov", "degrees (a number), or null", value)
    return float(value)


@dataclass
class ShotOptions:
    """The shot-wide options (models/batch/shot_batch.py's ShotSettings makes them work)."""

    depth_range: str = "per-frame"  # per-frame, auto-shot or A:B
    align_depth: bool = False
    camera: str = "per-frame"  # per-frame or shot
    fov: float | None = None  # degrees; None: fitted
    preview: int | None = None  # only this frame, with the same settings (the command line's --preview)

    def __post_init__(self):
        # the shot's words (per-frame, auto-shot, A:B) are read by models/batch/shot_batch.py, which
        # says what it takes; here only that each is the right kind of value
        self.depth_range = _text("shot.depth_range", self.depth_range)
        self.align_depth = _flag("shot.align_depth", self.align_depth)
        self.camera = _text("shot.camera", self.camera)
        self.fov = _fov(self.fov)
        self.preview = _whole("shot.preview", self.preview, 0, MAX_FRAME, optional=True)

    @classmethod
    def from_data(cls, data) -> ShotOptions:
        if not isinstance(data, dict):
            raise _refuse("shot", "an object of shot options", data)
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise JobSpecError(f"job field shot: options this version does not know: {', '.join(sorted(map(str, unknown)))}")
        return cls(**data)


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

    def __post_init__(self):
        """Every field checked (and a path object kept as its text) whoever built the job: one
        :class:`JobSpecError` naming the field. A farm worker, the Blender worker and any service
        receive jobs as data, so the job is safe to receive, not only what the front-ends check."""
        if not isinstance(self.family_id, str) or not self.family_id:
            raise _refuse("family_id", "a registered model family's id", self.family_id)
        for name in ("model", "model_path", "models_dir", "device"):
            setattr(self, name, _text(name, getattr(self, name)))
        for name in ("source", "output"):
            setattr(self, name, _text(name, getattr(self, name), optional=True))
        for name in ("writes_files", "overwrite", "skip_existing", "stop_on_error", "farm"):
            setattr(self, name, _flag(name, getattr(self, name)))
        self.in_sequence = _flag("in_sequence", self.in_sequence, optional=True)
        self.frames, self.shard = _frames(self.frames), _shard(self.shard)
        self.frame_list = _frame_list(self.frame_list)
        self.output_list = _output_list(self.output_list, self.frame_list)
        self.values = _values(self.values)
        self.ram_budget, self.vram_budget = _budget("ram_budget", self.ram_budget), _budget("vram_budget", self.vram_budget)
        if not isinstance(self.shot, ShotOptions):
            raise _refuse("shot", "shot options (ShotOptions)", self.shot)

    @property
    def budgets(self) -> MemoryBudgets:
        return MemoryBudgets(self.ram_budget, self.vram_budget)

    @property
    def frame_range(self) -> range | None:
        return range(*self.frames) if self.frames is not None else None

    def with_frames(self, frames: range | None) -> JobSpec:
        return replace(self, frames=None if frames is None else (frames.start, frames.stop, frames.step))

    def to_json(self) -> str:
        # a field set to a path object after construction is written as its text
        return json.dumps(asdict(self), sort_keys=True, default=_json_value)

    @classmethod
    def from_json(cls, text: str | bytes) -> JobSpec:
        """The job a front-end sent as JSON; anything else is one :class:`JobSpecError`."""
        data = _parsed(text)
        if not isinstance(data, dict):
            raise JobSpecError(f"a job is a JSON object of fields, got {type(data).__name__} ({_shown(data)}).")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise JobSpecError(f"a job with fields this version does not know: {', '.join(sorted(unknown))}")
        if "family_id" not in data:
            raise JobSpecError("job field family_id: missing; give a registered model family's id.")
        if "shot" in data:
            data["shot"] = ShotOptions.from_data(data["shot"])
        return cls(**data)


def _json_value(value):
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} is not plain data")


def _nesting(text: str) -> int:
    """How deep the brackets of ``text`` go, strings skipped (counted without recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _parsed(text: str | bytes):
    if isinstance(text, (bytes, bytearray)):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JobSpecError(f"a job is UTF-8 JSON text: {exc}.") from None
    if not isinstance(text, str):
        raise JobSpecError(f"a job is JSON text, got {type(text).__name__}.")
    if _nesting(text) > MAX_JSON_DEPTH:
        raise JobSpecError(f"a job's JSON is nested deeper than {MAX_JSON_DEPTH} levels; no job is.")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise JobSpecError(f"a job is JSON text: {exc}.") from None
