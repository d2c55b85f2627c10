"""Reconstruct geometry (MoGe-2): a mesh, a material, a normal map and a matching camera (bpy).

The model's point map comes back from the worker process; the job's pump then turns it into the
mesh's arrays (models/adapters/moge2_mesh.py), the normal map (a band of rows per call) and its
packed file, and the Blender mesh a part per call (results.MeshSteps), each in a timer call of its
own (issue #37 item 3: made whole, they took 0.13-0.26 s of CPU in one call of Blender's main
thread). The mesh gets its object, material and camera in the last call: nothing shows a half-made
mesh, and a cancel or a failure before then removes it. Also the plane Estimate Depth displaces
with its depth image (:func:`make_depth_plane`).
"""

# No ``from __future__ import annotations``: Blender reads property annotations as objects.
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import bpy
import numpy as np

from ..models import file_bytes
from ..models.adapters import moge2
from ..models.adapters.moge2_mesh import MeshArrays, mesh_arrays, normal_map
from ..runtime.errors import InvalidModelOutputError
from . import image_io, results
from .jobs import OneByOne
from .model_job import ModelJobOperator
from .options import with_family_options

# The depth plane: grid resolution on its long side, and how far the nearest point stands out
# of it, as a fraction of the plane's long side (2 m).
PLANE_SEGMENTS = 256
PLANE_SIZE = 2.0
PLANE_RELIEF = 0.25


@dataclass
class Reconstruction:
    geometry: object  # moge2.GeometryResult
    warnings: list = field(default_factory=list)
    # made by the job's pump (GeometryOperator.finishing_steps), in this order:
    mesh: MeshArrays | None = None
    normal_rgba: np.ndarray | None = None  # H x W x 4 in 0..1, or None when the model has no normals
    depth_range: tuple[float, float] | None = None  # nearest and farthest valid depth: the camera's clipping
    built: results.MeshSteps | None = None  # the Blender mesh, no user yet


