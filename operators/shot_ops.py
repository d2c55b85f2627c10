"""A MoGe-2 shot as one camera and a mesh per frame, and Preview Frame (bpy).

Reconstruct Shot: the frames' meshes share ONE camera (models/adapters/shot_camera.py: a first pass fits
one focal, or the given field of view; every frame's shift is solved for it). Each frame is its
own mesh object whose visibility is keyed to its frame, rather than a mesh sequence: MoGe's
topology changes from frame to frame (the mask and the depth-edge cut differ), which shape keys
cannot hold, and Blender's mesh sequence (Mesh Sequence Cache) reads only Alembic/USD files that
would have to be written and kept beside the .blend; per-frame objects work with any topology,
keep each frame's texture, and live in the .blend. The job's pump makes a frame's object a step per
timer call (its arrays, its Blender mesh a part per call, then its texture, material, object and
keys; the frames after it wait), so no call of Blender's main thread makes a frame whole (issue #37
item 3).

Preview Frame: the Process Sequence settings on one frame (the scene's current frame by
default), shown in an Image Editor, nothing written to disk.
"""

# No ``from __future__ import annotations``: Blender reads property annotations as objects.
from functools import partial
from types import SimpleNamespace

import bpy
import numpy as np
from bpy.props import EnumProperty, IntProperty, StringProperty

from ..models import families, file_formats
from ..models.adapters import moge2
from ..models.adapters.moge2_mesh import mesh_arrays
from ..models.batch import frame_lists
from ..models.batch.runner import RunEvents, Runner
from ..models.outputs import OutputPolicy
from ..models.result_images import ImageProduct
from ..runtime.errors import LeanImageError
from . import batch_ops, geometry_ops, image_io, options, prefs, results, sources
from .job_operator import BatchOperator, ModalJobOperator
from .jobs import BlenderJob, OneByOne, PumpedTask
from .model_job import BlenderFrames, one_frame_task, worker_batches

PREVIEW_IMAGE = "Lean Image AI Preview"


def _source(owner):
    """Where the frames are: an Image datablock's files, or Frames From."""
    if owner.image_name:
        image = bpy.data.images.get(owner.image_name)
        if image is None:
            raise LeanImageError(f"There is no image called '{owner.image_name}' in this file.")
        return batch_ops.sequence_source(image)
    if owner.source:
        return sources.absolute_path(owner.source)
    raise LeanImageError("Give the frames: an image sequence (image_name), or a folder or pattern (source).")


def _frames(owner, frames: range | None) -> list:
    return frame_lists.resolve_input(_source(owner), frames)


def _source_properties() -> dict:
    return {
        "image_name": StringProperty(name="Image", description="An Image datablock whose source is an image sequence"),
        "source": StringProperty(name="Frames From", description="A folder or a numbered pattern (shot_####.png)", subtype="FILE_PATH",
                                 options=options.path_options()),
        "model_id": StringProperty(name="Model", description="Catalog model id. Empty: the first installed model"),
        "model_path": StringProperty(name="Model File", description="An ONNX file instead of a catalog model", subtype="FILE_PATH",
                                     options=options.path_options()),
    }


def key_visible_on(obj, number: int, previous: int | None, following: int | None) -> None:
    """``obj`` shows (viewport and render) on frame ``number`` only: hidden on the neighbouring
    frames of the shot, keys held constant between."""
    for frame, hidden in ((previous, True), (number, False), (following, True)):
        if frame is None:
            continue
        obj.hide_viewport = obj.hide_render = hidden
        obj.keyframe_insert("hide_viewport", frame=frame)
        obj.keyframe_insert("hide_render", frame=frame)


def _frame_texture(path, created):
    """The frame's image for its material; recorded in ``created`` only when this load made it (an
    image already in the file, the user's, is reused and never removed)."""
    known = {image.as_pointer() for image in bpy.data.images}
    texture = image_io.load_image_file(str(path), check_existing=True)
    if texture.as_pointer() in known:
        return texture
    return created.add(bpy.data.images, sources.store_relative(texture))


