"""Frame lists (bpy-free): which frames a batch covers, where each one goes, and a farm task's share.

Inputs: one file; a folder of images (sorted by name; frame numbers from the names' trailing
digits, else 1, 2, ...); a numbered pattern (``shot_####.png`` or ``shot_%04d.png``); or one frame
file of a numbered sequence with a frame range. A range is ``A-B`` or ``A-B:STEP``; a shard is
``I/N``: contiguous parts of the resolved list, so N farm tasks cover it exactly once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..runtime.errors import LeanImageError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".exr", ".bmp", ".tga", ".webp", ".hdr")
_HASHES = re.compile(r"#+")
_PRINTF = re.compile(r"%0?(\d*)d")
_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")


@dataclass(frozen=True)
class FrameRef:
    number: int
    path: Path


def parse_frames(text: str) -> range:
    """``A``, ``A-B`` or ``A-B:STEP`` (inclusive) as a range."""
    match = re.fullmatch(r"\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?(?::\s*(\d+)\s*)?", text or "")
    if match is None:
        raise LeanImageError(f"Frames {text!r}: write A-B or A-B:STEP, e.g. 1-48 or 1-48:2.")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    step = int(match.group(3) or 1)
    if last < first or step < 1:
        raise LeanImageError(f"Frames {text!r}: the end comes before the start, or the step is 0.")
    return range(first, last + 1, step)


def is_pattern(text: str) -> bool:
    name = Path(str(text)).name
    return bool(_HASHES.search(name) or _PRINTF.search(name))


def frame_path(pattern: str | Path, number: int) -> Path:
    """The file of frame ``number``: ``####`` becomes a zero-padded number of that width."""
    pattern = Path(pattern)
    name = pattern.name
    if _HASHES.search(name):
        name = _HASHES.sub(lambda m: f"{number:0{len(m.group(0))}d}", name, count=1)
    elif _PRINTF.search(name):
        name = _PRINTF.sub(lambda m: f"{number:0{int(m.group(1) or 0)}d}", name, count=1)
    else:
        raise LeanImageError(f"'{pattern}' has no frame number placeholder (#### or %04d).")
    return pattern.with_name(name)


def pattern_of(frame_file: str | Path) -> tuple[str, int] | None:
    """(``name_####.ext`` pattern, frame number) of a numbered frame file, as Blender reads
    image sequences (the digits just before the suffix); None when the name has none."""
    path = Path(frame_file)
    match = _TRAILING_DIGITS.match(path.stem)
    if match is None:
        return None
    prefix, digits = match.groups()
    return str(path.with_name(f"{prefix}{'#' * len(digits)}{path.suffix}")), int(digits)


def _pattern_regex(pattern: Path) -> re.Pattern:
    name = pattern.name
    hashes = _HASHES.search(name)
    if hashes:
        head, tail = name[: hashes.start()], name[hashes.end() :]
    else:
        printf = _PRINTF.search(name)
        head, tail = name[: printf.start()], name[printf.end() :]
    return re.compile(re.escape(head) + r"(\d+)" + re.escape(tail) + "$")


def frame_number(pattern: str | Path, name: str) -> int | None:
    """The frame number of file ``name`` under ``pattern`` (``shot_####.png``), None if it is not one."""
    match = _pattern_regex(Path(pattern)).match(name)
    return int(match.group(1)) if match else None


