"""The N-panel per mode, as an artist reads it (issue 32, item 7): each task's box lists only the
options its button uses in that mode, once titled, with a labelled model menu and a button that
names its image and says why it cannot run. Drawn in real bpy into the recording layout
(tests/recording_layout.py); tests/panel_listing.py turns a drawing into the text listing."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402
import panel_listing as pl  # noqa: E402
from panel_listing import boxes, listing, main_button, props  # noqa: E402
from recording_layout import FakePanel  # noqa: E402

bpy = pytest.importorskip("bpy")
panels = bh.import_submodule("ui.panels")
S = bh.import_submodule("ui.settings")
jobs = bh.import_submodule("operators.jobs")
from lean_image_ai.models import families  # noqa: E402
from lean_image_ai.models.adapters import shot_depth  # noqa: E402
from lean_image_ai.models.store import library  # noqa: E402
from lean_image_ai.models.store.catalog import Catalog, CatalogEntry  # noqa: E402

WITHOUT_FALLBACK = [f.id for f in families.ALL if f.fallback_model is None]  # their buttons need an installed model
from lean_image_ai.models.worker import host_record  # noqa: E402
from lean_image_ai.runtime import get_runtime  # noqa: E402


@pytest.fixture
def settings(tmp_path, monkeypatch):
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    monkeypatch.setenv(library.MODELS_DIR_ENV, str(models_dir))
    bh.reset_blender()
    saved = jobs.manager.current, jobs.manager.last
    jobs.manager.current = jobs.manager.last = None
    with bh.registered_addon():
        yield bpy.context.scene.lean_image_ai
    jobs.manager.current, jobs.manager.last = saved
    bh.reset_blender()


@pytest.fixture
def installed(settings, tmp_path, monkeypatch):
    """One installed model per family that needs a download (upscale has its built-in one)."""
    data = b"model bytes"
    entries = [
        CatalogEntry(
            id=f"{family}-test", family=family, variant="t", title=f"{family} test model",
            filename=f"{family}-test.onnx", url=None, size_bytes=len(data), sha256=None,
            license="MIT", source="test",
        )
        for family in WITHOUT_FALLBACK
    ]
    monkeypatch.setattr(library, "catalog", lambda folder: Catalog(builtin=entries))
    for entry in entries:
        (tmp_path / "models" / entry.filename).write_bytes(data)
    return settings


@pytest.fixture
def photo(settings):
    image = bh.make_image("photo.png", 8, 8)
    pl.put_on_active_object(bpy, image)
    return image


def draw(panel=None):
    fake = FakePanel()
    (panel or panels.LEAN_IMAGE_AI_PT_view3d).draw(fake, bpy.context)
    return fake.layout


def print_listing(title, layout):  # shown with pytest -s: the listing for the notes
    print(f"\n--- {title} ---\n" + "\n".join(listing(layout)))


# --- single image ---------------------------------------------------------------------------------


def test_single_image_mode_shows_each_task_with_its_own_options_only(installed, photo):
    layout = draw()
    print_listing("3D Viewport, single image", layout)
    pl.check_single_image(pl.mode_facts(layout), "photo.png")
    texts = [c.text for c in layout.log if c.kind == "operator"]
    assert "Upscale photo.png" in texts and "Remove Background from photo.png" in texts


def test_one_title_per_box_never_repeated_by_a_label_or_the_button(installed, photo):
    layout = draw()
    labels = [c.text for c in layout.calls("label")]
    for family_id, calls in boxes(layout).items():
        title = families.get(family_id).panel_heading
        assert labels.count(title) == 1
        said = [c.text for c in calls if c.kind == "label"]
        assert main_button(calls).text not in said and families.get(family_id).action not in said


def test_no_model_installed_disables_the_button_and_says_why(settings, photo):
    per_family = boxes(draw())
    for family_id in WITHOUT_FALLBACK:
        calls = per_family[family_id]
        assert not main_button(calls).enabled
        assert "No model installed" in [c.text for c in calls if c.kind == "label"]
        (get,) = [c for c in calls if c.kind == "operator" and c.name == "preferences.addon_show"]
        assert get.enabled and get.props["module"] == panels.ADDON_MODULE
        assert f"{family_id}_model" not in props(calls)  # no menu of one "No model installed" item
    assert main_button(per_family["upscale"]).enabled  # the built-in model needs no download


def test_no_image_disables_the_buttons_and_says_where_to_get_one(installed):
    for family_id, calls in boxes(draw()).items():
        assert not main_button(calls).enabled, family_id
        assert panels.NO_IMAGE["VIEW_3D"] in [c.text for c in calls if c.kind == "label"]


# --- sequence -------------------------------------------------------------------------------------


def test_sequence_mode_hides_what_the_sequence_operators_never_read(installed, photo):
    installed.use_sequence = True
    installed.sequence_source = "//plates/shot_####.png"
    layout = draw()
    print_listing("3D Viewport, Sequence", layout)
    pl.check_sequence(pl.mode_facts(layout), "shot_####.png")
    shots = layout.operators("lean_image_ai.reconstruct_shot")
    assert len(shots) == 1 and shots[0].props["shot_camera"] == installed.shot_camera


def test_depth_range_is_a_menu_and_given_numbers_reach_the_operator_as_text(installed, photo):
    installed.use_sequence = True
    installed.sequence_source = "//plates/shot_####.exr"
    rna = S.LeanImageAISettings.bl_rna.properties["depth_range"]
    assert rna.type == "ENUM"
    assert [i.name for i in rna.enum_items] == ["Per Frame", "Auto for the Shot", "Given"]
    installed.depth_range = "auto-shot"
    (depth,) = [c for c in draw().operators("lean_image_ai.process_sequence") if c.props["family"] == "da3"]
    assert depth.props["depth_range"] == "auto-shot"

    installed.depth_range = "given"
    installed.depth_black, installed.depth_white = 0.5, 40.0
    calls = boxes(draw())["da3"]
    assert props(calls) == ["da3_model", "depth_range", "depth_black", "depth_white", "align_depth"]
    button = main_button(calls)
    assert button.props["depth_range"] == "0.5:40" and button.enabled
    choice = shot_depth.parse_depth_range(button.props["depth_range"])  # what the operator reads
    assert (choice.mode, choice.given) == (shot_depth.GIVEN, (0.5, 40.0))

    installed.depth_black = 50.0  # white nearer than black: the operator would refuse it
    calls = boxes(draw())["da3"]
    assert not main_button(calls).enabled
    assert "Black At must be nearer than White At" in [c.text for c in calls if c.kind == "label"]


# --- words ----------------------------------------------------------------------------------------


def test_every_setting_has_a_tooltip_in_an_artists_words(settings):
    for prop in S.LeanImageAISettings.bl_rna.properties:
        if prop.identifier in ("rna_type", "name") or prop.is_hidden:
            continue
        text = prop.description
        assert text, f"{prop.identifier} has no tooltip"
        assert "receptive" not in text and not re.search(r"\w+/\w+\.py", text), (prop.identifier, text)
    register = bpy.ops.lean_image_ai.register_user_model.get_rna_type().description
    assert register and not re.search(r"\w+/\w+\.py", register), register
    for family in families.ALL:  # menus and the preferences list them side by side
        assert family.title[0].isupper(), family.title


def test_memory_lines_stay_short_and_the_details_keep_the_report(settings, tmp_path):
    import numpy as np
    import onnx_builders as ob

    runtime = get_runtime()
    runtime.clear("test setup")
    model = ob.conv_model(tmp_path / "conv.onnx", mid_channels=8)
    try:
        with runtime.operation("memory lines test") as op:
            handle = op.session(model, "cpu")
            op.run(handle, {"x": np.ones((1, 3, 64, 64), np.float32)}, last=True)
        host_record.job_figures(runtime.last_timeline, runtime.last_job_memory)  # as the worker's reply hands them
        assert max(len(line) for line in op.memory["lines"]) > 60  # the report itself is long
        for panel in (panels.LEAN_IMAGE_AI_PT_view3d_memory, panels.LEAN_IMAGE_AI_PT_image_editor_memory_details):
            layout = draw(panel)
            print_listing(panel.bl_label, layout)
            long = [t for t in layout.texts() if len(t) > 60]
            assert not long, long
        details = draw(panels.LEAN_IMAGE_AI_PT_view3d_memory_details).joined_text().split()
        assert " ".join(" ".join(op.memory["lines"]).split()) in " ".join(details)  # every word, in order
    finally:
        runtime.clear("test teardown")
