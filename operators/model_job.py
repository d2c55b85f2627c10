"""What every model job in Blender shares (bpy): Blender's frame IO for the runner (frames read and
results saved by Blender), the model worker's batches, and the model operators' base: its
properties, the gather of its inputs on the main thread, the adapter call in the model worker
process (a one-frame models/worker/remote_batch.py batch whose read hands over the gathered
pixels), and the end of the job (apply, or undo what was gathered).

A model operator is ``@with_family_options(FAMILY)`` on a :class:`ModelJobOperator` subclass that
writes ``apply``; the family record (models/family.py) gives it its options and its adapter.
"""

# No ``from __future__ import annotations``: Blender reads the property annotations of
# `ModelOperatorProperties` as objects at registration time.
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bpy.props import BoolProperty, StringProperty

from ..models import colour, file_bytes, file_formats, result_images
from ..models.batch.frame_lists import FrameRef
from ..models.batch.runner import RunEvents, Runner
from ..models.family import Family
from ..models.job_spec import JobSpec
from ..models.model_run import ModelRun
from ..models.worker import client as worker_client
from ..models.worker import engine_python
from ..models.worker.remote_batch import RemoteBatchRun
from ..runtime.errors import LeanImageError
from . import gpu_ops, image_io, prefs, results, sources
from .job_operator import ModalJobOperator
from .jobs import BlenderJob, OneByOne, PumpedTask
from .options import path_options
from .sources import as_kind, frame_read, input_kind, read_frame


@dataclass
class JobInputs:
    """Everything the worker and ``apply`` need, read on the main thread."""

    source: object  # the source Image (main thread only); None when it was loaded and let go
    stem: str  # base of the result names
    info: image_io.ImageInfo
    rgba: np.ndarray  # the source pixels as Blender holds them
    model_rgba: np.ndarray  # straight, sRGB-encoded: what models take
    job: ModelRun  # the model, the option values, the device and the budgets (models/model_run.py)
    output: tuple[Path, str] | None  # (path, Blender file format)
    encoded: object = None  # the result image's packed file, written by the pump (ModelJobOperator.encode)
    saved: object = None  # the file at Save Result To, encoded by the pump (ModelJobOperator.save_file)
    model_input: object = None  # the steps that fill ``model_rgba`` (_model_input); None once done

    @property
    def options(self) -> dict:
        """The family's option values of this call."""
        return self.job.values


def model_worker() -> worker_client.WorkerClient:
    """The process's model worker (models/worker/client.py), started with the installed GPU
    runtime where there is one: the worker loads it, Blender's process never does."""
    try:
        folder = prefs.gpu_runtime_folder()
        gpu_runtime = str(folder) if folder.is_dir() else ""
    except Exception:  # no user folder to look in: then nothing is installed there either
        gpu_runtime = ""
    # the Worker Python preference, else LEAN_IMAGE_AI_WORKER_PYTHON: refused in one line before
    # the worker starts when it cannot run it (models/worker/engine_python.py)
    choice = engine_python.choose(getattr(prefs.get_prefs(), "worker_python", ""))
    if choice.source != "host":
        gpu_ops.check_worker_python(choice.path)
        gpu_runtime = ""  # the engine's wheels are built for Blender's Python; that Python has its own onnxruntime
    return worker_client.shared(gpu_runtime=gpu_runtime, python=choice.path)


def worker_batches(name: str):
    """The runner's ``batch_factory`` in Blender (models/batch/runner.py): every pass a
    RemoteBatchRun, so the model runs in the worker process, never on a thread of Blender's."""
    client = model_worker()

    def make(refs, infer, read, write, **keywords):
        return RemoteBatchRun(infer.__self__, refs, read, write, client=client, name=name, **keywords)

    return make


def _blender_can_write(path: Path) -> None:
    if not file_formats.BLENDER_WRITER.writes(path.suffix):
        raise LeanImageError(f"Cannot save '{path.name}': Blender writes {file_formats.BLENDER_WRITER.advice()} here.")


