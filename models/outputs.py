"""One job's output as one object: its names, its checks, its frame claims, the atomic write and
what it wrote (bpy-free); and the policy it applies, which a panel or an operator asks without a job.

A :class:`JobOutput` is made once per job (the runner, models/batch/runner.py, holds one) from the
family's :class:`~.family.Output` record (what its product is: its tag, default formats, companion
files, an image or a writer of its own) and a front-end's :class:`~.file_formats.Writer` (which
format rows it writes, where it keeps float). Its stateless part, :class:`OutputPolicy`, is what
the panels and operators ask before or without a job (a file's check, a result's image). Nothing
here asks which family it is: a family differs only by its record, so adding a family's output is
its record in its own module, and adding a format is a row of models/file_formats.py.

The policy, the same for Blender and the command line, single images and sequences; what a
family's result becomes (its tag, default format, the formats it accepts, companion files, an
image or a writer of its own) is the family's :class:`~.family.Output` record in its own module,
what a format keeps is models/file_formats.py. Two kinds of image result:

- :class:`~.result_images.ColourImage` (a cut-out, an upscale): written like its source (alpha kept where the
  format has it);
- :class:`~.result_images.ValueImage` (depth): float where the file keeps float (EXR, a one-channel TIFF from the
  command line), else normalised to 0..1 with the range it was mapped from returned with the image
  so the writer can record it (report, and the file's metadata where the format has it).

Output type, when the user named no file format (:meth:`OutputPolicy.default_suffix`): it follows the input. A
float input (EXR, HDR, float TIFF) gives a float EXR (with alpha for a cut-out; the TIFF writers
here and in Blender keep float in one grey channel only, so EXR is the float file that holds
colour and alpha everywhere); an 8- or 16-bit input gives PNG. Bits follow the input frame by
frame (models/result_images.py): 16-bit and float sources give 16-bit PNG/TIFF where the writer can,
and a note says where bits were dropped.

Where results go when no OUTPUT is given: one image gives ``<stem>_<kind>.<ext>`` beside it; a
folder or a pattern gives the folder ``<input folder>_<kind>`` beside the input folder
(:meth:`OutputPolicy.default_folder`), each frame named ``<name>_<kind>_<number>.<ext>`` with its own number, so
results never land among the inputs and a re-run finds them where it left them. Listing the
inputs leaves out any file this command would write (:meth:`OutputPolicy.written_by`), so an OUTPUT that is the
input folder still never feeds earlier results back in as frames.

The front-end encodes the images (Blender with its own writers, the command line with Pillow and
OpenEXR), each of them through models/files.py's atomic writer; a family's ``write`` writes its
non-image files through the rows of models/file_formats.py.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

from ..runtime.errors import LeanImageError, user_path
from . import file_formats, files
from .batch import frame_claims, frame_lists
from .batch.frame_lists import output_paths, shard_slice
from .family import Output
from .result_images import ColourImage, ImageProduct

# image(result, suffix, float_suffixes) -> (product, notes): the image a job writes instead of the
# family's own (a shot's depth, with one range for every frame: models/batch/shot_batch.py)
ImageOverride = Callable[[object, str, frozenset], tuple[ImageProduct, list[str]]]


def output_path(path: Path) -> Path:
    """An output's absolute path: its folder resolved, its own name never (a symbolic link at
    the name is the entry a result replaces, not a way to somewhere else)."""
    path = Path(path)
    return path.parent.resolve() / path.name


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


class OutputPolicy:
    """What a family's result becomes as files for one front-end's writer, with no job behind it:
    default names and formats, the checks of a file, the image a result is written as. What a
    panel or an operator asks before (or without) a job; :class:`JobOutput` is one job's."""

    def __init__(self, record: Output, title: str = "", writer: file_formats.Writer = file_formats.COMMAND_LINE):
        self.record = record
        self.title = title
        self.writer = writer

    @classmethod
    def of(cls, family_id: str, writer: file_formats.Writer = file_formats.COMMAND_LINE):
        """The policy (or, called on :class:`JobOutput`, one job's output) of the family registered
        as ``family_id``."""
        from . import families  # the families' modules are imported by families.py, after this one

        family = families.get(family_id)
        if family.output is None:
            raise LeanImageError(f"The {family.title} family declares no output files; it cannot write results.")
        return cls(family.output, family.title, writer)

    # ---- names ----------------------------------------------------------------------------------

    def default_suffix(self, input_kind: str = "8-bit") -> str:
        """The output format when the user named none: it follows the input (models/outputs.py)."""
        return self.record.default_suffix(input_kind)

    def describe(self, suffix: str, input_kind: str, float_suffixes=None) -> str:
        """How the report names what is written, e.g. "float EXR (follows the float input)"."""
        floats = self.writer.float_suffixes if float_suffixes is None else float_suffixes
        return self.record.description or self.record.image.describe(suffix, input_kind, floats)

    def default_name(self, stem: str, number: int | None = None, suffix: str | None = None) -> str:
        tag, suffix = self.record.tag, suffix or self.record.suffix
        return f"{stem}_{tag}{suffix}" if number is None else f"{stem}_{tag}_{number:04d}{suffix}"

    def default_name_for(self, path: Path, number: int, *, in_sequence: bool, suffix: str | None = None) -> str:
        """The default output name for one input file: ``<stem>_<kind>.<ext>``, or for a frame of a
        sequence ``<name>_<kind>_####.<ext>`` with the frame digits moved to the end."""
        if not in_sequence:
            return self.default_name(path.stem, suffix=suffix)
        match = re.match(r"^(.*?)\d+$", path.stem)
        stem = match.group(1).rstrip("_.-") if match else path.stem
        return self.default_name(stem or "frame", number, suffix)

    def default_folder(self, input_folder: Path) -> Path:
        """Where a folder's or a pattern's results go when no OUTPUT is given: ``<folder>_<kind>``
        beside the input folder (``plates/`` -> ``plates_depth/``)."""
        return input_folder.parent / f"{input_folder.name or 'frames'}_{self.record.tag}"

    def companion_paths(self, path: Path) -> list[Path]:
        """Every file one result writes, the main one first (checked up front like the main one)."""
        return self.record.companion_paths(path)

    def written_by(self, output: str | os.PathLike | None) -> Callable[[Path], bool]:
        """Whether a file met while listing the inputs is one this job writes for ``output`` (a
        pattern's frames, a folder's default names and their companions, or the one file named):
        such files are left out of the listing, so earlier results are never taken for frames."""
        if output is None:  # the default folder is beside the inputs, never among them
            return lambda path: False
        text = str(output)
        target = user_path(text).resolve()
        if frame_lists.is_pattern(text):
            patterns = self.companion_paths(target)

            def in_pattern(path: Path) -> bool:
                return path.resolve().parent == target.parent and any(
                    frame_lists.frame_number(pattern, path.name) is not None for pattern in patterns
                )

            return in_pattern
        stem = rf".+_{re.escape(self.record.tag)}_\d+"
        companions = [re.escape(t).replace(re.escape("{stem}"), stem) for t in self.record.companions]
        names = re.compile("^(?:" + "|".join([stem + r"\.[^.]+", *companions]) + ")$")
        folder_given = target.is_dir() or text.endswith(("/", "\\")) or not target.suffix

        def written(path: Path) -> bool:
            path = path.resolve()
            if folder_given:
                return path.parent == target and names.match(path.name) is not None
            return path == target

        return written

    # ---- checks and images ----------------------------------------------------------------------

    def check(self, path: Path) -> None:
        """Refuse, before any model runs, a file that could not hold the family's result."""
        record, suffix = self.record, path.suffix.lower()
        if record.formats and suffix not in record.formats:
            raise LeanImageError(f"Cannot write {record.what} to '{path.name}': give {record.formats_hint}.")
        row = file_formats.find(suffix)
        if record.needs_alpha and row is not None and not row.alpha:
            raise LeanImageError(
                f"Cannot write {record.what} to '{path.name}': {suffix} has no alpha channel, and "
                f"{record.what} needs it. Use {self.writer.advice(alpha=True)}."
            )

    def image(self, result, suffix: str, float_suffixes=None, *, count_clipped: bool = True) -> ImageProduct:
        """The image a result is written as, for a file with ``suffix``; ``count_clipped`` False:
        its colours above 1 are left for a banded writer to count (ImageProduct.clip_uncounted)."""
        if self.record.image is None:
            raise ValueError(f"{self.title or self.record.what} results are not one image")
        floats = self.writer.float_suffixes if float_suffixes is None else float_suffixes
        if count_clipped or not isinstance(self.record.image, ColourImage):  # a plug-in's image counts its own
            return self.record.image.product(result, suffix, floats)
        return self.record.image.product(result, suffix, floats, count_clipped=False)

    def preview(self, result, float_suffixes=None) -> ImageProduct:
        """The image shown for a result: the family's preview of a result that is not one image,
        else the image a PNG of it would hold."""
        if self.record.preview is not None:
            return self.record.preview(result)
        return self.image(result, ".png", float_suffixes)


