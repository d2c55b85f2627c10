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
OpenEXR); a family's ``write`` writes its non-image files. Each entry point here is a thin call
onto the job's :class:`~.outputs.JobOutput` (models/outputs.py), which plans, claims and writes;
a front-end that holds one job's output makes it once with :func:`job_output`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from . import file_formats
from .family import Output
from .outputs import JobOutput, output_path
from .result_images import FLOAT_SUFFIXES, ImageProduct

__all__ = ["ImageProduct", "JobOutput", "output_path"]


def job_output(family_id: str, writer: file_formats.Writer = file_formats.COMMAND_LINE) -> JobOutput:
    """One job's output of the family (models/outputs.py)."""
    return JobOutput.of(family_id, writer)


def output_of(family_id: str) -> Output:
    """The family's record of its outputs (models/family.py)."""
    return JobOutput.of(family_id).record


def default_suffix(family_id: str, input_kind: str = "8-bit") -> str:
    """The output format when the user named none: it follows the input (module doc)."""
    return JobOutput.of(family_id).default_suffix(input_kind)


def describe_output(family_id: str, suffix: str, input_kind: str, float_suffixes=FLOAT_SUFFIXES) -> str:
    """How the report names what is written, e.g. "float EXR (follows the float input)"."""
    return JobOutput.of(family_id).describe(suffix, input_kind, float_suffixes)


def default_name(family_id: str, stem: str, number: int | None = None, suffix: str | None = None) -> str:
    return JobOutput.of(family_id).default_name(stem, number, suffix)


def default_name_for(
    family_id: str, path: Path, number: int, *, in_sequence: bool, suffix: str | None = None
) -> str:
    """The default output name for one input file (:meth:`JobOutput.default_name_for`)."""
    return JobOutput.of(family_id).default_name_for(path, number, in_sequence=in_sequence, suffix=suffix)


def default_folder(family_id: str, input_folder: Path) -> Path:
    """Where a folder's or a pattern's results go when no OUTPUT is given (:meth:`JobOutput.default_folder`)."""
    return JobOutput.of(family_id).default_folder(input_folder)


def written_by(family_id: str, output: str | os.PathLike | None) -> Callable[[Path], bool]:
    """Whether a file met while listing the inputs is one this command writes for ``output``
    (:meth:`JobOutput.written_by`): such files are never taken for frames."""
    return JobOutput.of(family_id).written_by(output)


def check_output(family_id: str, path: Path, writer: file_formats.Writer = file_formats.COMMAND_LINE) -> None:
    """Refuse, before any model runs, a file that could not hold the family's result."""
    JobOutput.of(family_id, writer).check(path)


def companion_paths(family_id: str, path: Path) -> list[Path]:
    """Every file one result writes (checked up front like the main one)."""
    return JobOutput.of(family_id).companion_paths(path)


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
    returns the indices to skip (:meth:`JobOutput.plan_files`)."""
    return JobOutput.of(family_id, writer).plan_files(
        inputs, outputs, overwrite=overwrite, skip_existing=skip_existing, check_format=check_format
    )


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
    """(this task's frames, their output files, the frames to skip), every check made before any
    model runs (:meth:`JobOutput.plan`)."""
    return JobOutput.of(family_id, writer).plan(
        refs, output, in_sequence=in_sequence, shard=shard, overwrite=overwrite, skip_existing=skip_existing,
        check_format=check_format, inputs_are_files=inputs_are_files, suffix=suffix,
    )


def image_product(family_id: str, result, suffix: str, float_suffixes=FLOAT_SUFFIXES) -> ImageProduct:
    """The image a family's result is written as, for a file with ``suffix`` (the writer keeps
    floats in ``float_suffixes``)."""
    return JobOutput.of(family_id).image(result, suffix, float_suffixes)


def write_result(
    family_id: str, path: Path, result, values: dict, write_image: Callable[[Path, ImageProduct], list[str]],
    float_suffixes=FLOAT_SUFFIXES, *, image=None,
) -> tuple[list[str], ImageProduct | None]:
    """Write one result to ``path`` and its companions with the front-end's ``write_image``;
    returns the notes for the user and the image written (None for a result that is not one).
    ``image``: a job's own image of the result (:meth:`JobOutput.write`)."""
    return JobOutput.of(family_id).write(path, result, values, write_image, float_suffixes, image=image)