def _model_input(rgba: np.ndarray, info: image_io.ImageInfo) -> file_bytes.BandedArray:
    """The model's input from Blender's pixels (straight, sRGB-encoded; a byte image's stored values
    as uint8, so the family resizes them on uint8 as upstream does), converted by the job's pump a
    band at a time before the batch sends it: a float source's conversion took 0.15 s and more on
    Blender's main thread in one call."""

    def rows(start: int, stop: int) -> np.ndarray:
        band = colour.to_model_rgb(rgba[start:stop], info.is_linear, premultiplied=info.premultiplied)
        return band if info.is_float else as_kind(band, "8-bit")

    return file_bytes.BandedArray(rgba.shape, np.float32 if info.is_float else np.uint8, rows)


class FrameFile:
    """A frame's file (or Save Result To's) encoded by the pump a band at a time (Blender's writer
    took 0.4-0.5 s of the main thread in one call for a 3840x2160 PNG, issue #37 item 3) and
    written to disk as the bands come, through the add-on's atomic writer (models/files.py
    StagedFile): the last call flushes and renames it; a cancel before it (:meth:`discard`, or the
    step dropped) leaves no file."""

    def __init__(self, path: Path, made: file_bytes.BandedFile, product=None, notes: list | None = None):
        self.path, self.made = path, made
        self._writing = False
        # the product's clipped colours are counted in the bands: its notes are complete once they are all pulled
        self.product, self.notes = product, notes

    def pump(self, budget: float) -> bool:
        try:
            if not self._writing:
                self.made.write_to(self.path)
                self._writing = True
            if not self.made.pump(budget):
                return False
        except OSError as exc:
            self.made.discard()
            raise image_io.ImageSaveError(f"Could not save '{self.path}': {exc}") from exc
        if self.notes is not None:
            self.notes[:] = result_images.range_notes(self.path, self.product)
        return True

    def discard(self) -> None:
        self.made.discard()


class BlenderFrames:
    """Blender's frame IO for models/batch/runner.py (models/batch/frame_io.py's FrameIO): frames
    read and results saved by Blender, on the main thread. Given the ``gathered`` pixels of an
    image Blender has already read (the Image Editor's image, a texture node's, a frame read for
    Preview Frame), its one frame is those pixels. With ``staged``, a frame whose file the add-on
    writes (models/file_bytes/products.py) is left to the batch as a :class:`FrameFile` it pumps
    (:meth:`take_staged`) instead of being saved in the call."""

    writer = file_formats.BLENDER_WRITER

    def __init__(self, gathered=None, *, staged: bool = False):
        self.gathered = gathered
        self.staged = staged
        self._pending: list[FrameFile] = []
        self._kinds: dict = {}  # path -> input_kind: the runner asks twice at its start, and each answer is a decode

    def read(self, ref, warn=None):
        return self.gathered if self.gathered is not None else read_frame(ref, warn)

    def read_steps(self, ref, warn=None):
        """The frame's read as steps the batch pumps one a call (:func:`frame_read`); None: ``read`` it."""
        return None if self.gathered is not None else frame_read(ref, warn)

    def write_image(self, path: Path, product) -> list[str]:
        """The frame's notes; a staged file's are the list completed when the file is written
        (its clipped colours counted in the bands the encoder pulls)."""
        made = file_bytes.product_file(path, product) if self.staged else None
        if made is None:
            result_images.count_clipped(product, path.suffix)
            return results.save_product(path, product)
        notes = result_images.range_notes(path, product)
        self._pending.append(FrameFile(path, made, product, notes))
        return notes

    def stage(self, steps) -> None:
        """A family's own files of a frame (models/adapters/moge2_mesh.py GeometryFiles), pumped as a frame file."""
        self._pending.append(steps)

    def take_staged(self):
        """The frame files the last write left to be pumped (one step), or None."""
        pending, self._pending = self._pending, []
        return OneByOne.of_some(pending)

    def check_format(self, path: Path) -> None:
        _blender_can_write(path)

    def input_kind(self, ref) -> str:
        if ref.path not in self._kinds:
            self._kinds[ref.path] = input_kind(ref)
        return self._kinds[ref.path]


