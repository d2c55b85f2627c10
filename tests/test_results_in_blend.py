"""Results belong to the .blend (issue 32): the four buttons run on photo.png shown in an Image
Editor, in a bpy 5.0.1 process of their own (tests/results_job.py); the .blend is saved and
reopened in a new process. Every result comes back with the same pixels, undo removes what a
button made and redo brings it back with its pixels, the editor shows the result, and paths
are stored `//`-relative.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

pytest.importorskip("bpy")

from builders_families import ben2_like_model, da3_like_model  # noqa: E402
from builders_moge2 import moge2_like_model  # noqa: E402
from onnx_builders import sr_model  # noqa: E402

JOB = Path(__file__).parent / "results_job.py"
RESULTS = ("photo_cutout", "photo_depth", "photo_normal", "photo_x2")
W, H = 40, 28


def photo_pixels(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (H, W, 4), dtype=np.uint8)
    pixels[..., 0] = np.maximum(pixels[..., 0], 60)  # MoGe-like model: red 0 is "no geometry"
    pixels[..., 3] = 255
    return pixels


def run_step(step: str, config: Path, root: Path) -> subprocess.CompletedProcess:
    env = bh.isolated_blender_env(root, pythonpath=[bh.package_search_dir(root / "pkg")])
    done = subprocess.run(
        [sys.executable, str(JOB), step, str(config)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    folder = root / "project"
    folder.mkdir()
    PILImage.fromarray(photo_pixels(1), "RGBA").save(folder / "photo.png")
    PILImage.fromarray(photo_pixels(2), "RGBA").save(folder / "room.png")
    PILImage.fromarray(photo_pixels(4), "RGBA").save(folder / "plate.png")
    models = root / "models"
    models.mkdir()
    paths = {
        "ben2": ben2_like_model(models / "ben2.onnx", size=64),
        "da3": da3_like_model(models / "da3.onnx", fixed_hw=(28, 42)),
        "moge2": moge2_like_model(models / "moge.onnx"),
        "sr": sr_model(models / "sr.onnx", scale=2),
    }
    config = folder / "config.json"
    config.write_text(json.dumps({"models": {k: str(v) for k, v in paths.items()}}))
    made = run_step("make", config, root)
    run_step("read", config, root)
    return {
        "made": json.loads((folder / "make.json").read_text()),
        "made_pixels": dict(np.load(folder / "make.npz")),
        "read": json.loads((folder / "read.json").read_text()),
        "read_pixels": dict(np.load(folder / "read.npz")),
        "output": made.stdout + made.stderr,
        "folder": folder,
    }


@pytest.mark.parametrize("name", [*RESULTS, "photo_cutout.001", "Lean Image AI Memory", "plate.png"])
def test_every_result_comes_back_with_its_pixels_after_save_and_reopen(session, name):
    assert name in session["read_pixels"], f"{name} was lost: {session['read']['images'].get(name)}"
    made, read = session["made_pixels"][name], session["read_pixels"][name]
    assert made.shape == read.shape
    np.testing.assert_array_equal(read, made)


def test_the_depth_plane_keeps_its_displacement(session):
    assert session["read"]["plane_image"] == "photo_depth"
    depth = session["read_pixels"]["photo_depth"]
    assert depth.std() > 0  # not the black image of a lost generated buffer
    np.testing.assert_array_equal(depth, session["made_pixels"]["photo_depth"])


def test_results_without_an_output_path_are_packed(session):
    for name in RESULTS:
        assert session["read"]["images"][name]["packed"], session["read"]["images"][name]


def test_a_saved_result_reads_the_file_it_wrote_relative_to_the_blend(session):
    image = session["read"]["images"]["photo_cutout.001"]
    assert image["source"] == "FILE" and image["filepath"] == "//cutout.png" and not image["packed"]
    written = np.asarray(PILImage.open(session["folder"] / "cutout.png").convert("RGBA"), np.float32) / 255
    read = session["read_pixels"]["photo_cutout.001"].reshape(H, W, 4)[::-1]
    np.testing.assert_allclose(read, written, atol=1e-6)


def test_a_source_replaced_in_place_keeps_its_file_and_gets_no_fake_user(session):
    plate = session["read"]["images"]["plate.png"]
    assert plate["filepath"] == "//plate.png" and plate["packed"] and plate["users"] == 1  # the editor
    original = np.asarray(PILImage.open(session["folder"] / "plate.png").convert("RGBA"), np.float32) / 255
    assert not np.array_equal(session["read_pixels"]["plate.png"].reshape(H, W, 4)[::-1], original)


def test_a_source_the_addon_loads_is_stored_relative(session):
    assert session["read"]["images"]["room.png"]["filepath"] == "//room.png"


def test_blend_relative_paths_are_accepted_without_a_warning(session):
    assert "blend relative" not in session["output"]


@pytest.mark.parametrize("name", RESULTS)
def test_undo_removes_the_result_and_redo_brings_its_pixels_back(session, name):
    assert session["made"]["buttons"][name]["after_undo"] is False
    np.testing.assert_array_equal(session["made_pixels"][f"{name}@redo"], session["made_pixels"][name])


@pytest.mark.parametrize("name", RESULTS)
def test_the_image_editor_that_showed_the_photo_shows_the_result(session, name):
    assert session["made"]["buttons"][name]["shown"] == name
    photo = session["read"]["images"]["photo.png"]
    assert photo["users"] >= 1  # still one click away in the image browser, also after reopening


def test_every_operator_path_property_takes_blend_relative_paths():
    bpy = pytest.importorskip("bpy")
    bh.import_package()
    from lean_image_ai import operators

    classes = operators._classes()
    with bh.registered_classes(classes):
        operators_rna = [
            getattr(bpy.ops.lean_image_ai, cls.bl_idname.split(".")[1]).get_rna_type()
            for cls in classes
            if issubclass(cls, bpy.types.Operator)
        ]
        paths = [
            (rna.identifier, prop.identifier, prop.is_path_supports_blend_relative)
            for rna in operators_rna
            for prop in rna.properties
            if getattr(prop, "subtype", "") in {"FILE_PATH", "DIR_PATH", "FILE_NAME"}
        ]
    assert len(paths) >= 10, paths  # the model operators' three, the sequence's, the shot's, ...
    assert [p for p in paths if not p[2]] == []


def test_a_result_saved_to_a_file_that_cannot_hold_it_is_packed_whatever_the_save_did(tmp_path, monkeypatch):
    """JPEG drops alpha and rounds: the datablock keeps its own pixels, packed, also where an
    older Blender's Image.save re-points the image at the file it wrote (no ``save_copy``)."""
    bpy = pytest.importorskip("bpy")
    bh.import_package()
    from lean_image_ai.operators import image_io, image_ops, jobs

    PILImage.fromarray(photo_pixels(3), "RGBA").save(tmp_path / "photo.png")
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    bh.reset_blender()
    with bh.registered_classes([*jobs.classes, *image_ops.classes]):
        bpy.ops.lean_image_ai.upscale(filepath=str(tmp_path / "photo.png"), model_path=str(model))
        monkeypatch.setattr(image_io, "_save_supports_copy", lambda: False)
        bpy.ops.lean_image_ai.upscale(
            filepath=str(tmp_path / "photo.png"), model_path=str(model), output_path=str(tmp_path / "x2.jpg")
        )
        unsaved, saved = bpy.data.images["photo_x2"], bpy.data.images["photo_x2.001"]
        assert (tmp_path / "x2.jpg").is_file()
        assert saved.packed_file is not None and unsaved.packed_file is not None
        np.testing.assert_array_equal(bh.read_pixels_bottom_up(saved), bh.read_pixels_bottom_up(unsaved))
    bh.reset_blender()