@with_family_options(moge2.FAMILY)
class LEAN_IMAGE_AI_OT_reconstruct_geometry(ModelJobOperator, bpy.types.Operator):
    """Reconstruct the scene of a photo as a 3D mesh with MoGe-2"""

    bl_description = (
        "Turn the image into a textured 3D mesh with MoGe-2 (metric scale), with its normal map "
        "and a camera matching the photo's field of view"
    )
    saves_family_result = False  # ``output_path`` is the normal map; the mesh stays in the .blend

    def keeps_source(self):
        return True  # the mesh's material shows it

    def shape(self, inputs, geometry, report):
        return Reconstruction(geometry, list(geometry.warnings))

    def finishing_steps(self, inputs, result, job):
        """The mesh's arrays, the normal map and its packed file (unless it is saved to a file, which
        Blender's writer does in ``apply``), the camera's clipping and the Blender mesh, a step per call;
        the mesh is removed again if the job ends without being applied."""
        geometry, stem = result.geometry, inputs.stem
        height, width = geometry.mask.shape

        def faces():
            result.mesh = mesh_arrays(geometry.points, geometry.mask, discontinuity=inputs.options["discontinuity"])
            if len(result.mesh.vertices) == 0:
                raise InvalidModelOutputError(f"MoGe-2 found no geometry in '{stem}'; nothing was made.")

        def normals():
            def rows(start, stop):
                return normal_map(geometry.normal[start:stop], geometry.mask[start:stop])

            made = file_bytes.BandedArray((height, width, 4), np.float32, rows)
            result.normal_rgba = made.out  # filled once the steps are over
            return made

        def normal_file():
            inputs.encoded = results.value_file(result.normal_rgba)
            return inputs.encoded

        def clipping():
            if geometry.mask.any():
                result.depth_range = (float(np.min(geometry.depth, where=geometry.mask, initial=np.inf)),
                                      float(np.max(geometry.depth, where=geometry.mask, initial=-np.inf)))

        def blender_mesh():
            made = result.mesh
            result.built = results.MeshSteps(f"{stem}_geometry", made.vertices, made.quads, made.uv)
            job.on_discard.append(result.built.remove)
            return result.built

        makers = [("finding the mesh's faces", faces)]
        if geometry.normal is not None:
            makers.append(("making the normal map", normals))
            if results.made_for_output(inputs.output, True):  # else Blender's writer saves it in apply
                makers.append(("packing the normal map", normal_file))
        if inputs.options["make_camera"]:
            makers.append(("the camera's clipping", clipping))
        makers.append(("building the mesh", blender_mesh))
        return OneByOne(makers, lambda stage: job.report(1.0, stage))

    def apply(self, context, inputs, result):
        stem = inputs.stem
        geometry, arrays, mesh = result.geometry, result.mesh, result.built.mesh
        height, width = geometry.mask.shape
        with results.created_data() as created:
            mesh.materials.append(
                created.add(bpy.data.materials, make_material(f"{stem}_geometry", inputs.source))
            )
            obj = created.add(bpy.data.objects, bpy.data.objects.new(f"{stem}_geometry", mesh))
            normal_image, note = _normal_image(created, f"{stem}_normal", inputs, result)
            camera = None
            if inputs.options["make_camera"]:
                near_far = result.depth_range or ()
                clipping = SimpleNamespace(fov_x=geometry.fov_x, depth=np.array(near_far, np.float32),
                                           mask=np.ones(len(near_far), bool))
                camera = created.add(bpy.data.objects, make_camera(f"{stem}_camera", clipping, created))
            if camera is not None:
                collection = getattr(context, "collection", None) or context.scene.collection
                collection.objects.link(camera)
            results.link_object(context, obj)
        if normal_image is not None:
            results.show(context, inputs.source, normal_image)
        if camera is not None:  # scene settings last: nothing can fail after them
            scene = context.scene
            scene.render.resolution_x, scene.render.resolution_y = width, height
            scene.camera = camera
        summary = f"Reconstructed '{obj.name}': {len(mesh.vertices)} vertices, {len(mesh.polygons)} faces"
        if arrays.stride > 1:
            summary += f" (every {arrays.stride}th pixel)"
        if camera is not None:
            summary += f"; camera '{camera.name}' with a {math.degrees(geometry.fov_x):.1f} deg field of view"
        return summary + note


def _normal_image(created, name: str, inputs, result):
    """The normal map's image and the report's note: reading the EXR the pump wrote at Save Result
    To, else from its packed file, else made whole and saved by Blender's writer (another format)."""
    if inputs.encoded is not None and inputs.output:
        image, note = results.saved_image(name, inputs.encoded, inputs.output, "Non-Color")
        return created.add(bpy.data.images, image), note
    if inputs.encoded is not None:
        image = results.image_from_file(name, inputs.encoded, "Non-Color")
    elif result.normal_rgba is not None:
        image = image_io.array_to_new_image(name, result.normal_rgba, float_buffer=True, colorspace="Non-Color")
    else:
        return None, "; not saved: this model gives no normal map" if inputs.output else ""
    created.add(bpy.data.images, image)
    return image, results.save_output(image, inputs.output)


def make_material(name, image):
    """A material whose base colour is ``image`` through the mesh's UV map."""
    material = bpy.data.materials.new(name)
    try:
        if not material.node_tree:  # Blender < 5.0 makes the node tree only on request
            material.use_nodes = True
        nodes = material.node_tree.nodes
        bsdf = next((n for n in nodes if n.type == "BSDF_PRINCIPLED"), None)
        if bsdf is None:
            bsdf = nodes.new("ShaderNodeBsdfPrincipled")
            output = next((n for n in nodes if n.type == "OUTPUT_MATERIAL"), None) or nodes.new(
                "ShaderNodeOutputMaterial"
            )
            material.node_tree.links.new(bsdf.outputs["BSDF"], output.inputs["Surface"])
        texture = nodes.new("ShaderNodeTexImage")
        texture.image = image
        texture.location = (bsdf.location.x - 400, bsdf.location.y)
        material.node_tree.links.new(texture.outputs["Color"], bsdf.inputs["Base Color"])
        nodes.active = texture
    except BaseException:
        bpy.data.materials.remove(material)
        raise
    return material