def one_frame_task(job: BlenderJob, model_run: ModelRun, ref: FrameRef, pixels, shape=lambda result: result,
                   stage=None) -> PumpedTask:
    """The task of one gathered image: a one-frame job (models/job_spec.py) the runner runs with
    its model in the worker process; the job's result is ``shape(result)``, a failure in the
    model the job's error; ``stage``: PumpedTask's steps after the model."""
    budgets = model_run.budgets
    spec = JobSpec(
        model_run.family_id, model_path=str(model_run.model.path), values=dict(model_run.values),
        device=model_run.device, ram_budget=budgets.ram_bytes, vram_budget=budgets.vram_bytes,
        source=str(ref.path), frame_list=[(ref.number, str(ref.path))], writes_files=False,
    )
    results = []
    events = RunEvents(progress=job.report, take=lambda ref, result: results.append(result))
    runner = Runner(spec, BlenderFrames(pixels), events=events, cancel=job.cancel_event, model_run=model_run,
                    batch_factory=worker_batches(job.name))

    def result():
        if runner.report.failed:
            raise LeanImageError(runner.report.failed[0][1])
        return shape(results[0]) if results else None

    return PumpedTask(job, runner, result, stage)


class ModelOperatorProperties:
    """Properties every model operator has; Blender reads the annotations of mixins too."""

    filepath: StringProperty(
        name="Image File",
        description="Image file to process. Empty: the Image Editor's image, else the active Image Texture node",
        subtype="FILE_PATH",
        options=path_options(),
        default="",
    )
    output_path: StringProperty(
        name="Save Result To",
        description=f"Also save the result image here ({file_formats.BLENDER_WRITER.advice()}), written all-or-nothing",
        subtype="FILE_PATH",
        options=path_options(),
        default="",
    )
    model_id: StringProperty(
        name="Model",
        description="Catalog model id. Empty: the first installed model of this kind",
        default="",
    )
    model_path: StringProperty(
        name="Model File",
        description="Path of an ONNX model file to use instead of a catalog model",
        subtype="FILE_PATH",
        options=path_options(),
        default="",
    )
    overwrite: BoolProperty(
        name="Overwrite",
        description="Replace an existing file at Save Result To",
        default=False,
    )