def resolve_input(
    spec: str | Path, frames: range | None = None, exclude: Callable[[Path], bool] | None = None
) -> list[FrameRef]:
    """The frames a batch reads (see module doc); LeanImageError saying what is wrong. Listed
    files for which ``exclude`` is true (what the command itself writes) are not frames."""
    text = str(spec)
    exclude = exclude or (lambda path: False)
    path = Path(text).expanduser()
    if is_pattern(text):
        if not path.parent.is_dir():
            raise LeanImageError(f"Input folder '{path.parent}' does not exist.")
        if frames is not None:
            refs = [FrameRef(n, frame_path(path, n)) for n in frames]
            missing = [r for r in refs if not r.path.is_file()]
            if len(missing) == len(refs):
                raise LeanImageError(f"No frame of '{path}' in {_describe(frames)} exists.")
            return refs  # a missing frame in between is reported as failed, not silently dropped
        regex = _pattern_regex(path)
        found = sorted(
            (int(m.group(1)), p)
            for p in path.parent.iterdir()
            if (m := regex.match(p.name)) and p.is_file() and not exclude(p)
        )
        if not found:
            raise LeanImageError(f"No file matches '{path}'.")
        return [FrameRef(n, p) for n, p in found]
    if path.is_dir():
        files = sorted(
            p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not exclude(p)
        )
        if not files:
            raise LeanImageError(f"Folder '{path}' holds no image files ({', '.join(IMAGE_SUFFIXES)}).")
        numbers = [pattern_of(p)[1] if pattern_of(p) else None for p in files]
        if None in numbers or len(set(numbers)) != len(numbers):
            numbers = list(range(1, len(files) + 1))
        refs = [FrameRef(n, p) for n, p in zip(numbers, files, strict=True)]
        if frames is not None:
            refs = [r for r in refs if r.number in frames]
            if not refs:
                raise LeanImageError(f"No image in '{path}' has a frame number in {_describe(frames)}.")
        return refs
    if path.is_file():
        numbered = pattern_of(path)
        if frames is not None and numbered is not None:
            return resolve_input(numbered[0], frames, exclude)
        return [FrameRef(numbered[1] if numbered else 1, path)]
    raise LeanImageError(f"Input '{path}' not found: give an image file, a folder or a pattern like shot_####.png.")


def _describe(frames: range) -> str:
    return f"{frames.start}-{frames.stop - 1}" + (f":{frames.step}" if frames.step != 1 else "")


def parse_shard(text: str) -> tuple[int, int] | None:
    """``I/N``: task I (1-based) of N; empty: None (every frame)."""
    if not (text or "").strip():
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise LeanImageError(f"Shard {text!r}: write I/N with 1 <= I <= N, e.g. 3/8 (task 3 of 8).")
    return int(match.group(1)), int(match.group(2))


def shard_slice(count: int, shard: tuple[int, int] | None) -> slice:
    """THE split rule of a render farm (the Flamenco job type, farm/flamenco/lean_image_ai.js, uses
    the same one): N contiguous parts of the resolved frame list, task I taking
    ``[(I-1)*count // N, I*count // N)``. The N parts cover every frame exactly once, differ in size
    by at most one frame, and depend only on the list, so a retried task gets the same frames."""
    if shard is None:
        return slice(0, count)
    index, total = shard
    return slice((index - 1) * count // total, index * count // total)


def output_paths(refs: list[FrameRef], output: str | Path | None, default_name: Callable[[FrameRef], str]) -> list[Path]:
    """Where each frame's result goes: a pattern (``out_####.exr``), a folder (default names in
    it; for several frames, a name without a suffix that does not exist yet is one), or, for one
    frame, a file. ``None``: default names beside each input."""
    if output is None:
        return [r.path.with_name(default_name(r)) for r in refs]
    text = str(output)
    path = Path(text).expanduser()
    if is_pattern(text):
        return [frame_path(path, r.number) for r in refs]
    if path.is_dir() or text.endswith(("/", "\\")):
        return [path / default_name(r) for r in refs]
    if len(refs) == 1:
        return [path]
    if not path.exists() and not path.suffix:  # a folder still to be made, as Blender's render output
        return [path / default_name(r) for r in refs]
    raise LeanImageError(
        f"'{path}' is one file but the input has {len(refs)} frames: give a folder or a pattern like out_####.exr."
    )


# ---- the batch run ----------------------------------------------------------------------------
