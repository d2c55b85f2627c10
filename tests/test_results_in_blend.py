"""Results belong to the .blend (issue 32): the four buttons run on photo.png shown in an Image
Editor, in a bpy 5.0.1 process of their own (tests/results_job.py); the .blend is saved and
reopened in a new process. Every result comes back with the same pixels, undo removes what a
button made and redo brings it back with its pixels, the editor shows the result, and paths
are stored `//`-relative.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

pytest.importorskip("bpy")

import results_checks as rc  # noqa: E402
from onnx_builders import sr_model  # noqa: E402

JOB = Path(__file__).parent / "results_job.py"
photo_pixels = rc.photo_pixels


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
    config = rc.make_project(root)
    made = run_step("make", config, root)
    run_step("read", config, root)
    return rc.load_session(config.parent, made.stdout + made.stderr)


@pytest.mark.parametrize("name", rc.REOPENED)
def test_every_result_comes_back_with_its_pixels_after_save_and_reopen(session, name):
    rc.check_reopened_pixels(session, name)


def test_the_depth_plane_keeps_its_displacement(session):
    rc.check_depth_plane(session)


@pytest.mark.parametrize("name", rc.RESULTS)
def test_results_without_an_output_path_are_packed(session, name):
    rc.check_packed(session, name)


@pytest.mark.parametrize("name", ("photo_cutout", "photo_x2"))
def test_a_byte_result_is_packed_from_the_addons_png_not_by_blenders_pack(session, name):
    rc.check_packed_from_own_png(session, name)


def test_a_saved_result_reads_the_file_it_wrote_relative_to_the_blend(session):
    rc.check_saved_result_reads_its_file(session)


def test_a_source_replaced_in_place_keeps_its_file_and_gets_no_fake_user(session):
    rc.check_replaced_source(session)


def test_undo_after_replace_gives_back_the_source_pixels_and_redo_the_cut_out(session):
    rc.check_replace_undo_redo(session)


def test_a_source_the_addon_loads_is_stored_relative(session):
    rc.check_loaded_source_relative(session)


def test_blend_relative_paths_are_accepted_without_a_warning(session):
    rc.check_no_blend_relative_warning(session)


@pytest.mark.parametrize("name", rc.RESULTS)
def test_undo_removes_the_result_and_redo_brings_its_pixels_back(session, name):
    rc.check_undo_redo(session, name)


@pytest.mark.parametrize("name", rc.RESULTS)
def test_the_image_editor_that_showed_the_photo_shows_the_result(session, name):
    rc.check_shown(session, name)


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


def test_unregister_leaves_no_undo_handler_of_replace():
    bpy = pytest.importorskip("bpy")
    bh.import_package()
    from lean_image_ai.operators import image_ops, results

    image = bpy.data.images.new("replaced_here", 4, 4, alpha=True)
    try:
        results.remember_replaced(image)
        results.remember_replaced(image)  # a second Replace adds no second handler
        handlers = bpy.app.handlers
        assert handlers.undo_post.count(results._renew_replaced) == handlers.redo_post.count(results._renew_replaced) == 1
        image_ops.pre_unregister()
        assert results._renew_replaced not in handlers.undo_post and results._renew_replaced not in handlers.redo_post
    finally:
        bpy.data.images.remove(image)


def test_a_float_result_saved_to_a_png_is_packed_and_reads_back_its_pixels(tmp_path):
    """A float source's cut-out saved to an 8-bit PNG (which cannot hold it) is packed as a float EXR
    of its buffer, premultiplied: read again from the packed file (as after undo, redo or reopen)
    it gives the same pixels. Before, the new image's alpha mode said straight: Blender
    premultiplied the packed colour a second time."""
    bpy = pytest.importorskip("bpy")
    bh.import_package()
    from builders_families import ben2_like_model
    from lean_image_ai.operators import image_io, image_ops, jobs

    bh.reset_blender()
    height, width = rc.H, rc.W
    y, x = np.mgrid[0:height, 0:width].astype(np.float32) / width
    alpha = 0.25 + 0.75 * y
    plate = bpy.data.images.new("plate", width, height, alpha=True, float_buffer=True)
    plate.pixels.foreach_set(np.stack([2 * x * alpha, y * alpha, x * alpha, alpha], -1)[::-1].ravel().astype(np.float32))
    image_io.save_image_atomically(plate, tmp_path / "plate.exr", "OPEN_EXR")
    bpy.data.images.remove(plate)
    model = ben2_like_model(tmp_path / "ben2.onnx", size=64)
    with bh.registered_classes([*jobs.classes, *image_ops.classes]):
        bpy.ops.lean_image_ai.remove_background(
            filepath=str(tmp_path / "plate.exr"), model_path=str(model), output_path=str(tmp_path / "cutout.png")
        )
        image = bpy.data.images["plate_cutout"]
        assert image.is_float and image.packed_file is not None and (tmp_path / "cutout.png").is_file()
        made = image_io.image_to_array(image)
        assert made[..., 3].min() < 0.9  # the matte: premultiplying twice would show
        image.buffers_free()
        np.testing.assert_array_equal(image_io.image_to_array(image), made)
    bh.reset_blender()
