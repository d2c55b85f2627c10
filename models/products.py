"""What each family's result becomes as files, and which files can hold it (bpy-free).

The policy, the same for Blender and the command line, single images and sequences; what a
family's result becomes (its tag, default format, the formats it accepts, companion files, an
image or a writer of its own) is the family's :class:`~.family.Output` record in its own module,
what a format keeps is models/file_formats.py. Two kinds of image result:

- :class:`ColourImage` (a cut-out, an upscale): written like its source (alpha kept where the
  format has it);
- :class:`ValueImage` (depth): float where the file keeps float (EXR, a one-channel TIFF from the
  command line), else normalised to 0..1 with the range it was mapped from returned with the image
  so the writer can record it (report, and the file's metadata where the format has it).

Output type, when the user named no file format (:func:`default_suffix`): it follows the input. A
float input (EXR, HDR, float TIFF) gives a float EXR (with alpha for a cut-out; the TIFF writers
here and in Blender keep float in one grey channel only, so EXR is the float file that holds
colour and alpha everywhere); an 8- or 16-bit input gives PNG. Bits follow the input frame by
frame (models/result_images.py): 16-bit and float sources give 16-bit PNG/TIFF where the writer can,
and a note says where bits were dropped.

Where results go when no OUTPUT is given: one image gives ``<stem>_<kind>.<ext>`` beside it; a
folder or a pattern gives the folder ``<input folder>_<kind>`` beside the input folder
(:func:`default_folder`), each frame named ``<name>_<kind>_<number>.<ext>`` with its own number, so
results never land among the inputs and a re-run finds them where it left them. Listing the
inputs leaves out any file this command would write (:func:`written_by`), so an OUTPUT that is the
input folder still never feeds earlier results back in as frames.

The front-end encodes the images (Blender with its own writers, the command line with Pillow and
OpenEXR); this module decides what is written; a family's ``write`` writes its non-image files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from ..runtime.errors import LeanImageError, user_path
from . import file_formats
from .batch import frame_lists
from .batch.frame_lists import output_paths, shard_slice
from .family import Output
from .result_images import FLOAT_SUFFIXES, ImageProduct


def output_of(family_id: str) -> Output:
    """The family's record of its outputs (models/family.py)."""
    from . import families  # the families' modules import this one

    family = families.get(family_id)
    if family.output is None:
        raise LeanImageError(f"The {family.title} family declares no output files; it cannot write results.")
    return family.output


def default_suffix(family_id: str, input_kind: str = "8-bit") -> str:
    """The output format when the user named none: it follows the input (module doc)."""
    return output_of(family_id).default_suffix(input_kind)


def describe_output(family_id: str, suffix: str, input_kind: str, float_suffixes=FLOAT_SUFFIXES) -> str:
    """How the report names what is written, e.g. "float EXR (follows the float input)"."""
    output = output_of(family_id)
    return output.description or output.image.describe(suffix, input_kind, float_suffixes)


def default_name(family_id: str, stem: str, number: int | None = None, suffix: str | None = None) -> str:
    output = output_of(family_id)
    tag, suffix = output.tag, suffix or output.suffix
    return f"{stem}_{tag}{suffix}" if number is None else f"{stem}_{tag}_{number:04d}{suffix}"


def default_name_for(
    family_id: str, path: Path, number: int, *, in_sequence: bool, suffix: str | None = None
) -> str:
    """The default output name for one input file: ``<stem>_<kind>.<ext>``, or for a frame of a
    sequence ``<name>_<kind>_####.<ext>`` with the frame digits moved to the end."""
    if not in_sequence:
        return default_name(family_id, path.stem, suffix=suffix)
    match = re.match(r"^(.*?)\d+$", path.stem)
    stem = match.group(1).rstrip("_.-") if match else path.stem
    return default_name(family_id, stem or "frame", number, suffix)


