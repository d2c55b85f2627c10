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

from ...runtime.errors import LeanImageError, user_path
from ..file_formats import FRAME_SUFFIXES

_HASHES = re.compile(r"#+")
_PRINTF = re.compile(r"%0?(\d*)d")
_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")
MAX_FRAME = 1_048_574  # Blender's last frame (MAXFRAME); frame numbers beyond it are a typo
MAX_MISSING_FRAMES = 10_000  # frames of a range that may be missing (reported failed) before it is refused


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
    problem = range_problem(first, last, step)
    if problem:
        raise LeanImageError(f"Frames {text!r}: {problem}")
    return range(first, last + 1, step)


def range_problem(first: int, last: int, step: int) -> str:
    """What is wrong with the inclusive frames ``first``-``last`` every ``step`` ("" if nothing):
    THE rule of a frame range, for the command line's --frames and for a job received as data."""
    if first < 0 or last < 0:  # a frame file's number has no sign: "-3" would be looked for and never found
        return "frame numbers start at 0; give A-B with A and B of 0 or more."
    if last < first or step < 1:
        return "the end comes before the start, or the step is 0."
    if max(first, last, step) > MAX_FRAME:
        return f"frame numbers and steps go up to {MAX_FRAME:,} (as in Blender)."
    return ""


def _kept(matches: list[tuple[int, Path]], exclude: Callable[[Path], bool], where: str) -> list[tuple[int, Path]]:
    """``matches`` less what the command writes itself; when that leaves none of several, the output
    names the inputs: said as such, not as "no file matches" about files that are there."""
    kept = [(n, p) for n, p in matches if not exclude(p)]
    if matches and not kept:
        raise LeanImageError(
            f"The output names the input files themselves ({len(matches)} in {where}, e.g. "
            f"{min(p.name for _, p in matches)}): writing would overwrite the inputs. Give OUTPUT another name or folder."
        )
    return kept


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


def _claims(numbered: list[tuple[int, Path]], where: str) -> dict[int, Path]:
    """Frame number -> its one file; two files claiming one number is an error naming them all."""
    by_number: dict[int, list[Path]] = {}
    for number, path in numbered:
        by_number.setdefault(number, []).append(path)
    clashes = {n: paths for n, paths in by_number.items() if len(paths) > 1}
    if clashes:
        shown = "; ".join(
            f"frame {n}: {', '.join(p.name for p in sorted(paths))}" for n, paths in sorted(clashes.items())[:5]
        )
        more = f" (and {len(clashes) - 5} more frame numbers)" if len(clashes) > 5 else ""
        raise LeanImageError(
            f"{where}: several files claim the same frame number ({shown}{more}), so their results would "
            "overwrite each other. Move or rename the extra files, or give a pattern that names one set."
        )
    return {n: paths[0] for n, paths in by_number.items()}


def _in_range(claims: dict[int, Path], frames: range, pattern: Path) -> list[FrameRef]:
    """The frames of ``frames`` (a missing one in between is reported as failed later, not
    dropped); refused at once when none exists or when most of a huge range is missing."""
    present = sorted(n for n in claims if n in frames)
    if not present:
        raise LeanImageError(f"No frame of '{pattern}' in {_describe(frames)} exists.")
    missing = len(frames) - len(present)
    if missing > MAX_MISSING_FRAMES:
        raise LeanImageError(
            f"Frames {_describe(frames)}: only {len(present)} of its {len(frames):,} frames of '{pattern}' exist "
            f"(frames {present[0]} to {present[-1]}); give the range that exists, e.g. --frames "
            f"{present[0]}-{present[-1]}."
        )
    return [FrameRef(n, claims.get(n) or frame_path(pattern, n)) for n in frames]