class JobOutput(OutputPolicy):
    """What one job writes, with its family's policy: plan it (:meth:`plan`), claim its frames
    (:attr:`claims`), write each result (:meth:`write`); :attr:`targets` and :attr:`skip` are the
    plan, :attr:`written` every file written so far, companions too. The runner holds one."""

    def __init__(self, record: Output, title: str = "", writer: file_formats.Writer = file_formats.COMMAND_LINE):
        super().__init__(record, title, writer)
        self.written: list[Path] = []
        self.targets: dict = {}  # frame ref -> its output file, once planned
        self.skip: set = set()  # the planned frames whose output is kept (skip-existing)
        self._claims: frame_claims.FrameClaims | None = None
        self._lock = threading.Lock()  # a worker thread and the caller's may both write

    # ---- the plan -------------------------------------------------------------------------------

    def plan_files(
        self, inputs: list[Path], outputs: list[Path], *, overwrite: bool, skip_existing: bool,
        check_format: Callable[[Path], None],
    ) -> set[int]:
        """Check every output before any model runs, then make the output folders not there yet;
        returns the indices to skip (existing outputs kept with ``skip_existing``). LeanImageError
        saying what is wrong and what to do."""
        skip = set()
        to_make: set[Path] = set()
        sources = {os.path.normcase(str(p.resolve())) for p in inputs}
        for index, out in enumerate(outputs):
            self.check(out)
            # any entry at the name is an output there, a symbolic link too (dangling or not): a link
            # planted in a shared folder must not send the result elsewhere
            kept = os.path.lexists(out) and not overwrite
            for path in self.companion_paths(out):
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

    def plan(
        self, refs: list, output: str | os.PathLike | None, *, in_sequence: bool, shard: tuple[int, int] | None,
        overwrite: bool, skip_existing: bool, check_format: Callable[[Path], None], inputs_are_files: bool = True,
        suffix: str | None = None,
    ) -> tuple[list, list[Path], set]:
        """(this task's frames, their output files, the frames to skip): output names from the whole
        frame list (so N shards write what one run would), then this shard's part, then every check
        of :meth:`plan_files`, all before any model runs. ``suffix``: the default names' format
        (:meth:`default_suffix`); no ``output`` for a sequence: :meth:`default_folder`. Kept as
        :attr:`targets` and :attr:`skip`."""
        def default(ref):
            return self.default_name_for(ref.path, ref.number, in_sequence=in_sequence, suffix=suffix)

        if output is None and in_sequence and refs and inputs_are_files:
            output = f"{self.default_folder(refs[0].path.parent)}{os.sep}"
        outputs = [output_path(p) for p in output_paths(refs, output, default)]
        _refuse_shared_names(refs, outputs)
        inputs = [r.path for r in refs] if inputs_are_files else []
        part = shard_slice(len(refs), shard)
        refs, outputs = refs[part], outputs[part]
        skipped = self.plan_files(
            inputs, outputs, overwrite=overwrite, skip_existing=skip_existing, check_format=check_format
        )
        self.targets = dict(zip(refs, outputs, strict=True))
        self.skip = {refs[i] for i in skipped}
        return refs, outputs, self.skip

    def adopt(self, refs: list, outputs: list[Path]) -> None:
        """A plan made elsewhere, checked there (a farm chunk: its driver planned the whole shot)."""
        self.targets = dict(zip(refs, outputs, strict=True))
        self.skip = set()

    def keep_only(self, refs: list) -> None:
        """Only ``refs`` of the plan are this job's (a preview's one frame: its output is written anyway)."""
        self.targets = {ref: self.targets[ref] for ref in refs}
        self.skip = set()

    def tidy(self, *, temps_older_than: float | None = None) -> tuple[list[Path], list[Path]]:
        """What a killed earlier run left at the planned outputs, removed and returned for the
        report: (its temporary files, given ``temps_older_than``, a time before this run began;
        its frame claims, whatever this run's mode: a claim held now stays)."""
        outputs = list(self.targets.values())
        temps = []
        if temps_older_than is not None:
            companions = [p for out in outputs for p in self.companion_paths(out)]
            temps = files.remove_stale_temps(companions, older_than=temps_older_than)
        return temps, frame_claims.remove_stale(outputs)

    # ---- claims ---------------------------------------------------------------------------------

    @property
    def claims(self) -> frame_claims.FrameClaims:
        """The planned frames' claims: tasks sharing a folder each compute a missing frame once."""
        if self._claims is None:
            self._claims = frame_claims.FrameClaims()
        return self._claims

    def claim_hooks(self, skip_existing: bool) -> dict:
        """A BatchRun's claim hooks (models/batch/sequence.py) when frames are claimed: with skip-existing."""
        return self.claims.batch_hooks(self.targets) if skip_existing else {}

    # ---- the write ------------------------------------------------------------------------------

    def write(
        self, path: Path, result, values: dict, write_image: Callable[[Path, ImageProduct], list[str]],
        float_suffixes=None, *, image: ImageOverride | None = None, stage: Callable | None = None,
        count_clipped: bool = True,
    ) -> tuple[list[str], ImageProduct | None]:
        """Write one result to ``path`` and its companions with the front-end's ``write_image``
        (each file all or nothing); returns the notes for the user and the image written (None for
        a result that is not one). ``image``: the image to write instead of the family's own.
        ``stage(steps)``: a front-end that pumps a frame's files over later calls takes the steps
        of a family's own writer that makes them so (the family record's ``stage``). ``count_clipped``
        False: a ``write_image`` that counts a colour image's clipped pixels a band at a time gets it
        uncounted, and the notes it returns are the list it completes once the file is written."""
        floats = self.writer.float_suffixes if float_suffixes is None else float_suffixes
        if image is not None:
            product, notes = image(result, path.suffix, floats)
            notes = notes + (write_image(path, product) or [])
        elif self.record.write is not None and self.record.stage is not None and stage is not None:
            steps = self.record.stage(path, result, values)
            stage(steps)
            with self._lock:
                self.written.extend(steps.paths)  # once pumped: a cancel before that leaves none of them
            return [], None
        elif self.record.write is not None:
            product, notes = None, self.record.write(path, result, values, write_image)
        else:
            product = self.image(result, path.suffix, floats, count_clipped=count_clipped)
            notes = write_image(path, product)
            notes = [] if notes is None else notes  # the writer's own list: a staged one completes it later
        self._wrote(path if product is not None else None, path)
        return notes, product

    def _wrote(self, image_path: Path | None, path: Path) -> None:
        """Record the files one write left: the image, or every companion the family's writer made."""
        made = [image_path] if image_path is not None else [p for p in self.companion_paths(path) if p.is_file()]
        with self._lock:
            self.written.extend(made)


def _refuse_shared_names(refs: list, outputs: list[Path]) -> None:
    claimed: dict[str, object] = {}
    for ref, out in zip(refs, outputs, strict=True):
        earlier = claimed.setdefault(os.path.normcase(str(out)), ref)
        if earlier is not ref:
            raise LeanImageError(
                f"Frames {earlier.number} ({earlier.path.name}) and {ref.number} ({ref.path.name}) would both "
                f"be written to {out}; give a pattern with the frame number (out_####.png) or rename one input."
            )