def default_folder(family_id: str, input_folder: Path) -> Path:
    """Where a folder's or a pattern's results go when no OUTPUT is given: ``<folder>_<kind>``
    beside the input folder (``plates/`` -> ``plates_depth/``)."""
    return input_folder.parent / f"{input_folder.name or 'frames'}_{output_of(family_id).tag}"


def written_by(family_id: str, output: str | os.PathLike | None) -> Callable[[Path], bool]:
    """Whether a file met while listing the inputs is one this command writes for ``output``
    (a pattern's frames, a folder's default names and their companions, or the one file named):
    such files are left out of the listing, so earlier results are never taken for frames."""
    if output is None:  # the default folder is beside the inputs, never among them
        return lambda path: False
    text = str(output)
    target = user_path(text).resolve()
    output_files = output_of(family_id)
    if frame_lists.is_pattern(text):
        patterns = output_files.companion_paths(target)

        def in_pattern(path: Path) -> bool:
            return path.resolve().parent == target.parent and any(
                frame_lists.frame_number(pattern, path.name) is not None for pattern in patterns
            )

        return in_pattern
    stem = rf".+_{re.escape(output_files.tag)}_\d+"
    companions = [re.escape(t).replace(re.escape("{stem}"), stem) for t in output_files.companions]
    names = re.compile("^(?:" + "|".join([stem + r"\.[^.]+", *companions]) + ")$")
    folder_given = target.is_dir() or text.endswith(("/", "\\")) or not target.suffix

    def written(path: Path) -> bool:
        path = path.resolve()
        if folder_given:
            return path.parent == target and names.match(path.name) is not None
        return path == target

    return written


def check_output(family_id: str, path: Path, writer: file_formats.Writer = file_formats.COMMAND_LINE) -> None:
    """Refuse, before any model runs, a file that could not hold the family's result."""
    output = output_of(family_id)
    suffix = path.suffix.lower()
    if output.formats and suffix not in output.formats:
        raise LeanImageError(f"Cannot write {output.what} to '{path.name}': give {output.formats_hint}.")
    row = file_formats.find(suffix)
    if output.needs_alpha and row is not None and not row.alpha:
        raise LeanImageError(
            f"Cannot write {output.what} to '{path.name}': {suffix} has no alpha channel, and "
            f"{output.what} needs it. Use {writer.advice(alpha=True)}."
        )


def companion_paths(family_id: str, path: Path) -> list[Path]:
    """Every file one result writes (checked up front like the main one)."""
    return output_of(family_id).companion_paths(path)


def _writable_folder(path: Path) -> set[Path]:
    """The folders to make for ``path`` (none when its folder is there); LeanImageError when
    the folder, or the one it would be made in, is not writable."""
    folder, to_make = path.parent, set()
    if not folder.is_dir():
        to_make.add(folder)
        while not folder.is_dir() and folder.parent != folder:  # where it would be made
            folder = folder.parent
    if not os.access(folder, os.W_OK):
        raise LeanImageError(f"Output folder {folder} is not writable.")
    return to_make


def output_path(path: Path) -> Path:
    """An output's absolute path: its folder resolved, its own name never (a symbolic link at
    the name is the entry a result replaces, not a way to somewhere else)."""
    path = Path(path)
    return path.parent.resolve() / path.name


