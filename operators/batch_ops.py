"""Process a sequence: any family over an image sequence, a folder or a numbered pattern (bpy).

One operator for the four families (``family``). The frames are read and the results written by
Blender on the main thread (bpy is not thread safe) while the model runs in the worker process,
through models/worker/remote_batch.py's RemoteBatchRun: the whole sequence is one runtime operation, each frame is written
all or nothing, a cancelled or failed batch keeps the frames already written. Nothing is created
in the .blend: the results are files.
"""

# No ``from __future__ import annotations``: Blender reads property annotations as objects.
import os
from dataclasses import replace
from pathlib import Path

import bpy
import numpy as np
from bpy.props import BoolProperty, EnumProperty, StringProperty

from ..models import families, file_formats, image_meta, products
from ..models.batch import frame_claims, frame_lists
from ..models.worker.remote_batch import RemoteBatchRun
from ..runtime.errors import LeanImageError
from . import image_io, options, prefs, results, shot_props, sources
from .jobs import BatchOperator, BatchTask, Job
from .model_job import model_worker


def _blender_can_write(path: Path) -> None:
    if not file_formats.BLENDER_WRITER.writes(path.suffix):
        raise LeanImageError(f"Cannot save '{path.name}': Blender writes {file_formats.BLENDER_WRITER.advice()} here.")


def sequence_refs(image, frames: range | None, exclude=None) -> list[frame_lists.FrameRef]:
    """The frames of an Image datablock. A SEQUENCE image's file name is numbered the way Blender
    reads sequences (the digits before the suffix): every file of that numbering, or ``frames``."""
    path = sources.absolute_path(image.filepath_raw or image.filepath)
    numbered = frame_lists.pattern_of(path)
    if image.source == "SEQUENCE" and numbered is not None:
        return frame_lists.resolve_input(numbered[0], frames, exclude)
    return frame_lists.resolve_input(path, frames, exclude)


def _kind(image) -> str:
    """"float", "16-bit" or "8-bit": Blender keeps 16-bit PNG/TIFF in float buffers too, so the
    file format tells float files apart."""
    if image.file_format in file_formats.BLENDER_FLOAT_FILES:
        return "float"
    return "16-bit" if image.is_float else "8-bit"


def _as_kind(rgba, kind: str):
    """Model values as the source's sample type, so results are written with the source's bits
    (models/products.py): 8-bit frames come back exactly as stored."""
    if kind == "float":
        return rgba
    top = 255.0 if kind == "8-bit" else 65535.0
    return (np.clip(rgba, 0.0, 1.0) * top + 0.5).astype(np.uint8 if kind == "8-bit" else np.uint16)


def input_kind(ref: frame_lists.FrameRef) -> str:
    """Main thread: the kind of the first frame's samples (the output type follows it)."""
    if not ref.path.is_file():
        return "8-bit"
    before = set(bpy.data.images)
    image = image_io.load_image_file(str(ref.path), check_existing=False)
    try:
        return _kind(image)
    finally:
        if image not in before:
            bpy.data.images.remove(image)


def read_frame(ref: frame_lists.FrameRef, warn=None):
    """Main thread: the frame's pixels as models take them, in the source's sample type, turned
    upright as its EXIF orientation says (as the command line reads it: Blender itself does not);
    the datablock is removed again. A multi-page TIFF gives its first page and a warning."""
    before = set(bpy.data.images)
    image = image_io.load_image_file(str(ref.path), check_existing=False)
    try:
        rgba, info = image_io.read_image(image)
        pixels = _as_kind(image_io.to_model_rgb(rgba, info.is_linear, premultiplied=info.premultiplied), _kind(image))
    finally:
        if image not in before:
            bpy.data.images.remove(image)
    if warn is not None and ref.path.suffix.lower() in (".tif", ".tiff") and (pages := image_meta.tiff_pages(ref.path)) > 1:
        warn(f"{ref.path.name} has {pages} pages; the first (the main image by TIFF convention) was used.")
    return image_meta.upright(pixels, image_meta.exif_orientation(ref.path))


def write_result(family_id: str, path: Path, result, values: dict) -> list[str]:
    return products.write_result(
        family_id, path, result, values, results.save_product, file_formats.BLENDER_WRITER.float_suffixes
    )[0]


