"""Issue #37 item 3: Reconstruct Geometry makes its mesh over several calls of Blender's main thread.

The real operator (bpy 5.0.1, a MoGe-2-like net of tests/builders_moge2.py in the model worker)
driven as Blender's UI drives it (tests/modal_standins.py: ``start_modal``, then one TIMER event
at a time). Per timer call the test notes what the call did to Blender's meshes: the mesh is made a
part per call (vertices, corners, faces, UVs, edges), has no user until the call that makes its
object, and is the mesh the one-call build of before (:func:`one_call_mesh`, kept here as it was)
makes of the same arrays. Esc, Blender's own cancel, a failure after the mesh was made or the mesh
removed meanwhile leave no mesh behind. Before, the whole mesh was made in the call that applies
the job. Behaviour, not seconds: bench/worker.py --ops-geometry measures the calls.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
bh.import_package()

from builders_moge2 import moge2_like_model  # noqa: E402
from lean_image_ai.models.adapters import moge2_mesh  # noqa: E402
from lean_image_ai.operators import geometry_ops, jobs, results  # noqa: E402
from modal_standins import ESC, TIMER, StandInContext, drive, driver_class  # noqa: E402

W, H = 160, 120  # under MAX_GRID_SIDE: a vertex per valid pixel
HOLE = (slice(30, 60), slice(70, 110))  # no geometry there (red 0): faces missing around it

LEANTEST_OT_drive_geometry = driver_class(
    geometry_ops.LEAN_IMAGE_AI_OT_reconstruct_geometry, "lean_image_ai_test.drive_geometry", "LEANTEST_OT_drive_geometry"
)


@pytest.fixture(scope="module", autouse=True)
def registered():
    with bh.registered_classes([*jobs.classes, *geometry_ops.classes, LEANTEST_OT_drive_geometry]):
        yield


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    yield from bh.fresh_blender(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return moge2_like_model(tmp_path_factory.mktemp("geo_steps") / "moge.onnx")


@pytest.fixture
def photo(tmp_path):
    rng = np.random.default_rng(7)
    pixels = np.full((H, W, 4), 255, np.uint8)
    pixels[..., 1:3] = rng.integers(0, 255, (H, W, 2))
    pixels[HOLE[0], HOLE[1], 0] = 0
    path = tmp_path / "room.png"
    PILImage.fromarray(pixels, "RGBA").save(path)
    return path


def one_call_mesh(name, vertices, quads, vertex_uv):
    """geometry_ops.build_mesh as it was before the mesh was made a part per call (main 6e905c1)."""
    mesh = bpy.data.meshes.new(name)
    mesh.vertices.add(len(vertices))
    mesh.vertices.foreach_set("co", np.ascontiguousarray(vertices, np.float32).ravel())
    faces = len(quads)
    loops = np.ascontiguousarray(quads, np.int32).ravel()
    mesh.loops.add(len(loops))
    mesh.loops.foreach_set("vertex_index", loops)
    mesh.polygons.add(faces)
    mesh.polygons.foreach_set("loop_start", np.arange(0, 4 * faces, 4, dtype=np.int32))
    mesh.polygons.foreach_set("loop_total", np.full(faces, 4, np.int32))
    layer = mesh.uv_layers.new(name="UVMap")
    layer.data.foreach_set("uv", np.ascontiguousarray(vertex_uv[loops], np.float32).ravel())
    mesh.update(calc_edges=True)
    return mesh


def mesh_state(mesh) -> tuple:
    """What a call can change of a mesh: its parts' counts, its UV layers and its users."""
    return (len(mesh.vertices), len(mesh.loops), len(mesh.polygons), len(mesh.uv_layers), len(mesh.edges), mesh.users)


def counts() -> tuple:
    data = bpy.data
    return tuple(len(c) for c in (data.images, data.objects, data.meshes, data.materials, data.cameras))


def run_modal(photo: Path, model: Path, *, cancel_when=None, stop_when=None) -> dict:
    """Drive one job; per timer call, the state of every mesh the job made and whether an object
    uses it. ``cancel_when()``: Esc once it is true; ``stop_when()``: Blender's own cancel of the
    operator (a file load, say) once it is true after a timer call. Also the job's geometry."""
    seen = {"calls": [], "geometry": None}

    def keep_geometry(job):
        seen["geometry"] = getattr(job.result, "geometry", None)
        seen["depth_range"] = getattr(job.result, "depth_range", None)

    def script(op):
        ctx = StandInContext()
        before = set(bpy.data.meshes)
        state = op.start_modal(ctx)
        deadline = time.monotonic() + 120
        while state == {"RUNNING_MODAL"}:
            assert time.monotonic() < deadline, "the job did not end in time"
            if cancel_when is not None and "cancelled_at" not in seen and cancel_when():
                op.modal(ctx, ESC)
                seen["cancelled_at"] = len(seen["calls"])
            state = op.modal(ctx, TIMER)
            made = {mesh.name: mesh_state(mesh) for mesh in bpy.data.meshes if mesh not in before}
            linked = any(obj.data is not None and obj.data.name in made for obj in bpy.data.objects)
            seen["calls"].append((made, linked))
            if stop_when is not None and state == {"RUNNING_MODAL"} and stop_when():
                op.cancel(ctx)
                seen["stopped_at"], state = len(seen["calls"]), {"CANCELLED"}
            time.sleep(0.005)
        seen["state"] = state
        return state

    jobs.manager.on_end.append(keep_geometry)
    try:
        drive(bpy.ops.lean_image_ai_test.drive_geometry, script, filepath=str(photo), model_path=str(model),
              resolution_level=0)
    finally:
        jobs.manager.on_end.remove(keep_geometry)
    return seen


