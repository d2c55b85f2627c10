"""Reconstruct geometry (MoGe-2): a mesh, a material, a normal map and a matching camera (bpy).

The model's point map comes back from the worker process; the job's pump then turns it into the
mesh's arrays (models/adapters/moge2_mesh.py), the normal map (a band of rows per call) and its
packed file, and the Blender mesh a part per call (:class:`MeshSteps`, Reconstruct Shot's too), each in a timer call of its
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
from ..runtime.errors import InvalidModelOutputError, LeanImageError
from . import image_io, results
from .jobs import OneByOne
from .model_job import ModelJobOperator
from .options import with_family_options

# The depth plane: grid resolution on its long side, and how far the nearest point stands out
# of it, as a fraction of the plane's long side (2 m).
PLANE_SEGMENTS = 256
PLANE_SIZE = 2.0
PLANE_RELIEF = 0.25


class MeshSteps:
    """A mesh of quads from numpy arrays (``foreach_set``, far faster than ``from_pydata``), made a
    part per :meth:`pump` call: its vertices, its corners, its faces, its UVs, its edges (issue #37
    item 3: a 196k-vertex mesh made whole held Blender's main thread 0.13 s). :attr:`mesh` has no
    user until the caller gives it one; :meth:`remove` drops one made in part (a cancel, a failure)."""

    def __init__(self, name: str, vertices: np.ndarray, quads: np.ndarray, vertex_uv: np.ndarray | None = None):
        self.name, self.mesh = name, None
        self._vertices, self._uv = vertices, vertex_uv
        self._corners = np.ascontiguousarray(quads, np.int32).ravel()
        self._steps = [self._add_vertices, self._add_corners, self._add_faces, self._add_uv, self._add_edges]
        if vertex_uv is None:
            self._steps.remove(self._add_uv)

    def pump(self, budget: float = 0.0) -> bool:
        """Make the next part (one a call, whatever ``budget``); True once the mesh is whole."""
        if self._steps:
            try:
                self._steps.pop(0)()
            except ReferenceError as exc:  # Blender's word for a datablock removed meanwhile (a purge of orphans)
                self.mesh = None
                raise LeanImageError(f"The mesh '{self.name}' was removed while it was being made; nothing was "
                                     "made. Run it again.") from exc
            except BaseException:
                self.remove()
                raise
        return not self._steps

    def finish_now(self):
        """The whole mesh in one call (no main thread to keep free, or a mesh small enough)."""
        while not self.pump():
            pass
        return self.mesh

    def remove(self) -> None:
        mesh, self.mesh = self.mesh, None
        if mesh is not None:
            try:
                bpy.data.meshes.remove(mesh)
            except ReferenceError:  # removed already (a file loaded meanwhile, say)
                pass

    def _add_vertices(self) -> None:
        self.mesh = bpy.data.meshes.new(self.name)
        self.mesh.vertices.add(len(self._vertices))
        self._set(self.mesh.vertices, "co", np.ascontiguousarray(self._vertices, np.float32).ravel())

    def _add_corners(self) -> None:
        self.mesh.loops.add(len(self._corners))
        self._set(self.mesh.loops, "vertex_index", self._corners)

    def _add_faces(self) -> None:
        faces = len(self._corners) // 4
        self.mesh.polygons.add(faces)
        self.mesh.polygons.foreach_set("loop_start", np.arange(0, 4 * faces, 4, dtype=np.int32))
        self.mesh.polygons.foreach_set("loop_total", np.full(faces, 4, np.int32))

    def _add_uv(self) -> None:
        layer = self.mesh.uv_layers.new(name="UVMap")
        uv = np.ascontiguousarray(self._uv[self._corners], np.float32).ravel()
        self._set(layer.data, "uv", uv, layer.name)

    def _add_edges(self) -> None:
        self.mesh.update(calc_edges=True)

    # The attribute Blender (4.2 to 5.3) keeps an item's value in: (its name, "" for the UV map's own;
    # its type; its key). Written there with one copy (0.001 s for a million corners), where
    # ``loops.foreach_set("vertex_index")`` converts a value at a time (0.05-0.1 s).
    ATTRIBUTES = {"co": ("position", "FLOAT_VECTOR", "vector"), "vertex_index": (".corner_vert", "INT", "value"),
                  "uv": ("", "FLOAT2", "vector")}

    def _set(self, items, item_key: str, values: np.ndarray, name: str = "") -> None:
        """``items.foreach_set(item_key, values)``, through the attribute that holds them where there is one."""
        attribute, data_type, key = self.ATTRIBUTES.get(item_key, (None, None, None))
        found = self.mesh.attributes.get(attribute or name) if data_type else None
        if found is not None and found.data_type == data_type and len(found.data) == len(items):
            found.data.foreach_set(key, values)
        else:
            items.foreach_set(item_key, values)


def build_mesh(name: str, vertices: np.ndarray, quads: np.ndarray, vertex_uv: np.ndarray | None = None):
    """A mesh of quads from numpy arrays, made in one call (:class:`MeshSteps`)."""
    return MeshSteps(name, vertices, quads, vertex_uv).finish_now()


def link_object(context, obj) -> None:
    """Link ``obj`` into the active collection and make it the active, selected object."""
    collection = getattr(context, "collection", None) or context.scene.collection
    collection.objects.link(obj)
    view_layer = getattr(context, "view_layer", None)
    if view_layer is not None:
        for other in view_layer.objects:
            if other is not obj and other.select_get(view_layer=view_layer):
                other.select_set(False, view_layer=view_layer)
        obj.select_set(True, view_layer=view_layer)
        view_layer.objects.active = obj


@dataclass
class Reconstruction:
    geometry: object  # moge2.GeometryResult
    warnings: list = field(default_factory=list)
    # made by the job's pump (GeometryOperator.finishing_steps), in this order:
    mesh: MeshArrays | None = None
    normal_rgba: np.ndarray | None = None  # H x W x 4 in 0..1, or None when the model has no normals
    depth_range: tuple[float, float] | None = None  # nearest and farthest valid depth: the camera's clipping
    built: MeshSteps | None = None  # the Blender mesh, no user yet


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
            result.built = MeshSteps(f"{stem}_geometry", made.vertices, made.quads, made.uv)
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
            link_object(context, obj)
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
    return build_mesh(name, co, quads, uv.astype(np.float32))


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
    link_object(context, obj)
    return obj