def _frame_steps(ref, geometry, made, discontinuity: float, neighbours: tuple, report) -> OneByOne:
    """A frame's mesh object, a step per timer call (issue #37 item 3: made in one call, a 1920x1080
    frame held Blender's main thread 0.1-0.2 s of CPU): its arrays, its Blender mesh a part per call
    (geometry_ops.MeshSteps), then its texture, material and object, keyed visible on its frame. What it
    makes goes in ``made.created`` from the first step: Esc, a cancel or a failure before the frame's
    last step leaves a half-made mesh that the shot's finish removes with the rest."""
    name, created, frame = f"{ref.path.stem}_geometry", results.Created(), SimpleNamespace(arrays=None, mesh=None)
    made.created.append(created)

    def faces():
        frame.arrays = mesh_arrays(geometry.points, geometry.mask, discontinuity=discontinuity)
        if len(frame.arrays.vertices) == 0:
            raise LeanImageError(f"MoGe-2 found no geometry in frame {ref.number}; it has no mesh.")

    def blender_mesh():
        arrays, frame.arrays = frame.arrays, None
        frame.mesh = geometry_ops.MeshSteps(name, arrays.vertices, arrays.quads, arrays.uv)
        created.add_removal(frame.mesh.remove)
        return frame.mesh

    def keyed_object():
        texture = _frame_texture(ref.path, created)
        mesh = frame.mesh.mesh
        mesh.materials.append(created.add(bpy.data.materials, geometry_ops.make_material(name, texture)))
        obj = created.add(bpy.data.objects, bpy.data.objects.new(name, mesh))
        try:
            key_visible_on(obj, ref.number, *neighbours)
        finally:  # the action the keys made, even when a later key failed
            if obj.animation_data is not None and obj.animation_data.action is not None:
                created.add(bpy.data.actions, obj.animation_data.action)
        made.objects.append(obj)
        depth = geometry.depth[geometry.mask]
        made.near, made.far = min(made.near, float(depth.min())), max(made.far, float(depth.max()))
        made.fov_x, made.size = geometry.fov_x, geometry.mask.shape

    return OneByOne([(f"frame {ref.number}: finding the mesh's faces", faces),
                     (f"frame {ref.number}: building the mesh", blender_mesh),
                     (f"frame {ref.number}: its texture, material and keyed object", keyed_object)], report)


def _remove_made(made) -> None:
    """What the shot made so far (objects, actions, materials, meshes, textures), half-made frames too."""
    for created in reversed(made.created):
        created.remove_all()
    made.created.clear()
    made.objects.clear()