def plan_outputs(
    family_id: str,
    inputs: list[Path],
    outputs: list[Path],
    *,
    overwrite: bool,
    skip_existing: bool,
    check_format: Callable[[Path], None],
    writer: file_formats.Writer = file_formats.COMMAND_LINE,
) -> set[int]:
    """Check every output before any model runs, then make the output folders not there yet;
    returns the indices to skip (existing outputs
    kept with ``skip_existing``). LeanImageError saying what is wrong and what to do."""
    skip = set()
    to_make: set[Path] = set()
    sources = {os.path.normcase(str(p.resolve())) for p in inputs}
    for index, out in enumerate(outputs):
        check_output(family_id, out, writer)
        # any entry at the name is an output there, a symbolic link too (dangling or not): a link
        # planted in a shared folder must not send the result elsewhere
        kept = os.path.lexists(out) and not overwrite
        for path in companion_paths(family_id, out):
            check_format(path)
            if os.path.normcase(str(path)) in sources:
                raise LeanImageError(f"Output {path} is an input image; choose another name or folder.")
            if path.is_dir():
                raise LeanImageError(f"Output path {path} is a folder; give a file name such as result.png.")
            if not kept:  # a kept output writes nothing: its folder may be read-only
                to_make |= _writable_folder(path)
        if kept and not skip_existing:
            raise LeanImageError(
                f"{out} exists. Ask to overwrite it (--overwrite, overwrite=True), or to skip existing "
                "outputs and do the rest (--skip-existing, skip_existing=True)."
            )
        if kept:
            skip.add(index)
    # as Blender does for render output, once every check has passed: farm tasks and scripts name
    # folders still to be made (exist_ok: a sibling task may make the same one at the same moment)
    for folder in sorted(to_make):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LeanImageError(f"Output folder {folder} cannot be made ({exc.strerror}); choose another.") from exc
    return skip


def plan_batch(
    family_id: str,
    refs: list,
    output: str | os.PathLike | None,
    *,
    in_sequence: bool,
    shard: tuple[int, int] | None,
    overwrite: bool,
    skip_existing: bool,
    check_format: Callable[[Path], None],
    inputs_are_files: bool = True,
    suffix: str | None = None,
    writer: file_formats.Writer = file_formats.COMMAND_LINE,
) -> tuple[list, list[Path], set]:
    """(this task's frames, their output files, the frames to skip): output names from the whole
    frame list (so N shards write what one run would), then this shard's part, then every check
    of :func:`plan_outputs`, all before any model runs. ``suffix``: the default names' format
    (:func:`default_suffix`); no ``output`` for a sequence: :func:`default_folder`."""
    def default(ref):
        return default_name_for(family_id, ref.path, ref.number, in_sequence=in_sequence, suffix=suffix)

    if output is None and in_sequence and refs and inputs_are_files:
        output = f"{default_folder(family_id, refs[0].path.parent)}{os.sep}"
    outputs = [output_path(p) for p in output_paths(refs, output, default)]
    claimed: dict[str, object] = {}
    for ref, out in zip(refs, outputs, strict=True):
        earlier = claimed.setdefault(os.path.normcase(str(out)), ref)
        if earlier is not ref:
            raise LeanImageError(
                f"Frames {earlier.number} ({earlier.path.name}) and {ref.number} ({ref.path.name}) would both "
                f"be written to {out}; give a pattern with the frame number (out_####.png) or rename one input."
            )
    inputs = [r.path for r in refs] if inputs_are_files else []
    part = shard_slice(len(refs), shard)
    refs, outputs = refs[part], outputs[part]
    skipped = plan_outputs(
        family_id, inputs, outputs, overwrite=overwrite, skip_existing=skip_existing, check_format=check_format,
        writer=writer,
    )
    return refs, outputs, {refs[i] for i in skipped}


def image_product(family_id: str, result, suffix: str, float_suffixes=FLOAT_SUFFIXES) -> ImageProduct:
    """The image a family's result is written as, for a file with ``suffix`` (the writer keeps
    floats in ``float_suffixes``)."""
    output = output_of(family_id)
    if output.image is None:
        raise ValueError(f"{family_id} results are not one image")
    return output.image.product(result, suffix, float_suffixes)


def write_result(
    family_id: str, path: Path, result, values: dict, write_image: Callable[[Path, ImageProduct], list[str]],
    float_suffixes=FLOAT_SUFFIXES,
) -> tuple[list[str], ImageProduct | None]:
    """Write one result to ``path`` and its companions with the front-end's ``write_image``;
    returns the notes for the user and the image written (None for a result that is not one)."""
    output = output_of(family_id)
    if output.write is not None:
        return output.write(path, result, values, write_image), None
    product = image_product(family_id, result, path.suffix, float_suffixes)
    return write_image(path, product) or [], product
