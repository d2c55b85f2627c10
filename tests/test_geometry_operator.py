"""reconstruct_geometry with real bpy 5.0.1 (background mode) and a MoGe-2-like ONNX model.

The model (tests/builders_moge2.py) sees a tilted plane; its mask reads the red channel, so the
test image paints a hole (red 0) where no geometry must be made. The expected point map, mask,
normals and field of view come from calling models.moge2 directly on the same pixels.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
bh.import_package()

from builders_moge2 import moge2_like_model  # noqa: E402
from lean_image_ai.models.adapters import moge2, moge2_mesh  # noqa: E402
from lean_image_ai.models.base import RunOptions  # noqa: E402
from lean_image_ai.operators import geometry_ops, image_io, image_ops, jobs  # noqa: E402
from lean_image_ai.runtime import Runtime  # noqa: E402

W, H = 64, 48
HOLE = (slice(10, 22), slice(40, 58))  # rows, cols without geometry (red 0)


@pytest.fixture(scope="module", autouse=True)
def registered():
    with bh.registered_classes([*jobs.classes, *image_ops.classes, *geometry_ops.classes]):
        yield


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    yield from bh.fresh_blender(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("geo_models")
    return {
        "good": moge2_like_model(root / "moge.onnx"),
        "no_normal": moge2_like_model(root / "moge_nn.onnx", with_normal=False),
        "nan": moge2_like_model(root / "moge_nan.onnx", poison="nan"),
    }


@pytest.fixture
def photo(tmp_path):
    rng = np.random.default_rng(5)
    pixels = np.zeros((H, W, 4), np.uint8)
    pixels[..., 0] = 255
    pixels[..., 1:3] = rng.integers(0, 255, (H, W, 2))
    pixels[..., 3] = 255
    pixels[HOLE[0], HOLE[1], 0] = 0
    path = tmp_path / "room.png"
    PILImage.fromarray(pixels, "RGBA").save(path)
    return path, pixels


def expected_geometry(model, pixels, level=0):
    runtime = Runtime()
    try:
        return moge2.run(pixels, model, options=RunOptions(runtime=runtime), resolution_level=level)
    finally:
        runtime.clear("test")


def counts():
    return tuple(
        len(c)
        for c in (bpy.data.images, bpy.data.objects, bpy.data.meshes, bpy.data.materials, bpy.data.cameras)
    )


def test_mesh_camera_material_and_normal_map(tmp_path, models, photo, capfd):
    path, pixels = photo
    out = tmp_path / "normal.png"
    result = bpy.ops.lean_image_ai.reconstruct_geometry(
        filepath=str(path), model_path=str(models["good"]), resolution_level=0, output_path=str(out)
    )
    assert result == {"FINISHED"}
    geo = expected_geometry(models["good"], pixels)

    obj = bpy.data.objects["room_geometry"]
    mesh = obj.data
    assert len(mesh.vertices) == int(geo.mask.sum())  # one vertex per valid pixel, no subsampling
    assert not geo.mask[HOLE[0], HOLE[1]][2:-2, 2:-2].any()  # the hole really is invalid
    # faces: all four corners valid and a depth jump under the 4% default, counted independently
    faces = 0
    for i in range(H - 1):
        for j in range(W - 1):
            corners = [(i, j), (i + 1, j), (i + 1, j + 1), (i, j + 1)]
            if all(geo.mask[c] for c in corners):
                d = [geo.depth[c] for c in corners]
                faces += max(d) / min(d) - 1 < 0.04
    assert len(mesh.polygons) == faces > 0
    # Blender prints the operator's INFO report in background mode
    assert (
        f"Reconstructed 'room_geometry': {len(mesh.vertices)} vertices, {faces} faces"
        in capfd.readouterr().out
    )

    co = np.empty(len(mesh.vertices) * 3, np.float32)
    mesh.vertices.foreach_get("co", co)
    co = co.reshape(-1, 3)
    # Blender camera space: in front of a camera at the origin looking down -Z
    assert (co[:, 2] < 0).all()
    np.testing.assert_allclose(-co[:, 2], geo.depth[geo.mask], rtol=1e-5)
    # each vertex projects (through the recovered intrinsics) onto its own pixel: its UV
    loops = np.empty(len(mesh.loops), np.int32)
    mesh.loops.foreach_get("vertex_index", loops)
    uv = np.empty(len(mesh.loops) * 2, np.float32)
    mesh.uv_layers.active.data.foreach_get("uv", uv)
    uv = uv.reshape(-1, 2)
    fx, fy, cx, cy = geo.intrinsics[0, 0], geo.intrinsics[1, 1], geo.intrinsics[0, 2], geo.intrinsics[1, 2]
    px = cx + fx * co[loops, 0] / -co[loops, 2]
    py = cy - fy * co[loops, 1] / -co[loops, 2]  # image rows go down, Blender's y goes up
    np.testing.assert_allclose(px, uv[:, 0] * W, atol=2e-3)
    np.testing.assert_allclose(py, (1 - uv[:, 1]) * H, atol=2e-3)
    # faces face the camera
    normals = np.empty(len(mesh.polygons) * 3, np.float32)
    mesh.polygons.foreach_get("normal", normals)
    centers = np.empty(len(mesh.polygons) * 3, np.float32)
    mesh.polygons.foreach_get("center", centers)
    assert (np.einsum("ij,ij->i", normals.reshape(-1, 3), -centers.reshape(-1, 3)) > 0).all()

    material = mesh.materials[0]
    texture = next(n for n in material.node_tree.nodes if n.type == "TEX_IMAGE")
    assert texture.image == bpy.data.images["room.png"]  # the source, kept for the material
    bsdf = next(n for n in material.node_tree.nodes if n.type == "BSDF_PRINCIPLED")
    assert bsdf.inputs["Base Color"].links[0].from_node == texture

    camera = bpy.data.objects["room_camera"]
    assert camera.type == "CAMERA" and tuple(camera.location) == (0, 0, 0)
    assert tuple(camera.rotation_euler) == (0, 0, 0)
    assert camera.data.sensor_fit == "HORIZONTAL"
    assert camera.data.angle_x == pytest.approx(geo.fov_x, abs=1e-5)
    assert camera.data.angle_x == pytest.approx(2 * math.atan(W / 2 / fx), abs=1e-5)
    scene = bpy.context.scene
    assert (scene.render.resolution_x, scene.render.resolution_y) == (W, H) and scene.camera == camera

    normal_image = bpy.data.images["room_normal"]
    assert normal_image.colorspace_settings.name == "Non-Color" and tuple(normal_image.size) == (W, H)
    got = image_io.image_to_array(normal_image)
    assert got.min() >= 0 and got.max() <= 1
    decoded = got[..., :3] * 2 - 1
    blender_normals = geo.normal * np.array([1, -1, -1], np.float32)
    np.testing.assert_allclose(decoded[geo.mask], blender_normals[geo.mask], atol=1e-5)
    assert PILImage.open(out).size == (W, H)


def test_without_camera_or_normals(models, photo):
    path, _ = photo
    scene = bpy.context.scene
    resolution = (scene.render.resolution_x, scene.render.resolution_y)
    result = bpy.ops.lean_image_ai.reconstruct_geometry(
        filepath=str(path), model_path=str(models["no_normal"]), resolution_level=0, make_camera=False
    )
    assert result == {"FINISHED"}
    assert [o.name for o in bpy.data.objects] == ["room_geometry"]
    assert "room_normal" not in bpy.data.images and scene.camera is None
    assert (scene.render.resolution_x, scene.render.resolution_y) == resolution


def test_failing_model_changes_nothing(models, photo):
    path, _ = photo
    before = counts()
    with pytest.raises(RuntimeError, match="NaN"):
        bpy.ops.lean_image_ai.reconstruct_geometry(
            filepath=str(path), model_path=str(models["nan"]), resolution_level=0
        )
    assert counts() == before  # the source loaded for the material was removed again


def test_mesh_arrays_subsample_and_discontinuity():
    """Large images are sampled to at most MAX_GRID_SIDE per side; a depth step cuts faces."""
    height, width = 1030, 700
    stride = math.ceil(1030 / moge2_mesh.MAX_GRID_SIDE)  # 3
    depth = np.full((height, width), 2.0, np.float32)
    depth[:, width // 2 :] = 3.0  # a 50% step between the halves
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    points = np.stack([xs * depth / 500, ys * depth / 500, depth], axis=-1)
    mask = np.ones((height, width), bool)
    mask[:stride, :stride] = False  # the first sampled pixel only

    arrays = moge2_mesh.mesh_arrays(points, mask, discontinuity=0.04)

    rows, cols = len(range(0, height, stride)), len(range(0, width, stride))
    assert arrays.stride == stride and max(rows, cols) <= moge2_mesh.MAX_GRID_SIDE
    assert len(arrays.vertices) == rows * cols - 1
    # cells: all but the one touching the missing corner, minus the column of cells on the step
    assert len(arrays.quads) == (rows - 1) * (cols - 1) - 1 - (rows - 1)
    with_jump_allowed = moge2_mesh.mesh_arrays(points, mask, discontinuity=0.6)
    assert len(with_jump_allowed.quads) == (rows - 1) * (cols - 1) - 1
    # vertex 0 is the sampled pixel (row 0, column `stride`): OpenCV axes -> Blender axes
    x, y, z = points[0, stride]
    np.testing.assert_allclose(arrays.vertices[0], (x, -y, -z), rtol=1e-6)
    assert arrays.uv[0] == pytest.approx(((stride + 0.5) / width, 1 - 0.5 / height))


def test_a_normal_map_saved_as_exr_is_the_pumps_file_with_blenders_pixels(tmp_path, models, photo, monkeypatch):
    """Save Result To an .exr: the normal map's file is the EXR the job's pump wrote (not made whole
    and saved by Blender's writer in the applying call), with the pixels Blender's writer saved
    (the old path, forced), and the normal map reads it, as before."""
    path, _ = photo

    def reconstruct(out: Path) -> np.ndarray:
        assert bpy.ops.lean_image_ai.reconstruct_geometry(
            filepath=str(path), model_path=str(models["good"]), resolution_level=0, output_path=str(out)
        ) == {"FINISHED"}
        image = bpy.data.images["room_normal"]
        assert image.packed_file is None and Path(bpy.path.abspath(image.filepath)) == out
        pixels = image_io.image_to_array(image)
        bpy.data.images.remove(image)
        return pixels

    written = []
    with monkeypatch.context() as old_path:
        old_path.setattr(geometry_ops.results, "made_for_output", lambda output, *_: output is None)
        before = reconstruct(tmp_path / "blender.exr")
    real_write = geometry_ops.results.OutputFile.write
    monkeypatch.setattr(geometry_ops.results.OutputFile, "write", lambda self: written.append(self.path) or real_write(self))
    after = reconstruct(tmp_path / "saved.exr")
    assert written == [tmp_path / "saved.exr"]  # the pump's file, written by the add-on
    np.testing.assert_array_equal(after, before)
    assert np.ptp(after[..., :3]) > 0.1  # a real normal map, not a flat one
