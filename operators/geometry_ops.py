"""Reconstruct geometry (MoGe-2): a mesh, a material, a normal map and a matching camera (bpy).

The mesh arrays are built from MoGe-2's point map in the worker thread (models/adapters/moge2_mesh.py) and
turned into Blender data on the main thread with ``foreach_set``.
"""

# No ``from __future__ import annotations``: Blender reads property annotations as objects.
import math
from dataclasses import dataclass, field

import bpy
import numpy as np

from ..models.adapters import moge2
from ..models.adapters.moge2_mesh import MeshArrays, mesh_arrays, normal_map
from ..runtime.errors import InvalidModelOutputError
from . import image_io, results
from .model_job import ModelJobOperator
from .options import with_family_options


@dataclass
class Reconstruction:
    geometry: object  # moge2.GeometryResult
    mesh: MeshArrays
    normal_rgba: np.ndarray | None  # H x W x 4 in 0..1, or None when the model has no normals
    warnings: list = field(default_factory=list)


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
        report(0.9, "building mesh")
        mesh = mesh_arrays(geometry.points, geometry.mask, discontinuity=inputs.options["discontinuity"])
        normals = None if geometry.normal is None else normal_map(geometry.normal, geometry.mask)
        report(1.0, "done")
        return Reconstruction(geometry, mesh, normals, list(geometry.warnings))

    def encode(self, inputs, result):
        """The normal map (alpha 1) as a packed float EXR, unless it is saved to a file."""
        return None if result.normal_rgba is None or inputs.output else results.value_file(result.normal_rgba)

    def apply(self, context, inputs, result):
        stem = inputs.stem
        geometry, arrays = result.geometry, result.mesh
        if len(arrays.vertices) == 0:
            raise InvalidModelOutputError(f"MoGe-2 found no geometry in '{stem}'; nothing was made.")
        height, width = geometry.mask.shape
        note = ""
        with results.created_data() as created:
            mesh = created.add(
                bpy.data.meshes,
                results.build_mesh(f"{stem}_geometry", arrays.vertices, arrays.quads, arrays.uv),
            )
            mesh.materials.append(
                created.add(bpy.data.materials, make_material(f"{stem}_geometry", inputs.source))
            )
            obj = created.add(bpy.data.objects, bpy.data.objects.new(f"{stem}_geometry", mesh))
            normal_image = None
            if inputs.encoded is not None:
                normal_image = created.add(bpy.data.images, results.image_from_file(f"{stem}_normal", inputs.encoded, "Non-Color"))
            elif result.normal_rgba is not None:
                normal_image = created.add(
                    bpy.data.images,
                    image_io.array_to_new_image(
                        f"{stem}_normal", result.normal_rgba, float_buffer=True, colorspace="Non-Color"
                    ),
                )
            if normal_image is not None:
                note = results.save_output(normal_image, inputs.output)
            elif inputs.output:
                note = "; not saved: this model gives no normal map"
            camera = None
            if inputs.options["make_camera"]:
                camera = created.add(bpy.data.objects, make_camera(f"{stem}_camera", geometry, created))
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