def mesh_facts(mesh) -> dict:
    co = np.empty(len(mesh.vertices) * 3, np.float32)
    mesh.vertices.foreach_get("co", co)
    corners = np.empty(len(mesh.loops), np.int32)
    mesh.loops.foreach_get("vertex_index", corners)
    starts, totals = (np.empty(len(mesh.polygons), np.int32) for _ in range(2))
    mesh.polygons.foreach_get("loop_start", starts)
    mesh.polygons.foreach_get("loop_total", totals)
    uv = np.empty(len(mesh.loops) * 2, np.float32)
    mesh.uv_layers["UVMap"].data.foreach_get("uv", uv)
    edges = np.empty(len(mesh.edges) * 2, np.int32)
    mesh.edges.foreach_get("vertices", edges)
    faces = [tuple(corners[start : start + total]) for start, total in zip(starts, totals, strict=True)]
    return {"co": co, "faces": faces, "uv": uv, "edges": np.sort(np.sort(edges.reshape(-1, 2), axis=1), axis=0),
            "uv_layers": [layer.name for layer in mesh.uv_layers]}


def test_the_mesh_is_made_a_part_per_call_and_is_the_one_call_builds_mesh(photo, model):
    seen = run_modal(photo, model)
    assert seen["state"] == {"FINISHED"}
    calls = seen["calls"]
    obj = bpy.data.objects["room_geometry"]
    name = obj.data.name
    states = [made.get(name) for made, _ in calls]
    touching = [index for index in range(len(calls)) if states[index] != (states[index - 1] if index else None)]
    linked_from = next(index for index, (_, linked) in enumerate(calls) if linked)
    # vertices, corners, faces, UVs: each in a call of its own before the call that makes its object
    assert len([index for index in touching if index < linked_from]) >= 4, states
    assert all(state is None or state[-1] == 0 for state in states[:linked_from]), "a user before the last call"
    assert all(linked for _, linked in calls[linked_from:])

    geometry = seen["geometry"]
    arrays = moge2_mesh.mesh_arrays(geometry.points, geometry.mask, discontinuity=0.04)
    assert len(arrays.quads) < (H - 1) * (W - 1)  # the hole cut faces: a mesh with gaps to compare
    before = one_call_mesh("before", arrays.vertices, arrays.quads, arrays.uv)
    got, expected = mesh_facts(obj.data), mesh_facts(before)
    np.testing.assert_array_equal(got["co"], expected["co"])
    assert got["faces"] == expected["faces"]
    np.testing.assert_array_equal(got["uv"], expected["uv"])
    assert len(obj.data.edges) == len(before.edges)
    np.testing.assert_array_equal(got["edges"], expected["edges"])
    assert got["uv_layers"] == expected["uv_layers"] == ["UVMap"]

    # the camera: as make_camera made it of the whole geometry, its clipping from the nearest and
    # farthest valid depth (which the pump found in a call of its own)
    assert sorted(o.name for o in bpy.data.objects) == ["room_camera", "room_geometry"]
    camera = bpy.data.objects["room_camera"]
    depth = geometry.depth[geometry.mask]
    assert seen["depth_range"] == (float(depth.min()), float(depth.max()))
    with results.created_data() as created:
        camera_before = geometry_ops.make_camera("before_camera", geometry, created).data
    for setting in ("clip_start", "clip_end", "angle_x", "sensor_fit"):
        assert getattr(camera.data, setting) == getattr(camera_before, setting), setting
    assert bpy.context.scene.camera == camera
    assert obj.data.materials[0].name == "room_geometry"


def mesh_in_part() -> bool:
    """A mesh of the job exists, its faces still missing (the build is half-way)."""
    return any(len(mesh.vertices) and not len(mesh.polygons) for mesh in bpy.data.meshes)


def test_esc_while_the_mesh_is_made_leaves_no_mesh(photo, model):
    before = counts()
    seen = run_modal(photo, model, cancel_when=mesh_in_part)
    assert "cancelled_at" in seen, "the mesh was never seen made in part"
    assert seen["state"] == {"CANCELLED"}
    assert counts() == before  # the half-made mesh, and the source loaded for the material, are gone


def test_blenders_cancel_while_the_mesh_is_made_leaves_no_mesh(photo, model):
    before = counts()
    seen = run_modal(photo, model, stop_when=mesh_in_part)
    assert "stopped_at" in seen
    assert counts() == before