def resolve_input(
    spec: str | Path, frames: range | None = None, exclude: Callable[[Path], bool] | None = None
) -> list[FrameRef]:
    """The frames a batch reads (see module doc); LeanImageError saying what is wrong. Listed
    files for which ``exclude`` is true (what the command itself writes) are not frames.

    Each frame number maps to exactly one file: ``shot_####.png`` matches any number of digits
    (as Blender does), so ``shot_0001.png`` and ``shot_1.png`` both claim frame 1 and are refused
    together, before any model runs. A folder's frames are numbered by the digits that end each
    file's name; a folder where no name ends in digits is numbered 1, 2, ... in name order; a
    folder that mixes the two is refused (nothing is renumbered behind the user's back)."""
    text = str(spec)
    exclude = exclude or (lambda path: False)
    path = user_path(text)
    if is_pattern(text):
        return _from_pattern(path, frames, exclude)
    if path.is_dir():
        return _from_folder(path, frames, exclude)
    if path.is_file():
        return _from_file(path, frames, exclude)
    raise LeanImageError(f"Input '{path}' not found: give an image file, a folder or a pattern like shot_####.png.")


def _from_pattern(path: Path, frames: range | None, exclude: Callable[[Path], bool]) -> list[FrameRef]:
    if not path.parent.is_dir():
        raise LeanImageError(f"Input folder '{path.parent}' does not exist.")
    regex = _pattern_regex(path)
    matches = [(int(m.group(1)), p) for p in path.parent.iterdir() if (m := regex.match(p.name)) and p.is_file()]
    claims = _claims(_kept(matches, exclude, f"'{path}'"), f"'{path}'")
    if frames is not None:
        return _in_range(claims, frames, path)
    if not claims:
        raise LeanImageError(f"No file matches '{path}'.")
    return [FrameRef(n, p) for n, p in sorted(claims.items())]


def _from_folder(path: Path, frames: range | None, exclude: Callable[[Path], bool]) -> list[FrameRef]:
    images = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in FRAME_SUFFIXES)
    files = [p for _, p in _kept([(0, p) for p in images], exclude, f"Folder '{path}'")]
    if not files:
        raise LeanImageError(f"Folder '{path}' holds no image files ({', '.join(FRAME_SUFFIXES)}).")
    refs = _numbered(path, files)
    if frames is not None:
        refs = [r for r in refs if r.number in frames]
        if not refs:
            raise LeanImageError(f"No image in '{path}' has a frame number in {_describe(frames)}.")
    return refs


def _numbered(folder: Path, files: list[Path]) -> list[FrameRef]:
    """A folder's files as frames: by the digits ending their names, or 1, 2, ... when no name
    ends in digits; a mix of the two is refused."""
    numbered = [(found[1], p) for p in files if (found := pattern_of(p))]
    if not numbered:
        return [FrameRef(n, p) for n, p in enumerate(files, start=1)]
    if len(numbered) < len(files):
        plain = next(p.name for p in files if pattern_of(p) is None)
        raise LeanImageError(
            f"Folder '{folder}' mixes numbered frames ({numbered[0][1].name}) with files whose names end "
            f"in no frame number ({plain}): move those out, or give a pattern such as "
            f"{Path(pattern_of(numbered[0][1])[0]).name} to take the numbered ones."
        )
    return [FrameRef(n, p) for n, p in sorted(_claims(numbered, f"Folder '{folder}'").items())]


def _from_file(path: Path, frames: range | None, exclude: Callable[[Path], bool]) -> list[FrameRef]:
    numbered = pattern_of(path)
    if frames is not None and numbered is None:  # a range over one file would be ignored: say so
        raise LeanImageError(
            f"Frames {_describe(frames)} given with '{path.name}', whose name ends in no frame number: "
            "give a frame of a numbered sequence (shot_0001.png), a pattern (shot_####.png) or a folder."
        )
    if frames is not None:
        return resolve_input(numbered[0], frames, exclude)
    return [FrameRef(numbered[1] if numbered else 1, path)]


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
    """THE split rule of a render farm (the Flamenco job type, ui/cli/flamenco/lean_image_ai.js, uses
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
    path = user_path(text)
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
