"""Shot options in real bpy 5.0.1 with the real onnxruntime: Process Sequence with one depth range
for the shot, Reconstruct Shot (one camera, a mesh per frame keyed to its frame), Preview Frame."""

from __future__ import annotations

import os
import sys
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
from builders_shot import background_mask, drifting_depth_model, write_shot  # noqa: E402
from lean_image_ai.operators import batch_ops, geometry_ops, jobs, shot_ops  # noqa: E402
from onnx_builders import sr_model  # noqa: E402
from test_moge2 import red_image  # noqa: E402

FRAMES = 6


@pytest.fixture(scope="module", autouse=True)
def registered():
    with bh.registered_classes([*jobs.classes, *geometry_ops.classes, *batch_ops.classes, *shot_ops.classes]):
        yield


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    yield from bh.fresh_blender(tmp_path, monkeypatch, make_models_dir=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("shot_models")
    return {
        "da3": drifting_depth_model(root / "drift.onnx"),
        "moge2": moge2_like_model(root / "moge2.onnx"),
        "upscale": sr_model(root / "sr.onnx", scale=2, mid_channels=4),
    }


def _greys(folder: Path) -> list[np.ndarray]:
    frames = []
    for path in sorted(folder.glob("*.png")):
        with PILImage.open(path) as image:
            frames.append(np.asarray(image).astype(np.int64))
    return frames


def test_process_sequence_with_one_depth_range_for_the_shot(tmp_path, models):
    shot = write_shot(tmp_path / "in", FRAMES, noise=False)
    background = background_mask(FRAMES)
    spreads = {}
    for mode in ("per-frame", "auto-shot"):
        out = tmp_path / mode
        result = bpy.ops.lean_image_ai.process_sequence(
            family="da3", source=str(shot), output=str(out / "d_####.png"), model_path=str(models["da3"]), depth_range=mode
        )
        assert result == {"FINISHED"}
        greys = _greys(out)
        assert len(greys) == FRAMES
        spreads[mode] = int(np.ptp([g[background] for g in greys], axis=0).max())
    assert spreads["auto-shot"] == 0 and spreads["per-frame"] > 20, spreads  # of 255: Blender writes 8-bit PNG


def test_process_sequence_refuses_align_depth_with_skip_existing(tmp_path, models):
    shot = write_shot(tmp_path / "in", 3, noise=False)
    with pytest.raises(RuntimeError, match=r"Align Depth \(--align-depth\) aligns each frame to the one before it"):
        bpy.ops.lean_image_ai.process_sequence(
            family="da3", source=str(shot), output=str(tmp_path / "o" / "d_####.png"), model_path=str(models["da3"]),
            align_depth=True, skip_existing=True,
        )
    assert not (tmp_path / "o").exists()


def _red_shot(folder: Path, count: int = 4) -> Path:
    return shot_checks.red_shot(folder, count)


@pytest.mark.parametrize("fov", [0.0, 40.0])
def test_reconstruct_shot_makes_one_camera_and_a_mesh_per_frame(tmp_path, models, fov):
    shot = _red_shot(tmp_path / "in")
    result = bpy.ops.lean_image_ai.reconstruct_shot(
        source=str(shot), model_path=str(models["moge2"]), shot_camera="shot", shot_fov=fov
    )
    assert result == {"FINISHED"}
    cameras = [o for o in bpy.data.objects if o.type == "CAMERA"]
    meshes = sorted((o for o in bpy.data.objects if o.type == "MESH"), key=lambda o: o.name)
    assert len(cameras) == 1 and len(meshes) == 4
    scene = bpy.context.scene
    assert scene.camera == cameras[0] and (scene.frame_start, scene.frame_end) == (1, 4)
    if fov:
        assert np.degrees(cameras[0].data.angle_x) == pytest.approx(fov, abs=1e-4)
    for frame in range(1, 5):
        scene.frame_set(frame)
        shown = [o.name for o in meshes if not o.hide_render and not o.hide_viewport]
        assert shown == [f"r_{frame:04d}_geometry"], (frame, shown)
    assert not list(tmp_path.glob("**/*.ply"))  # a shot in the .blend, not files


def test_a_shot_given_blend_relative_keeps_its_frames_relative(tmp_path, models):
    """`//` is the saved .blend's folder; the frames the meshes show are stored `//`-relative, so
    moving the project folder keeps them."""
    _red_shot(tmp_path / "in")
    bpy.ops.wm.save_as_mainfile(filepath=str(tmp_path / "shot.blend"))
    assert bpy.ops.lean_image_ai.reconstruct_shot(source="//in", model_path=str(models["moge2"])) == {"FINISHED"}
    frames = sorted(image.filepath_raw for image in bpy.data.images)
    assert frames == [f"//in{os.sep}r_{n:04d}.png" for n in range(1, 5)] or frames == [f"//in/r_{n:04d}.png" for n in range(1, 5)]


def test_cancelled_reconstruct_shot_leaves_no_data_of_its_own_and_keeps_the_users(tmp_path, models, monkeypatch):
    """Cancel after two frames: the meshes, objects, materials, textures and visibility actions it
    made are gone; an image of a frame the user had loaded before stays."""
    shot = _red_shot(tmp_path / "in")
    users_image = bpy.data.images.load(str(shot / "r_0002.png"))
    kinds = ("objects", "meshes", "materials", "images", "actions")
    before = {kind: set(getattr(bpy.data, kind).keys()) for kind in kinds}
    real_key, keyed = shot_ops.key_visible_on, []

    def key_then_cancel(obj, number, previous, following):
        real_key(obj, number, previous, following)
        keyed.append(number)
        if number == 2:
            jobs.manager.current.cancel()  # what Esc or the panel's Cancel does

    monkeypatch.setattr(shot_ops, "key_visible_on", key_then_cancel)
    result = bpy.ops.lean_image_ai.reconstruct_shot(source=str(shot), model_path=str(models["moge2"]), shot_fov=40.0)
    assert result == {"CANCELLED"} and keyed[:2] == [1, 2]
    after = {kind: set(getattr(bpy.data, kind).keys()) for kind in kinds}
    assert after == before, {kind: after[kind] - before[kind] for kind in kinds}
    assert bpy.data.images.get(users_image.name) == users_image


def test_preview_frame_shows_one_frame_and_writes_nothing(tmp_path, models):
    shot = write_shot(tmp_path / "in", 3, noise=False)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    bpy.context.scene.frame_set(2)
    result = bpy.ops.lean_image_ai.preview_frame(
        family="da3", source=str(shot), model_path=str(models["da3"]), depth_range="5:15"
    )
    assert result == {"FINISHED"}
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    image = bpy.data.images[shot_ops.PREVIEW_IMAGE]
    pixels = np.empty(image.size[0] * image.size[1] * 4, np.float32)
    image.pixels.foreach_get(pixels)
    grey = pixels.reshape(image.size[1], image.size[0], 4)[::-1, :, 0].copy()  # Blender stores bottom row first
    editor = next(a for a in bpy.data.screens["UV Editing"].areas if a.type == "IMAGE_EDITOR")
    with bpy.context.temp_override(screen=bpy.data.screens["UV Editing"]):  # a screen with an Image Editor
        shown = bpy.ops.lean_image_ai.preview_frame(family="upscale", source=str(shot), model_path=str(models["upscale"]))
    assert shown == {"FINISHED"} and editor.spaces.active.image == bpy.data.images[shot_ops.PREVIEW_IMAGE]
    assert bpy.data.images[shot_ops.PREVIEW_IMAGE].size[:] == (2 * 84, 2 * 56)  # the x2 model's frame 2
    direct = bpy.ops.lean_image_ai.preview_frame(
        family="da3", source=str(shot), model_path=str(models["da3"]), depth_range="per-frame", frame=2
    )
    assert direct == {"FINISHED"}
    image = bpy.data.images[shot_ops.PREVIEW_IMAGE]
    image.pixels.foreach_get(pixels)
    own = pixels.reshape(image.size[1], image.size[0], 4)[::-1, :, 0]
    assert own.min() == pytest.approx(0.0, abs=1e-6) and own.max() == pytest.approx(1.0, abs=1e-6)
    assert 0.0 < grey.min() and grey.max() < 1.0  # the given 5..15 range: depths 7.9..14.2 sit inside it
    with pytest.raises(RuntimeError, match="Frame 9 is not in the sequence"):
        bpy.ops.lean_image_ai.preview_frame(family="da3", source=str(shot), model_path=str(models["da3"]), frame=9)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # three previews, no file written


def test_two_frame_shots_write_both_frames_every_time(tmp_path, models):
    """A 2-frame shot fits in the frame queue: Blender's pump used to read it whole before the
    worker looked, and then nothing ran ('0 written ... of 2', FINISHED) in most tries."""
    shot = write_shot(tmp_path / "in", 2, noise=False)
    for attempt in range(20):
        out = tmp_path / f"o{attempt}"
        result = bpy.ops.lean_image_ai.process_sequence(
            family="da3", source=str(shot), output=str(out / "d_####.png"), model_path=str(models["da3"]),
            depth_range="auto-shot",
        )
        assert result == {"FINISHED"} and len(_greys(out)) == 2, (attempt, result)
        before = {o.name for o in bpy.data.objects}
        result = bpy.ops.lean_image_ai.reconstruct_shot(source=str(shot), model_path=str(models["moge2"]), shot_camera="shot")
        made = {o.name for o in bpy.data.objects} - before
        assert result == {"FINISHED"} and len([n for n in made if n.endswith("_geometry")]) == 2, (attempt, result, made)
        for name in made:
            bpy.data.objects.remove(bpy.data.objects[name])


def _scene_state() -> dict:
    return shot_checks.scene_state(bpy)


def test_a_shot_open_in_blender_as_a_sequence_from_1001_reads_every_frame(tmp_path, models):
    """Issue 32 item 4: with the sequence open (source SEQUENCE, the scene on frame 1, outside
    1001-1003) frame 1001's file matched the open datablock, which is empty on frame 1, and was
    refused as 'Blender cannot read ...'."""
    folder = tmp_path / "in"
    folder.mkdir()
    for n in (1001, 1002, 1003):
        PILImage.fromarray((red_image(30, 40) * 255).astype(np.uint8)).save(folder / f"r_{n:04d}.png")
    image = bpy.data.images.load(str(folder / "r_1001.png"))
    image.source = "SEQUENCE"
    assert bpy.context.scene.frame_current == 1
    assert bpy.ops.lean_image_ai.reconstruct_shot(image_name=image.name, model_path=str(models["moge2"])) == {"FINISHED"}
    meshes = sorted(o.name for o in bpy.data.objects if o.type == "MESH")
    assert meshes == [f"r_{n}_geometry" for n in (1001, 1002, 1003)]
    scene = bpy.context.scene
    assert (scene.frame_start, scene.frame_end) == (1001, 1003)
    textures = [i for i in bpy.data.images if i != image]
    assert len(textures) == 3 and all(t.source == "FILE" and t.size[0] == 40 for t in textures)
    assert image.source == "SEQUENCE"  # the user's datablock is untouched
    out = tmp_path / "out"
    assert bpy.ops.lean_image_ai.process_sequence(
        family="upscale", image_name=image.name, output=str(out) + "/", model_path=str(models["upscale"])
    ) == {"FINISHED"}
    assert len(list(out.glob("*.png"))) == 3
    from lean_image_ai.operators import sources

    picked = sources.resolve_source(bpy.context, str(folder / "r_1001.png"))  # the single-image buttons' path
    assert picked.image != image and tuple(picked.image.size) == (40, 30)


def test_a_shot_with_a_damaged_frame_leaves_the_scene_as_it_was_and_names_the_frame(tmp_path, models):
    """All or nothing: a CANCELLED Reconstruct Shot adds no mesh, camera or image and changes no
    frame range; the failed frame is named, with its error, in an ERROR (bpy raises it). Process
    Sequence writes the good frames, names the failed one and leaves nothing in the .blend.
    tests/shot_checks.py: the stock test runs the same in each Blender version."""
    shot = shot_checks.red_shot(tmp_path / "in", count=3, damaged=2)
    facts = shot_checks.shot_facts(bpy, shot, str(models["moge2"]), str(models["upscale"]), tmp_path / "out")
    shot_checks.check_reconstruct_shot(facts)
    shot_checks.check_process_sequence(facts)


def test_a_batch_whose_model_answered_no_frame_is_never_finished(tmp_path, models, monkeypatch):
    """'0 written ... of N' is not a success: a model side that returns without taking the frames
    (as the 2-frame shots once did) ends in an ERROR for both shot operators, nothing added."""
    from lean_image_ai.models.model_run import ModelRun
    from lean_image_ai.models.worker.remote_batch import IN_PROCESS_ENV

    shot = _red_shot(tmp_path / "in", count=3)
    monkeypatch.setenv(IN_PROCESS_ENV, "1")  # the model side patched here runs here
    monkeypatch.setattr(ModelRun, "infer", lambda self, frames, options=None: None)
    with pytest.raises(RuntimeError, match=r"0 written, 0 skipped, 0 failed of 3.*3 frame\(s\) were neither written"):
        bpy.ops.lean_image_ai.process_sequence(
            family="upscale", source=str(shot), output=str(tmp_path / "o" / "u_####.png"), model_path=str(models["upscale"])
        )
    before = _scene_state()
    with pytest.raises(RuntimeError, match="added nothing"):
        bpy.ops.lean_image_ai.reconstruct_shot(source=str(shot), model_path=str(models["moge2"]))
    assert _scene_state() == before