def test_a_failure_after_the_mesh_was_made_leaves_no_mesh(photo, model, monkeypatch):
    def broken_link(context, obj):
        raise RuntimeError("link refused")

    monkeypatch.setattr(geometry_ops, "link_object", broken_link)
    before = counts()
    with pytest.raises(RuntimeError, match="Unexpected error: RuntimeError: link refused"):  # the ERROR report
        run_modal(photo, model)
    assert jobs.manager.last.state == "failed"
    assert counts() == before


def test_the_mesh_removed_while_it_is_made_is_a_clear_error(photo, model):
    def remove_it() -> bool:
        half_made = [mesh for mesh in bpy.data.meshes if len(mesh.vertices) and not len(mesh.polygons)]
        for mesh in half_made:  # as File > Clean Up > Purge Unused Data would
            bpy.data.meshes.remove(mesh)
        return bool(half_made)

    before = counts()
    seen = {}

    def script(op):
        ctx = StandInContext()
        state = op.start_modal(ctx)
        removed = False
        deadline = time.monotonic() + 120
        while state == {"RUNNING_MODAL"}:
            assert time.monotonic() < deadline
            state = op.modal(ctx, TIMER)
            removed = remove_it() or removed
            time.sleep(0.005)
        seen["removed"] = removed
        return state

    with pytest.raises(RuntimeError, match="was removed while it was being made"):
        drive(bpy.ops.lean_image_ai_test.drive_geometry, script, filepath=str(photo), model_path=str(model),
              resolution_level=0)
    assert seen["removed"]
    assert jobs.manager.last.state == "failed"
    assert jobs.manager.last.error_text == (
        "The mesh 'room_geometry' was removed while it was being made; nothing was made. Run it again.")
    assert counts() == before


@pytest.mark.parametrize("through_attributes", [True, False])
def test_mesh_steps_make_the_one_call_builds_mesh(monkeypatch, through_attributes):
    """Written through the attributes that hold them (Blender 4.2-5.3), or through the items' own
    foreach_set where a Blender has no such attribute: the same mesh either way."""
    if not through_attributes:
        monkeypatch.setattr(geometry_ops.MeshSteps, "ATTRIBUTES", {})
    height, width = 90, 130
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    depth = 2.0 + 0.01 * xs + np.where(xs > 80, 1.0, 0.0)  # a step: a column of faces cut
    points = np.stack([xs * depth / 300, ys * depth / 300, depth], axis=-1)
    mask = np.ones((height, width), bool)
    mask[20:40, 10:30] = False
    arrays = moge2_mesh.mesh_arrays(points, mask, discontinuity=0.04)
    steps = geometry_ops.MeshSteps("steps", arrays.vertices, arrays.quads, arrays.uv)
    parts, done = [], []
    for _ in range(5):  # a part a call
        done.append(steps.pump())
        parts.append(mesh_state(steps.mesh))
    assert done == [False, False, False, False, True]
    n, corners, faces = len(arrays.vertices), 4 * len(arrays.quads), len(arrays.quads)
    assert [part[:4] for part in parts] == [(n, 0, 0, 0), (n, corners, 0, 0), (n, corners, faces, 0),
                                            (n, corners, faces, 1), (n, corners, faces, 1)]
    assert parts[3][4] == 0 < parts[4][4]  # the edges last
    got = mesh_facts(steps.mesh)
    expected = mesh_facts(one_call_mesh("before", arrays.vertices, arrays.quads, arrays.uv))
    for key in ("co", "uv", "edges"):
        np.testing.assert_array_equal(got[key], expected[key])
    assert got["faces"] == expected["faces"] and got["uv_layers"] == expected["uv_layers"]
    assert not steps.mesh.validate(verbose=True)  # nothing for Blender to fix


def test_one_undo_step_takes_the_whole_result_away(photo, model):
    """The mesh made over several timer calls is in the job's one undo step: undo removes the object,
    its mesh, material and camera; redo gives them back whole (a script's call pushes no step of
    its own: the pushes are Blender's after a button, as tests/results_job.py does)."""
    window = bpy.context.window_manager.windows[0]
    with bpy.context.temp_override(window=window):
        bpy.ops.ed.undo_push(message="before")
        seen = run_modal(photo, model)
        assert seen["state"] == {"FINISHED"}
        bpy.ops.ed.undo_push(message="reconstruct_geometry")
        made = (len(bpy.data.meshes["room_geometry"].vertices), len(bpy.data.meshes["room_geometry"].polygons))
        bpy.ops.ed.undo()
        assert "room_geometry" not in bpy.data.objects and "room_geometry" not in bpy.data.meshes
        assert "room_camera" not in bpy.data.objects and "room_geometry" not in bpy.data.materials
        bpy.ops.ed.redo()
    mesh = bpy.data.objects["room_geometry"].data
    assert (len(mesh.vertices), len(mesh.polygons)) == made and "room_camera" in bpy.data.objects