@options.with_properties({**options.family_properties(moge2.FAMILY), **_source_properties(), **options.shot_properties()})
class LEAN_IMAGE_AI_OT_reconstruct_shot(BatchOperator, bpy.types.Operator):
    """Reconstruct every frame of a shot with MoGe-2 under one camera"""

    bl_idname = "lean_image_ai.reconstruct_shot"
    bl_label = "Reconstruct Shot"
    bl_description = (
        "A mesh per frame of an image sequence (each shown on its own frame) and ONE camera for the "
        "shot: one focal fitted for the whole shot, or the field of view given"
    )
    bl_options = {"REGISTER", "UNDO"}
    job_title = "Reconstruct Shot"

    frames: StringProperty(name="Frames", description="A-B or A-B:STEP. Empty: every frame")

    def prepare(self, context, job: BlenderJob):
        frames = frame_lists.parse_frames(self.frames) if self.frames.strip() else None
        spec = batch_ops.job_spec(context, self, moge2.FAMILY.id, source=str(_source(self)), writes_files=False)
        events = RunEvents(progress=job.report)  # each result becomes a mesh (add_frame, below), never a file
        frames_io = BlenderFrames(staged=True)  # a frame's mesh: steps the batch pumps, later frames waiting
        runner = Runner(spec.with_frames(frames), frames_io, events=events, cancel=job.cancel_event,
                        batch_factory=worker_batches(self.job_title))
        refs, values = runner.refs, runner.model_run.values
        numbers = [r.number for r in refs]
        following = dict(zip(numbers, numbers[1:] + [None], strict=True))
        previous = dict(zip(numbers, [None] + numbers[:-1], strict=True))
        made = SimpleNamespace(
            objects=[], created=[], near=np.inf, far=0.0, fov_x=None, size=None, stem=refs[0].path.stem if refs else "shot"
        )
        job.on_discard.append(partial(_remove_made, made))  # Blender's own cancel (a file load): as finish's
        discontinuity = values["discontinuity"]

        def add_frame(ref, geometry):
            frames_io.stage(_frame_steps(ref, geometry, made, discontinuity, (previous[ref.number], following[ref.number]),
                                         lambda stage: job.report(job.progress, stage)))
            return []

        events.take = add_frame
        job.inputs = runner
        runner.made = made
        job.key = str(refs[0].path.parent) if refs else ""
        return PumpedTask(job, runner)


    def finish(self, context, job: BlenderJob):
        report, made = job.inputs.report, job.inputs.made
        for warning in dict.fromkeys(report.warnings):
            self.report({"WARNING"}, prefs.with_gpu_runtime_hint(warning))
        cancelled = report.cancelled or job.state == "cancelled"
        whole = len(report.written) == report.total and not report.failed and job.state != "failed"
        if cancelled or not whole or not made.objects:  # all or nothing: the frames made so far go
            _remove_made(made)
            return self._nothing_added(job, report, cancelled)
        made.created.clear()  # the shot's now: the job's discard must leave it
        scene = context.scene
        collection = getattr(context, "collection", None) or scene.collection
        for obj in made.objects:
            collection.objects.link(obj)
        stand_in = SimpleNamespace(fov_x=made.fov_x, depth=np.array([made.near, made.far]), mask=np.array([True, True]))
        with results.created_data() as created:
            camera = geometry_ops.make_camera(f"{made.stem}_shot_camera", stand_in, created)
            collection.objects.link(camera)
        scene.camera = camera
        scene.render.resolution_y, scene.render.resolution_x = made.size
        scene.frame_start, scene.frame_end = min(report.written), max(report.written)
        line = getattr(job.inputs, "shot_line", "")
        self.report({"INFO"}, f"{len(made.objects)} frame mesh(es) and one camera '{camera.name}' "
                    f"({np.degrees(made.fov_x):.2f} deg){'; ' + line if line else ''}; {report.summary()}")
        return {"FINISHED"}

    def _nothing_added(self, job: BlenderJob, report, cancelled: bool) -> set:
        """The outcome of a shot that left the scene as it was: a WARNING when cancelled, else an
        ERROR that numbers every failed frame (each also in a WARNING with its error)."""
        if cancelled:
            job.state, job.error_text = "cancelled", job.error_text or f"{self.job_title} was cancelled; nothing was changed."
            self.report({"WARNING"}, job.error_text)
            return {"CANCELLED"}
        if report.failed:
            problem = f"{batch_ops.report_failed_frames(self, report)}. Fix those frames or leave them out (Frames), then run again"
        elif job.state == "failed" and job.error_text:
            problem = job.error_text
        else:
            problem = f"{report.summary()} (a bug: the console has more)"
        job.state = "failed"
        job.error_text = (
            f"{self.job_title} added nothing, as a shot is made whole or not at all. {problem.rstrip('.')}."
        )
        self.report({"ERROR"}, job.error_text)
        return {"CANCELLED"}