class ModelJobOperator(ModelOperatorProperties, ModalJobOperator):
    bl_options = {"REGISTER", "UNDO"}
    family: Family  # set by operators.options.with_family_options
    saves_family_result = True  # False: ``output_path`` holds another image (e.g. geometry's normal map)

    def option_values(self) -> dict:
        return {option.name: getattr(self, option.name) for option in self.family.options}

    def keeps_source(self) -> bool:
        """Whether a source loaded from ``filepath`` stays (the result refers to it)."""
        return False

    _source = None  # the source the first timer call loaded (read_first), for gather

    def read_first(self, context):
        """The source's decode (see the base's doc), when Blender has not read it: a ``filepath``
        file (loaded and decoded in that call: the load checks that Blender can read it), or the
        Image Editor's / texture node's image while not decoded (an image the Image Editor shows is)."""
        if self.filepath:
            return self._load_source if sources.absolute_path(self.filepath).is_file() else None
        image = sources.shown_image(context)
        if image is None or image.type != "IMAGE" or image.source == "SEQUENCE" or image.has_data:
            return None
        return lambda context, job: image_io.decode(image)

    def _load_source(self, context, job: BlenderJob) -> None:
        source = sources.resolve_source(context, self.filepath)
        if source.loaded:
            job.on_discard.append(sources.remove_image_later(source.image))
        self._source = source

    def gather(self, context, job: BlenderJob) -> JobInputs:
        """Read the source, the model and the preferences (see module doc). A source loaded from
        ``filepath`` is removed again at once unless :meth:`keeps_source` (then when the job fails)."""
        output = sources.output_target(
            self.output_path,
            family_id=self.family.id if self.saves_family_result else "",
            source_file=self.filepath, overwrite=self.overwrite
        )
        # side-effect-free checks first: loading a file adds a datablock that an error must remove
        source = None if self.filepath else sources.resolve_source(context, "")
        model_run = prefs.operator_model_run(context, self, self.family.id)  # a first-time hash is the worker's
        if source is None:
            source = self._source or sources.resolve_source(context, self.filepath)
        keep = self.keeps_source()
        if source.loaded and source is not self._source:  # else registered as it was loaded
            job.on_discard.append(sources.remove_image_later(source.image))
        rgba, info = image_io.read_image(source.image)
        model_input = _model_input(rgba, info)
        if source.loaded and not keep:
            job.discard()
        return JobInputs(
            source=source.image if (keep or not source.loaded) else None,
            stem=source.stem,
            info=info,
            rgba=rgba,
            model_rgba=model_input.out,
            job=model_run,
            output=output,
            model_input=model_input,
        )

    def prepare(self, context, job: BlenderJob):
        inputs = job.inputs = self.gather(context, job)
        # bound here: they run after the operator's call has returned
        shape, encode, save_file, finishing = self.shape, self.encode, self.save_file, self.finishing_steps
        ref = FrameRef(0, Path(inputs.info.name))  # the image's name: what a message about it says

        def stage(result):
            inputs.saved = save_file(inputs, result)
            inputs.encoded = encode(inputs, result)
            return finishing(inputs, result, job)

        task = one_frame_task(job, inputs.job, ref, inputs.model_rgba, lambda result: shape(inputs, result, job.report),
                              stage)
        task.before, inputs.model_input = inputs.model_input, None
        return task

    def shape(self, inputs: JobInputs, result, report):
        """The model's result as ``apply`` takes it (numpy only, no bpy); by default as it is."""
        return result

    def encode(self, inputs: JobInputs, result):
        """The packed file of the result image, as a models/file_bytes/ file the job's pump writes a
        band at a time before :meth:`apply` (which then makes the image from it: ``inputs.encoded``),
        so no call of Blender's main thread converts and compresses a whole result; None: ``apply``
        makes the result whole (a result saved to a file through Blender's writer, one not an image)."""
        return None

    def save_file(self, inputs: JobInputs, result):
        """The file at Save Result To as a results.OutputFile (file_bytes.product_file's formats) the
        job's pump encodes before :meth:`encode`'s and :meth:`apply` writes; None: ``apply`` saves it."""
        return None

    def finishing_steps(self, inputs: JobInputs, result, job: BlenderJob):
        """What the result still needs before :meth:`apply`, pumped by the job a step per timer call
        (operators/jobs.py PumpedTask's ``stage``): by default the result image's file of
        :meth:`encode` and the file of :meth:`save_file`. With Save Result To, the file saved there
        (:meth:`save_file`'s, else :meth:`encode`'s, which results.saved_image then reads) goes to
        disk as its bands come. It runs after the operator's call has returned: it must not read the
        operator."""
        encoded, saved = inputs.encoded, inputs.saved
        if saved is not None:
            job.on_discard.append(saved.made.discard)  # a cancel: its temporary file goes at once
            saved = FrameFile(saved.path, saved.made)
        elif encoded is not None and inputs.output is not None:
            job.on_discard.append(encoded.discard)
            encoded = FrameFile(inputs.output[0], encoded)
        return OneByOne.of_some([encoded, saved])

    def apply(self, context, inputs: JobInputs, result) -> str:
        """Create Blender data from the result; returns a one-line summary for the report.
        On failure it must remove what it created before raising (results.created_data)."""
        raise NotImplementedError

    def finish(self, context, job: BlenderJob):
        inputs = job.inputs
        if job.state in ("cancelled", "failed"):
            job.discard()
            if job.state == "cancelled":
                self.report({"WARNING"}, job.error_text or f"{job.name} cancelled; nothing was changed.")
            else:
                self.report({"ERROR"}, job.error_text)
            return {"CANCELLED"}
        try:
            summary = self.apply(context, inputs, job.result)
        except Exception as exc:
            if not isinstance(exc, LeanImageError | ReferenceError):
                traceback.print_exc()
            job.discard()
            if isinstance(exc, ReferenceError):  # Blender's word for a datablock removed meanwhile
                text = f"Image '{inputs.info.name}' was removed while the job ran; nothing was changed. Run it again."
            elif isinstance(exc, LeanImageError):
                text = str(exc)
            else:
                text = f"Unexpected error: {type(exc).__name__}: {exc}"
            job.state, job.error_text = "failed", text
            self.report({"ERROR"}, text)
            return {"CANCELLED"}
        job.on_discard.clear()  # applied: what was gathered now belongs to the result
        for warning in _all_warnings(job.result):
            self.report({"WARNING"}, prefs.with_gpu_runtime_hint(warning))
        self.report({"INFO"}, summary)
        return {"FINISHED"}


def _all_warnings(result) -> list[str]:
    if isinstance(result, list):
        return [w for r in result for w in getattr(r, "warnings", None) or []]
    return list(getattr(result, "warnings", None) or [])
