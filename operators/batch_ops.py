"""Process a sequence: any family over an image sequence, a folder or a numbered pattern (bpy).

One operator for the four families (``family``). It builds the job (models/job_spec.py) and hands
it to the one runner (models/batch/runner.py) with Blender's frame IO: the frames are read by Blender
on the main thread (bpy is not thread safe) while the model runs in the worker process
(models/worker/); a result that is an 8- or 16-bit PNG, an 8- or 16-bit TIFF or a float EXR is
encoded by the add-on a band per timer call, with the samples Blender's writer would store, and
written by its atomic writer (operators/model_job.py FrameFile); JPEG (the one other format written
here) and a family's own files (MoGe-2's mesh, camera, normal map) keep Blender's writer. The
whole sequence is one runtime operation, each frame is written all or nothing, a cancelled or
failed batch keeps the frames already written. Nothing is created in the .blend: the results are
files.
"""

# No ``from __future__ import annotations``: Blender reads property annotations as objects.
import os

import bpy
from bpy.props import BoolProperty, EnumProperty, StringProperty

from ..models import families
from ..models.batch import frame_lists
from ..models.batch.runner import RunEvents, Runner
from ..models.job_spec import JobSpec
from ..runtime.errors import LeanImageError
from . import options, prefs, sources
from .job_operator import BatchOperator
from .jobs import BlenderJob, PumpedTask
from .model_job import BlenderFrames, worker_batches


def sequence_source(image):
    """Where an Image datablock's frames are. A SEQUENCE image's file name is numbered the way
    Blender reads sequences (the digits before the suffix): every file of that numbering."""
    path = sources.absolute_path(image.filepath_raw or image.filepath)
    numbered = frame_lists.pattern_of(path)
    if image.source == "SEQUENCE" and numbered is not None:
        return numbered[0]
    return path


def job_spec(context, owner, family_id: str, **fields) -> JobSpec:
    """The job (models/job_spec.py) an operator's properties and the preferences describe: its
    Model (a catalog id, never a path: files go in Model File) or Model File, its option values,
    the shot options, the preferences' device and budgets (applied to the runtime) and folder."""
    model_id = prefs.checked_model_id(getattr(owner, "model_id", ""))
    device, budgets = prefs.configure_runtime(context)
    family = families.get(family_id)
    model_path = getattr(owner, "model_path", "")
    return JobSpec(
        family.id, model=model_id, model_path=str(sources.absolute_path(model_path)) if model_path else "",
        models_dir=str(prefs.models_folder(context)), values={o.name: getattr(owner, o.name) for o in family.options},
        device=device, ram_budget=budgets.ram_bytes, vram_budget=budgets.vram_bytes, shot=options.shot_options_of(owner),
        **fields,
    )


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
    return {**fields, **options.shot_properties()}


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

    def prepare(self, context, job: BlenderJob):
        prefs.checked_model_id(self.model_id)  # before the plan makes an output folder
        family = families.get(self.family)
        job.name = f"{family.action} (sequence)"
        frames = frame_lists.parse_frames(self.frames) if self.frames.strip() else None
        output = sources.absolute_path(self.output) if self.output else None
        if output is not None and self.output.endswith(("/", "\\")):
            output = f"{output}{os.sep}"  # a folder still to be made keeps its trailing separator
        spec = job_spec(
            context, self, family.id, source=self._source(), output=None if output is None else str(output),
            in_sequence=True, overwrite=self.overwrite, skip_existing=self.skip_existing,
            shard=frame_lists.parse_shard(self.shard), stop_on_error=self.stop_on_error,
        ).with_frames(frames)
        # a first-time hash runs on the worker; Skip Existing claims frames as the command line does
        runner = Runner(spec, BlenderFrames(staged=True), events=RunEvents(progress=job.report), cancel=job.cancel_event,
                        batch_factory=worker_batches(job.name))
        output_type = runner.output_type()
        if output_type:
            job.name = f"{job.name}, {output_type}"
        job.inputs = runner
        job.key = str(runner.outputs[0].parent) if runner.outputs else f"(shard {self.shard}: no frames)"
        return PumpedTask(job, runner)

    def _source(self) -> str:
        """The frames: an Image datablock's files (a SEQUENCE image by its numbering), or Frames From."""
        if self.image_name:
            image = bpy.data.images.get(self.image_name)
            if image is None:
                raise LeanImageError(f"There is no image called '{self.image_name}' in this file.")
            return str(sequence_source(image))
        if self.source:
            return str(sources.absolute_path(self.source))
        raise LeanImageError("Give the frames: an image sequence (image_name), or a folder or pattern (source).")

    def finish(self, context, job: BlenderJob):
        job.inputs.close()  # a cancelled or failed batch's frames are free for another task
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