def preview_product(family_id: str, result, shot) -> ImageProduct:
    """What the preview shows: the image the sequence would write for this frame (depth with
    the shot settings; a shot range needs the whole shot, so auto-shot shows this frame's own
    robust range), or what the family's output shows of a result that is not one image (MoGe-2: its
    normal map)."""
    output = OutputPolicy.of(family_id, file_formats.BLENDER_WRITER)
    if output.record.preview is not None:
        return output.record.preview(result)
    if shot.depth is not None:
        if shot.depth.needs_first_pass:
            shot.record(None, result)
            shot.finish_first_pass()
        return shot.depth_product(result.depth, ".png", file_formats.BLENDER_WRITER.float_suffixes)[0]
    return output.image(result, ".png")


def show_in_image_editor(context, image) -> bool:
    """Shows ``image`` in the first Image Editor of the screen; False when there is none."""
    screen = getattr(context, "screen", None)
    for area in getattr(screen, "areas", ()):
        if area.type == "IMAGE_EDITOR":
            area.spaces.active.image = image
            return True
    return False


@options.with_properties(
    {**{k: v for f in families.ALL for k, v in options.family_properties(f).items()}, **_source_properties(), **options.shot_properties()}
)
class LEAN_IMAGE_AI_OT_preview_frame(ModalJobOperator, bpy.types.Operator):
    """Run the sequence settings on one frame and show the result, writing no file"""

    bl_idname = "lean_image_ai.preview_frame"
    bl_label = "Preview Frame"
    bl_description = "Run the current settings on the current frame (or Frame) and show the result in an Image Editor; no file is written"
    bl_options = {"REGISTER"}
    job_title = "Preview Frame"

    family: EnumProperty(name="Model Kind", items=[(f.id, f.action, f.produces) for f in families.ALL])
    frame: IntProperty(name="Frame", description="The frame to preview; 0: the scene's current frame", default=0)

    def prepare(self, context, job: BlenderJob):
        family = families.get(self.family)
        number = self.frame or context.scene.frame_current
        refs = [r for r in _frames(self, None) if r.number == number]
        if not refs:
            raise LeanImageError(f"Frame {number} is not in the sequence; choose one of its frames to preview.")
        model_run = prefs.operator_model_run(context, self, family.id)
        shot = options.shot_settings_of(self, family.id)
        model_run.extra.update(shot.adapter_kwargs())  # a given field of view; a fitted shot focal needs the shot
        inputs = job.inputs = SimpleNamespace(number=number, shot=shot, family=family, product=None, encoded=None)

        def stage(result):  # the image's file, written by the pump a band at a time (ModelJobOperator.encode)
            inputs.product = preview_product(family.id, result, shot)
            inputs.encoded = results.float_file(inputs.product.pixels)
            return inputs.encoded

        # no pixels: the batch reads the frame over its first timer calls (model_job.frame_read)
        return one_frame_task(job, model_run, refs[0], None, stage=stage)

    def finish(self, context, job: BlenderJob):
        if job.state != "finished":
            self.report({"ERROR"} if job.state == "failed" else {"WARNING"}, job.error_text)
            return {"CANCELLED"}
        inputs = job.inputs
        product = inputs.product
        old = bpy.data.images.get(PREVIEW_IMAGE)
        if old is not None:
            bpy.data.images.remove(old)
        image = results.image_from_file(PREVIEW_IMAGE, inputs.encoded, "Non-Color" if product.is_data else None)
        shown = show_in_image_editor(context, image)
        where = "shown in the Image Editor" if shown else f"in the image '{PREVIEW_IMAGE}' (open an Image Editor to see it)"
        span = f", depth {product.value_range[0]:.4g}..{product.value_range[1]:.4g}" if product.value_range else ""
        self.report({"INFO"}, f"Preview of frame {inputs.number}{span}: {where}; no file was written")
        return {"FINISHED"}


classes = (LEAN_IMAGE_AI_OT_reconstruct_shot, LEAN_IMAGE_AI_OT_preview_frame)