FAILED_DETAILS = 20  # failed frames past the first three whose error gets a WARNING; all are numbered


def frame_numbers(numbers) -> str:
    """'4, 7, 9-12': consecutive frames as one range."""
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def report_failed_frames(operator, report) -> str:
    """The ERROR's account of the failed frames: the first three with their errors, every other
    one numbered and given its error in a WARNING of its own (each failure said once: a farm log
    reads one line per failure). An INFO report goes unseen."""
    first, rest = report.failed[:3], report.failed[3:]
    for number, error in rest[:FAILED_DETAILS]:
        operator.report({"WARNING"}, f"Frame {number} failed: {error}")
    text = "Failed: " + "; ".join(f"frame {n}: {error}" for n, error in first)
    if rest:
        text += f"; and {len(rest)} more (frames {frame_numbers(n for n, _ in rest)}: their errors are the warnings above)"
    return text


def _batch_properties() -> dict:
    fields = {}
    for family in families.ALL:
        fields.update(options.family_properties(family))
    return {**fields, **shot_props.shot_properties()}


@options.with_properties(_batch_properties())
class LEAN_IMAGE_AI_OT_process_sequence(BatchOperator, bpy.types.Operator):
    """Run a model over every frame of an image sequence, a folder or a numbered pattern"""

    bl_idname = "lean_image_ai.process_sequence"
    bl_label = "Process Sequence"
    bl_description = (
        "Run a model over every frame of an image sequence, a folder or a numbered pattern "
        "(shot_####.png), writing one file per frame; Esc cancels and keeps the frames written"
    )
    bl_options = {"REGISTER"}
    job_title = "Process Sequence"

    family: EnumProperty(name="Model Kind", items=[(f.id, f.action, f.produces) for f in families.ALL])
    image_name: StringProperty(name="Image", description="An Image datablock whose source is an image sequence")
    source: StringProperty(
        name="Frames From",
        description="A folder, a numbered pattern (shot_####.png) or one frame of a sequence (used when no Image is given)",
        subtype="FILE_PATH",
        options=options.path_options(),
    )
    frames: StringProperty(name="Frames", description="A-B or A-B:STEP. Empty: every frame")
    output: StringProperty(
        name="Save To",
        description="A folder or a pattern (out_####.exr). Empty: the folder <frames' folder>_<kind> "
        "beside the frames' folder (plates/ -> plates_depth/), each frame under its own number",
        subtype="FILE_PATH",
        options=options.path_options(),
    )
    model_id: StringProperty(name="Model", description="Catalog model id. Empty: the first installed model")
    model_path: StringProperty(name="Model File", description="An ONNX file instead of a catalog model", subtype="FILE_PATH",
                                options=options.path_options())
    overwrite: BoolProperty(name="Overwrite", description="Replace existing output files")
    skip_existing: BoolProperty(name="Skip Existing", description="Keep existing outputs and do only the rest")
    stop_on_error: BoolProperty(name="Stop on Error", description="Stop at the first frame that fails")
    shard: StringProperty(
        name="Shard",
        description="I/N: only part I of N contiguous parts of the frames (render farms: N tasks cover "
        "every frame once; with Skip Existing a retried task does only what is missing). Empty: every frame",
    )

    def prepare(self, context, job: Job):
        prefs.checked_model_id(self.model_id)  # before the plan makes an output folder
        family = families.get(self.family)
        job.name = f"{family.action} (sequence)"
        frames = frame_lists.parse_frames(self.frames) if self.frames.strip() else None
        shard = frame_lists.parse_shard(self.shard)
        shot = shot_props.settings_of(self, family.id, shard)  # a refused combination makes no folder
        output = sources.absolute_path(self.output) if self.output else None
        if output is not None and self.output.endswith(("/", "\\")):
            output = f"{output}{os.sep}"  # a folder still to be made keeps its trailing separator
        exclude = products.written_by(family.id, output)  # earlier results are never frames
        if self.image_name:
            image = bpy.data.images.get(self.image_name)
            if image is None:
                raise LeanImageError(f"There is no image called '{self.image_name}' in this file.")
            refs = sequence_refs(image, frames, exclude)
        elif self.source:
            refs = frame_lists.resolve_input(sources.absolute_path(self.source), frames, exclude)
        else:
            raise LeanImageError("Give the frames: an image sequence (image_name), or a folder or pattern (source).")
        kind = input_kind(refs[0]) if refs else "8-bit"
        refs, outputs, skip = products.plan_batch(
            family.id,
            refs,
            output,
            in_sequence=True,
            shard=shard,
            overwrite=self.overwrite,
            skip_existing=self.skip_existing,
            check_format=_blender_can_write,
            writer=file_formats.BLENDER_WRITER,
            suffix=products.default_suffix(family.id, kind),
        )
        frame_claims.remove_stale(outputs)  # a killed Skip Existing run's, whatever this run's mode
        if outputs:
            output_type = products.describe_output(family.id, outputs[0].suffix, kind, file_formats.BLENDER_WRITER.float_suffixes)
            job.name = f"{job.name}, {output_type}"
        family_job = prefs.family_job(context, self, family.id)  # a first-time hash runs on the worker
        values = family_job.values
        target = dict(zip(refs, outputs, strict=True))
        # Skip Existing: tasks sharing a folder (a requeued farm task beside the first) each compute a
        # missing frame once, as on the command line (models/batch/frame_claims.py)
        claims = frame_claims.FrameClaims()

        def make_pass(write, shot_kwargs, first_pass):  # a shot's first pass records, skips nothing
            pass_job = replace(family_job, extra=dict(shot_kwargs))
            run = RemoteBatchRun(
                pass_job,
                refs,
                lambda ref: read_frame(ref, None if first_pass else run.report.warnings.append),
                write,
                options=pass_job.options(progress=job.report, cancel=job.cancel_event),
                skip=(lambda ref: False) if first_pass else skip.__contains__,
                stop_on_error=self.stop_on_error,
                **(claims.batch_hooks(target) if self.skip_existing and not first_pass else {}),
                client=model_worker(),
                name=job.name,
            )
            return run

        write = shot_props.writer(shot, target, lambda ref, result: write_result(family.id, target[ref], result, values))
        batch = shot_props.batch(shot, make_pass, write, job.cancel_event)
        batch.claims = claims  # released in finish(), whatever the outcome
        job.inputs = batch
        job.key = str(outputs[0].parent) if outputs else f"(shard {self.shard}: no frames)"
        return BatchTask(job, batch)


    def finish(self, context, job: Job):
        job.inputs.claims.release_all()  # a cancelled or failed batch's frames are free for another task
        report = job.inputs.report
        if job.state == "failed" and job.error_text and not report.written:
            self.report({"ERROR"}, job.error_text)
            return {"CANCELLED"}
        for warning in dict.fromkeys(report.warnings):
            self.report({"WARNING"}, prefs.with_gpu_runtime_hint(warning))
        summary = f"{job.name}: {report.summary()} in {report.seconds:.1f} s; files in {job.key}"
        if getattr(job.inputs, "shot_line", ""):  # a shot's first pass: the range or camera it settled
            summary += f"; {job.inputs.shot_line}"
        cancelled = report.cancelled or job.state == "cancelled"
        missing = 0 if cancelled else report.total - len(report.written) - len(report.skipped)
        if report.failed or missing or job.state == "failed":  # never FINISHED with frames not written
            problem = report_failed_frames(self, report) if report.failed else job.error_text or (
                f"{missing} frame(s) were neither written nor reported failed (a bug: the console has more); run again"
            )
            job.state, job.error_text = "failed", f"{summary}. {problem}"
            self.report({"ERROR"}, job.error_text)
            return {"CANCELLED"}
        if cancelled:  # what the user asked for: a warning, saying what stays on disk
            job.state, job.error_text = "cancelled", f"Cancelled; {_kept(report, job.key)}. {summary}"
            self.report({"WARNING"}, job.error_text)
            return {"CANCELLED"}
        self.report({"INFO"}, summary)
        return {"FINISHED"}


def _kept(report, where: str) -> str:
    if not report.written:
        return "no frame was written"
    return f"kept the {len(report.written)} frame(s) written before it ({frame_numbers(report.written)}) in {where}"


classes = (LEAN_IMAGE_AI_OT_process_sequence,)