def make_camera(name, geometry, created):
    """A camera object at the origin looking down -Z with the recovered horizontal field of view."""
    data = created.add(bpy.data.cameras, bpy.data.cameras.new(name))
    data.sensor_fit = "HORIZONTAL"  # the angle below is across the image width, whatever its aspect
    data.angle_x = float(geometry.fov_x)
    depth = geometry.depth[geometry.mask]
    far = float(depth.max()) if depth.size else 100.0
    data.clip_start = min(0.1, max(1e-3, float(depth.min()) * 0.5)) if depth.size else 0.1
    data.clip_end = max(100.0, far * 2.0)
    return bpy.data.objects.new(name, data)


classes = (LEAN_IMAGE_AI_OT_reconstruct_geometry,)


def grid_mesh(name: str, width: float, height: float, nx: int, ny: int):
    """A flat grid in XY centred on the origin, (nx x ny) quads, UVs spanning 0..1 (numpy)."""
    xs = np.linspace(-width / 2, width / 2, nx + 1, dtype=np.float32)
    ys = np.linspace(-height / 2, height / 2, ny + 1, dtype=np.float32)
    gx, gy = np.meshgrid(xs, ys)  # row r = y index (bottom to top)
    co = np.stack([gx.ravel(), gy.ravel(), np.zeros(gx.size, np.float32)], axis=1)
    index = np.arange((nx + 1) * (ny + 1), dtype=np.int32).reshape(ny + 1, nx + 1)
    # counter-clockwise seen from +Z: the face normals point up
    quads = np.stack([index[:-1, :-1], index[:-1, 1:], index[1:, 1:], index[1:, :-1]], axis=-1).reshape(-1, 4)
    uv = np.stack([(gx.ravel() + width / 2) / width, (gy.ravel() + height / 2) / height], axis=1)
    return results.build_mesh(name, co, quads, uv.astype(np.float32))


def make_depth_plane(context, created, name, depth_image, depth):
    """A grid with the image's aspect and a Displace modifier reading the depth image by UV.

    Depth grows away from the viewer, so the displacement is inverted: the farthest depth stays
    in the plane and the nearest stands PLANE_RELIEF * PLANE_SIZE above it.
    """
    height_px, width_px = depth.shape
    long_px = max(width_px, height_px)
    width, height = PLANE_SIZE * width_px / long_px, PLANE_SIZE * height_px / long_px
    segments = min(PLANE_SEGMENTS, long_px)
    nx = max(1, round(segments * width_px / long_px))
    ny = max(1, round(segments * height_px / long_px))
    mesh = created.add(bpy.data.meshes, grid_mesh(name, width, height, nx, ny))
    obj = created.add(bpy.data.objects, bpy.data.objects.new(name, mesh))
    texture = created.add(bpy.data.textures, bpy.data.textures.new(name, type="IMAGE"))
    texture.image = depth_image
    texture.extension = "EXTEND"  # no wrap-around at the plane's border
    modifier = obj.modifiers.new("Depth", "DISPLACE")
    modifier.texture = texture
    modifier.texture_coords = "UV"
    modifier.uv_layer = mesh.uv_layers[0].name
    modifier.direction = "Z"
    low, high = float(depth.min()), float(depth.max())
    span = high - low
    modifier.mid_level = high
    modifier.strength = -PLANE_RELIEF * PLANE_SIZE / span if span > 0 and math.isfinite(span) else 0.0
    results.link_object(context, obj)
    return obj
