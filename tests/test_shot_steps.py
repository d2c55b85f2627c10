"""Issue #37 item 3: Reconstruct Shot makes each frame's mesh over several calls of Blender's main thread.

The real operator (bpy 5.0.1, a MoGe-2-like net of tests/builders_moge2.py in the model worker)
driven as Blender's UI drives it (tests/modal_standins.py: ``start_modal``, then one TIMER event at
a time). Per timer call the test notes what the call did to Blender's meshes: each frame's mesh is
made a part per call (vertices, corners, faces, UVs, edges) before the call that gives it its
object, and is the mesh the one-call build of before (test_geometry_steps.one_call_mesh) makes of
the frame's arrays; each object shows on its own frame only. Esc, Blender's own cancel or a failure
while a frame's mesh is half-made leave nothing of the shot (a shot is made whole or not at all).
Before, add_frame made a frame's mesh, texture, material, object and keys in one call.
Behaviour, not seconds: bench/worker.py --ops-shot measures the calls.
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

import shot_checks  # noqa: E402
from builders_moge2 import moge2_like_model  # noqa: E402
from lean_image_ai.models.adapters import moge2_mesh  # noqa: E402
from lean_image_ai.operators import jobs, shot_ops  # noqa: E402
from modal_standins import ESC, TIMER, StandInContext, drive, driver_class  # noqa: E402
from test_geometry_steps import mesh_facts, mesh_state, one_call_mesh  # noqa: E402

W, H, FRAMES = 160, 120, 3

LEANTEST_OT_drive_shot = driver_class(
    shot_ops.LEAN_IMAGE_AI_OT_reconstruct_shot, "lean_image_ai_test.drive_shot", "LEANTEST_OT_drive_shot"
)


@pytest.fixture(scope="module", autouse=True)
def registered():
    with bh.registered_classes([*jobs.classes, *shot_ops.classes, LEANTEST_OT_drive_shot]):
        yield


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    yield from bh.fresh_blender(tmp_path, monkeypatch, make_models_dir=False)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return moge2_like_model(tmp_path_factory.mktemp("shot_steps") / "moge.onnx")


@pytest.fixture
def shot(tmp_path):
    """Three frames, each with a hole of its own where the net sees no geometry (red 0)."""
    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(11)
    for number in range(1, FRAMES + 1):
        pixels = np.full((H, W, 3), 255, np.uint8)
        pixels[..., 1:3] = rng.integers(0, 255, (H, W, 2))
        pixels[20 + 10 * number : 50 + 10 * number, 60 : 90 + 5 * number, 0] = 0
        PILImage.fromarray(pixels, "RGB").save(folder / f"s_{number:04d}.png")
    return folder


def half_made() -> bool:
    """A mesh exists whose faces are still missing (a frame's build is half-way)."""
    return any(len(mesh.vertices) and not len(mesh.polygons) for mesh in bpy.data.meshes)


def run_modal(shot: Path, model: Path, *, cancel_when=None, stop_when=None) -> dict:
    """Drive one shot; per timer call, the state of every mesh the job made (see test_geometry_steps).
    ``cancel_when()``: Esc once it is true; ``stop_when()``: Blender's own cancel of the operator."""
    seen = {"calls": []}

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
            seen["calls"].append({mesh.name: mesh_state(mesh) for mesh in bpy.data.meshes if mesh not in before})
            if stop_when is not None and state == {"RUNNING_MODAL"} and stop_when():
                op.cancel(ctx)
                seen["stopped_at"], state = len(seen["calls"]), {"CANCELLED"}
            time.sleep(0.005)
        seen["state"] = state
        return state

    drive(bpy.ops.lean_image_ai_test.drive_shot, script, source=str(shot), model_path=str(model), shot_fov=40.0)
    return seen


def test_each_frames_mesh_is_made_a_part_per_call_and_is_the_one_call_builds_mesh(shot, model, monkeypatch):
    geometries = []  # (points, mask) of each frame, in the order the frames were made

    def recording(points, mask, *, discontinuity):
        geometries.append((points.copy(), mask.copy(), discontinuity))
        return moge2_mesh.mesh_arrays(points, mask, discontinuity=discontinuity)

    monkeypatch.setattr(shot_ops, "mesh_arrays", recording)
    seen = run_modal(shot, model)
    assert seen["state"] == {"FINISHED"}
    calls = seen["calls"]
    objects = sorted((o for o in bpy.data.objects if o.type == "MESH"), key=lambda o: o.name)
    assert [o.name for o in objects] == [f"s_{n:04d}_geometry" for n in range(1, FRAMES + 1)]
    assert len(geometries) == FRAMES
    for obj, (points, mask, discontinuity) in zip(objects, geometries, strict=True):
        name = obj.data.name
        states = [made.get(name) for made in calls]
        used_from = next(index for index, state in enumerate(states) if state is not None and state[-1] > 0)
        touching = [index for index in range(used_from)
                    if states[index] is not None and states[index] != (states[index - 1] if index else None)]
        # vertices, corners, faces, UVs: each in a call of its own before the call that makes its object
        assert len(touching) >= 4, (name, states)
        arrays = moge2_mesh.mesh_arrays(points, mask, discontinuity=discontinuity)
        assert 0 < len(arrays.quads) < (H - 1) * (W - 1)  # the hole cut faces: a mesh with gaps to compare
        got, expected = mesh_facts(obj.data), mesh_facts(one_call_mesh(f"before_{name}", arrays.vertices, arrays.quads,
                                                                        arrays.uv))
        for key in ("co", "uv", "edges"):
            np.testing.assert_array_equal(got[key], expected[key], err_msg=f"{name} {key}")
        assert got["faces"] == expected["faces"] and got["uv_layers"] == expected["uv_layers"] == ["UVMap"]
        texture = obj.data.materials[0].node_tree.nodes.active.image
        assert Path(bpy.path.abspath(texture.filepath)).name == f"{obj.name.removesuffix('_geometry')}.png"
    # one frame at a time: a frame's mesh is begun only once the frame before has its object
    begun = [next(index for index, made in enumerate(calls) if o.data.name in made) for o in objects]
    used = [next(index for index, made in enumerate(calls) if made.get(o.data.name, (0,))[-1] > 0) for o in objects]
    assert all(used[index] < begun[index + 1] for index in range(FRAMES - 1)), (begun, used)
    scene = bpy.context.scene
    assert (scene.frame_start, scene.frame_end) == (1, FRAMES)
    for frame in range(1, FRAMES + 1):  # the keys: each object shown (viewport and render) on its own frame only
        scene.frame_set(frame)
        shown = [(o.name, o.hide_viewport, o.hide_render) for o in objects if not (o.hide_viewport and o.hide_render)]
        assert shown == [(f"s_{frame:04d}_geometry", False, False)], (frame, shown)


@pytest.mark.parametrize("frames_done", [0, 1])
def test_esc_while_a_frames_mesh_is_half_made_leaves_nothing_of_the_shot(shot, model, frames_done):
    """Esc in the first frame's build, or in the second's after the first frame's object was made:
    the half-made mesh goes, and so does every finished frame (all or nothing)."""
    before = shot_checks.scene_state(bpy)

    def when():
        return half_made() and len([o for o in bpy.data.objects if o.type == "MESH"]) == frames_done

    seen = run_modal(shot, model, cancel_when=when)
    assert "cancelled_at" in seen, "a frame's mesh was never seen made in part"
    assert seen["state"] == {"CANCELLED"}
    assert shot_checks.scene_state(bpy) == before


def test_blenders_cancel_while_a_frames_mesh_is_half_made_leaves_nothing_of_the_shot(shot, model):
    before = shot_checks.scene_state(bpy)

    def when():
        return half_made() and any(o.type == "MESH" for o in bpy.data.objects)

    seen = run_modal(shot, model, stop_when=when)
    assert "stopped_at" in seen
    assert shot_checks.scene_state(bpy) == before


def test_a_failure_in_a_frames_last_step_leaves_nothing_of_the_shot(shot, model, monkeypatch):
    """Frame 2's keys refused after its first key, its mesh and the first frame were made: an ERROR
    naming the frame, the scene as it was, the action of the key made included."""
    real_key = shot_ops.key_visible_on

    def refused_on_frame_2(obj, number, previous, following):
        if number == 2:  # after its first key: the action is made
            obj.keyframe_insert("hide_viewport", frame=previous)
            raise RuntimeError("keys refused")
        real_key(obj, number, previous, following)

    monkeypatch.setattr(shot_ops, "key_visible_on", refused_on_frame_2)
    before = shot_checks.scene_state(bpy)
    with pytest.raises(RuntimeError, match=r"added nothing.*frame 2.*keys refused"):
        run_modal(shot, model)
    assert jobs.manager.last.state == "failed"
    assert shot_checks.scene_state(bpy) == before
