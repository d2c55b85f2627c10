"""ui/panels.py and ui/settings.py with real bpy: the sidebar tab in both editors, the scene
settings passed to the operators, job progress, device/fallback warnings, the memory dashboard.

Panels are drawn with a recording stand-in layout (tests/recording_layout.py): background
Blender has no UI regions, so no real UILayout exists to draw into.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402
import onnx_builders as ob  # noqa: E402
import panel_listing as pl  # noqa: E402
from recording_layout import FakePanel, RecordingLayout  # noqa: E402

bpy = pytest.importorskip("bpy")
panels = bh.import_submodule("ui.panels")
panel_memory = bh.import_submodule("ui.panel_memory")
S = bh.import_submodule("ui.settings")
jobs = bh.import_submodule("operators.jobs")
from lean_image_ai.models import families  # noqa: E402
from lean_image_ai.models.adapters.upscale import DEFAULT_MODEL_PATH  # noqa: E402
from lean_image_ai.models.store import library  # noqa: E402
from lean_image_ai.models.store.catalog import Catalog, CatalogEntry  # noqa: E402
from lean_image_ai.models.worker import host_record  # noqa: E402
from lean_image_ai.models.worker.remote_batch import IN_PROCESS_ENV  # noqa: E402
from lean_image_ai.runtime import get_runtime  # noqa: E402

MAIN_PANELS = ("LEAN_IMAGE_AI_PT_image_editor", "LEAN_IMAGE_AI_PT_view3d")
MEMORY_PANELS = ("LEAN_IMAGE_AI_PT_image_editor_memory", "LEAN_IMAGE_AI_PT_view3d_memory")
DETAILS_PANELS = ("LEAN_IMAGE_AI_PT_image_editor_memory_details", "LEAN_IMAGE_AI_PT_view3d_memory_details")
MODEL_OPS = (
    "lean_image_ai.remove_background",
    "lean_image_ai.estimate_depth",
    "lean_image_ai.reconstruct_geometry",
    "lean_image_ai.upscale",
)


@pytest.fixture
def registered():
    with bh.registered_addon() as package:
        yield package


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    """An empty models folder for this test (nothing installed)."""
    path = tmp_path / "models"
    path.mkdir()  # a named models folder that is missing is an error
    monkeypatch.setenv(library.MODELS_DIR_ENV, str(path))
    return path


@pytest.fixture
def settings(registered):
    scene = bpy.context.scene
    scene.property_unset("lean_image_ai")  # back to the defaults
    yield scene.lean_image_ai
    scene.property_unset("lean_image_ai")


@pytest.fixture
def photo(settings):
    """photo.png on the active object's active Image Texture node: the image the buttons use."""
    image = bh.make_image("photo.png", 8, 8)
    obj, mesh, material = pl.put_on_active_object(bpy, image)
    yield image
    bpy.data.objects.remove(obj)
    bpy.data.meshes.remove(mesh)
    bpy.data.materials.remove(material)
    bpy.data.images.remove(image)


@pytest.fixture
def clean_jobs():
    saved = jobs.manager.current, jobs.manager.last
    jobs.manager.current = jobs.manager.last = None
    yield jobs.manager
    jobs.manager.current, jobs.manager.last = saved


@pytest.fixture
def runtime(monkeypatch):
    """This process's runtime: the panels show its sessions where jobs run here
    (LEAN_IMAGE_AI_IN_PROCESS); Blender's process has none otherwise (the worker's models are named
    from its status)."""
    monkeypatch.setenv(IN_PROCESS_ENV, "1")
    rt = get_runtime()
    rt.clear("test setup")
    panels.invalidate_memory_snapshot()
    yield rt
    rt.clear("test teardown")


def draw(panel_class) -> RecordingLayout:
    fake = FakePanel()
    panel_class.draw(fake, bpy.context)
    return fake.layout


# --- registration ----------------------------------------------------------------------------------


def test_panels_exist_in_both_editors_with_one_shared_draw(registered):
    spaces = {}
    for name in MAIN_PANELS + MEMORY_PANELS:
        cls = getattr(bpy.types, name)  # registered with Blender under its bl_idname
        assert cls.is_registered
        assert cls.bl_region_type == "UI" and cls.bl_category == "Lean Image AI"
        spaces[name] = cls.bl_space_type
    assert spaces == {
        "LEAN_IMAGE_AI_PT_image_editor": "IMAGE_EDITOR",
        "LEAN_IMAGE_AI_PT_view3d": "VIEW_3D",
        "LEAN_IMAGE_AI_PT_image_editor_memory": "IMAGE_EDITOR",
        "LEAN_IMAGE_AI_PT_view3d_memory": "VIEW_3D",
    }
    image, view3d = (getattr(panels, n) for n in MAIN_PANELS)
    image_mem, view3d_mem = (getattr(panels, n) for n in MEMORY_PANELS)
    assert image.draw is view3d.draw  # one draw function, not two copies
    assert image_mem.draw is view3d_mem.draw
    assert image_mem.bl_parent_id == image.bl_idname and view3d_mem.bl_parent_id == view3d.bl_idname
    assert image_mem.bl_label == "Memory"


def test_scene_settings_defaults_and_unregister(registered, models_dir):
    s = bpy.context.scene.lean_image_ai
    assert isinstance(s, S.LeanImageAISettings)
    assert (s.replace, s.make_plane, s.make_camera) == (False, False, True)
    assert s.resolution_level == 9 and s.tile_size == 0
    assert s.discontinuity == pytest.approx(0.04)
    props = S.LeanImageAISettings.bl_rna.properties
    assert (props["resolution_level"].hard_min, props["resolution_level"].hard_max) == (0, 9)
    assert props["tile_size"].hard_min == 0
    # nothing installed: the upscale menu still offers the built-in bicubic
    assert s.upscale_model == S.EMBEDDED_ID and s.ben2_model == S.NONE_ID
    registered.unregister()  # the fixture's second unregister is tolerated
    assert not hasattr(bpy.types.Scene, "lean_image_ai")
    assert not hasattr(bpy.context.scene, "lean_image_ai")


# --- the four actions ------------------------------------------------------------------------------


def test_buttons_pass_scene_settings_as_operator_properties(settings, models_dir, clean_jobs, runtime, photo):
    settings.replace = True
    settings.make_plane = True
    settings.resolution_level = 3
    settings.make_camera = False
    settings.discontinuity = 0.125
    settings.tile_size = 192
    settings.overlap = 40  # the family's option appears as a scene setting and a panel field
    for name in MAIN_PANELS:  # both editors draw the same buttons
        layout = draw(getattr(panels, name))
        buttons = {c.name: c for c in layout.calls("operator") if c.name in MODEL_OPS}
        assert set(buttons) == set(MODEL_OPS), name
        # no job running: the built-in upscaler runs, the others wait for a model to be installed
        assert [n for n, c in buttons.items() if c.enabled] == ["lean_image_ai.upscale"]
        props = {n: c.props for n, c in buttons.items()}
        assert props["lean_image_ai.remove_background"] == {"model_id": "", "model_path": "", "replace": True}
        assert props["lean_image_ai.estimate_depth"] == {"model_id": "", "model_path": "", "make_plane": True}
        geo = props["lean_image_ai.reconstruct_geometry"]
        assert (geo["resolution_level"], geo["make_camera"]) == (3, False)
        assert geo["discontinuity"] == pytest.approx(0.125)
        # nothing installed: the upscale default is the embedded bicubic, passed as a path
        assert props["lean_image_ai.upscale"] == {
            "model_id": "",
            "model_path": str(DEFAULT_MODEL_PATH),
            "tile_size": 192,
            "overlap": 40,
        }
        drawn = {c.name for c in layout.calls("prop")}
        assert {"upscale_model", "tile_size", "overlap", "replace"} <= drawn  # no menu without a model


def test_sequence_toggle_turns_every_button_into_a_sequence_job(settings, models_dir, clean_jobs, runtime):
    settings.use_sequence = True
    settings.sequence_source = "//plates/shot_####.exr"
    settings.sequence_frames = "1001-1010:2"
    settings.sequence_output = "//out/"
    settings.skip_existing = True
    settings.tile_size = 64
    layout = draw(panels.LEAN_IMAGE_AI_PT_image_editor)
    buttons = [c for c in layout.calls("operator") if c.name == "lean_image_ai.process_sequence"]
    assert [b.props["family"] for b in buttons] == list(families.IDS)
    assert not [c for c in layout.calls("operator") if c.name in MODEL_OPS]
    for button in buttons:
        assert (button.props["source"], button.props["frames"], button.props["output"]) == (
            "//plates/shot_####.exr",
            "1001-1010:2",
            "//out/",
        )
        assert button.props["skip_existing"] is True
    assert buttons[3].props["tile_size"] == 64
    drawn = {c.name for c in layout.calls("prop")}
    assert {"use_sequence", "sequence_source", "sequence_frames", "sequence_output", "skip_existing"} <= drawn


def test_sequence_box_has_the_shot_options_preview_and_one_camera(settings, models_dir, clean_jobs, runtime):
    settings.use_sequence = True
    settings.sequence_source = "//plates/shot_####.png"
    settings.depth_range = "auto-shot"
    settings.shot_camera = "shot"
    layout = draw(panels.LEAN_IMAGE_AI_PT_image_editor)
    assert {"depth_range", "align_depth", "shot_camera", "shot_fov"} <= {c.name for c in layout.calls("prop")}
    sequence = [c for c in layout.calls("operator") if c.name == "lean_image_ai.process_sequence"]
    # the depth range goes to the depth sequence only (test_panel_modes.py: per family)
    assert [b.props.get("depth_range") for b in sequence] == [None, "auto-shot", None, None]
    previews = [c for c in layout.calls("operator") if c.name == "lean_image_ai.preview_frame"]
    assert [b.props["family"] for b in previews] == list(families.IDS)
    assert previews[1].props["source"] == "//plates/shot_####.png"
    shots = [c for c in layout.calls("operator") if c.name == "lean_image_ai.reconstruct_shot"]
    assert len(shots) == 1 and shots[0].props["shot_camera"] == "shot"


def _tiny_file(path: Path, data: bytes = b"\x08\x08onnx-ish") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_model_menus_offer_installed_entries_only(settings, models_dir, tmp_path, monkeypatch, runtime):
    import hashlib

    data = b"model bytes"
    entries = [
        CatalogEntry(
            id=f"up-{n}",
            family="upscale",
            variant=n,
            title=f"Upscaler {n}",
            filename=f"up-{n}.onnx",
            url="http://127.0.0.1:9/x.onnx",
            size_bytes=len(data),
            sha256=None,
            license="MIT",
            source="test",
        )
        for n in ("a", "b", "c")
    ]
    # a checksum entry whose file is present but wrong: listed as not installed
    entries.append(
        CatalogEntry(
            id="ben-x",
            family="ben2",
            variant="x",
            title="BEN x",
            filename="ben-x.onnx",
            url=None,
            size_bytes=3,
            sha256=hashlib.sha256(b"abc").hexdigest(),
            license="MIT",
            source="test",
        )
    )
    catalog = Catalog(builtin=entries)
    monkeypatch.setattr(library, "catalog", lambda folder: catalog)
    _tiny_file(models_dir / "up-a.onnx", data)
    _tiny_file(models_dir / "up-c.onnx", data)
    _tiny_file(models_dir / "ben-x.onnx", b"xyz")  # right size, never verified

    menu = bh.import_submodule("ui.model_menu")
    items = menu.model_items("upscale", bpy.context)
    assert items is menu._model_items["upscale"]  # module-level list: Blender keeps the strings alive
    assert [i[0] for i in items] == ["up-a", "up-c", S.EMBEDDED_ID]
    assert len({i[4] for i in items}) == len(items)
    assert [i[0] for i in S.compute_model_items("ben2")] == ["ben-x"]  # present, unverified: usable
    assert [i[0] for i in S.compute_model_items("da3")] == [S.NONE_ID]

    # unset: the first installed entry, which is also what the operator's family default picks
    assert settings.upscale_model == "up-a"
    assert S.selected_model(settings, "upscale") == ("up-a", "")
    settings.upscale_model = "up-c"
    assert settings.upscale_model_id == "up-c"
    button = draw(panels.LEAN_IMAGE_AI_PT_view3d).operators("lean_image_ai.upscale")[0]
    assert (button.props["model_id"], button.props["model_path"]) == ("up-c", "")
    settings.upscale_model = S.EMBEDDED_ID
    assert S.selected_model(settings, "upscale") == ("", str(DEFAULT_MODEL_PATH))
    # a chosen model that disappears falls back to the first item instead of another model's number
    settings.upscale_model = "up-c"
    (models_dir / "up-c.onnx").unlink()
    assert settings.upscale_model == "up-a"
    with pytest.raises(TypeError):
        settings.upscale_model = "up-b"  # not installed: not offered


# --- job status ------------------------------------------------------------------------------------


def test_running_job_shows_progress_and_cancel_and_disables_actions(
    settings, models_dir, clean_jobs, runtime, photo
):
    job = jobs.BlenderJob("Upscale")
    job.report(0.25, "tile 3/12")
    clean_jobs.current = job
    layout = draw(panels.LEAN_IMAGE_AI_PT_image_editor)
    (bar,) = layout.calls("progress")
    assert bar.factor == pytest.approx(0.25) and "tile 3/12" in bar.text and "25%" in bar.text
    (cancel,) = layout.operators("lean_image_ai.cancel_job")
    assert cancel.enabled
    assert not any(c.enabled for c in layout.calls("operator") if c.name in MODEL_OPS)
    assert "Running: Upscale" in layout.texts()

    job.state, job.error_text = (
        "failed",
        "Out of GPU memory while running x.onnx on CUDA:0. Try a smaller tile size.",
    )
    clean_jobs.end(job)
    layout = draw(panels.LEAN_IMAGE_AI_PT_image_editor)
    assert not layout.calls("progress") and not layout.operators("lean_image_ai.cancel_job")
    assert "Last job: Upscale: failed" in layout.texts()
    assert job.error_text in layout.joined_text()
    assert any(c.alert for c in layout.calls("label") if "Out of GPU memory" in c.text)
    assert [c.name for c in layout.calls("operator") if c.name in MODEL_OPS and c.enabled] == ["lean_image_ai.upscale"]


# --- device and fallback warning -------------------------------------------------------------------


def test_cuda_fallback_shows_warning_row(settings, models_dir, clean_jobs, runtime, tmp_path):
    model = ob.conv_model(tmp_path / "conv.onnx", mid_channels=4)
    try:
        handle = runtime.session(model, "cuda")
    except Exception as exc:  # an onnxruntime build without the CUDA provider at all
        pytest.skip(f"CUDA cannot even be requested here: {exc}")
    if handle.providers[0] == "CUDAExecutionProvider":
        pytest.skip("a real GPU is present: CUDA does not fall back")
    assert handle.fallback_warning and "CUDA was requested" in handle.fallback_warning
    layout = draw(panels.LEAN_IMAGE_AI_PT_view3d)
    assert "Device setting: auto" in layout.texts()
    assert f"conv.onnx: {handle.device_label}" in layout.texts()
    warning = [c for c in layout.calls("label") if c.alert and c.icon == "ERROR"]
    assert warning and "CUDA was requested for conv.onnx" in warning[0].text
    assert handle.fallback_warning in layout.joined_text()

    runtime.evict(handle, "test")
    layout = draw(panels.LEAN_IMAGE_AI_PT_view3d)
    assert "No model loaded." in layout.texts()
    assert not [c for c in layout.calls("label") if c.alert]


# --- memory dashboard ------------------------------------------------------------------------------


def test_memory_dashboard_after_a_real_release(settings, models_dir, clean_jobs, runtime, tmp_path):
    model = ob.conv_model(tmp_path / "conv.onnx", mid_channels=8)
    with runtime.operation("dashboard test") as op:
        handle = op.session(model, "cpu")
        op.run(handle, {"x": np.ones((1, 3, 64, 64), np.float32)}, last=True)
    assert op.release_events
    host_record.job_figures(runtime.last_timeline, runtime.last_job_memory)  # as a job run here hands them over
    for name in MEMORY_PANELS:
        layout = draw(getattr(panels, name))
        text = layout.texts()
        rss = [t for t in text if t.startswith("Blender process memory (RSS): ")]
        assert rss and rss[0].endswith(" MiB")
        gpu = layout.joined_text()
        assert "GPU memory: not readable (" in gpu or ("GPU 0: " in gpu and "This process on the GPU" in gpu)
        assert not [t for t in text if " -> " in t]
        assert "Models loaded: 1" in text
        assert any(t.startswith("conv.onnx: CPU") for t in text)
        (release,) = layout.operators("lean_image_ai.release_memory")
        (unload,) = layout.operators("lean_image_ai.unload_all")
        assert release.enabled and unload.enabled
    for name in DETAILS_PANELS:
        layout = draw(getattr(panels, name))
        text = layout.texts()
        # the last job in the same words as the CLI and the event log, wrapped for the sidebar
        assert " ".join(" ".join(op.memory["lines"]).split()) in " ".join(layout.joined_text().split())
        assert any(t.startswith("    CPUExecutionProvider, used ") for t in text)
        (leak_check,) = [c for c in layout.calls("operator_menu_enum") if c.name == "lean_image_ai.leak_check"]
        assert leak_check.props == {"property": "family"}  # a family to check, chosen from the menu
        assert layout.operators("lean_image_ai.open_log_folder")
        # the memory picture: its caption in words, and the button that shows it
        assert "marks: 1 run(s) orange, release red, before/after grey" in text
        assert layout.operators("lean_image_ai.show_memory_plot")


def test_memory_dashboard_with_recorded_nvml_figures(settings, models_dir, clean_jobs, runtime, monkeypatch):
    """No GPU here: nvmlDeviceGetName/nvmlDeviceGetMemoryInfo as recorded on an idle H200 (this
    session's device machine); no process of ours held a context there, so NVML listed none."""
    recorded = {"rss_bytes": 900 << 20, "gpu": {"available": True, "device_id": 0, "name": "NVIDIA H200",
                "total_bytes": 150754820096, "used_bytes": 644939776, "free_bytes": 150109880320,
                "process_used_bytes": None}}
    monkeypatch.setattr(panel_memory, "memory_snapshot", lambda gpu=None: recorded)
    panels.invalidate_memory_snapshot()
    text = draw(panels.LEAN_IMAGE_AI_PT_view3d_memory).texts()
    assert "GPU 0: NVIDIA H200" in text and "This process on the GPU: n/a" in text
    assert "Used 615 MiB of 143771 MiB, free 143156 MiB" in text


def test_memory_dashboard_without_nvml_is_one_readable_line(settings, models_dir, clean_jobs, runtime, monkeypatch):
    missing = {"rss_bytes": 1 << 30, "gpu": {"available": False, "error": "NVMLError_LibraryNotFound: NVML Shared Library Not Found"}}
    monkeypatch.setattr(panel_memory, "memory_snapshot", lambda gpu=None: missing)
    panels.invalidate_memory_snapshot()
    text = draw(panels.LEAN_IMAGE_AI_PT_view3d_memory).texts()
    assert "GPU memory: not readable (no NVIDIA driver)" in text and "Jobs run as usual." in text
    assert not [t for t in text if "NVMLError" in t]


def test_memory_snapshot_is_cached_for_a_second(runtime, monkeypatch):
    calls = []
    real = panel_memory.memory_snapshot

    def counting(gpu_device_id=None):
        calls.append(gpu_device_id)
        return real(gpu_device_id)

    monkeypatch.setattr(panel_memory, "memory_snapshot", counting)
    first = panels.cached_memory_snapshot(0, now=100.0)
    assert panels.cached_memory_snapshot(0, now=100.9) is first
    assert calls == [0]
    assert panels.cached_memory_snapshot(0, now=101.0) is not first
    panels.cached_memory_snapshot(1, now=101.1)  # another device is another query
    assert calls == [0, 0, 1]
    assert "rss_bytes" in first and "gpu" in first


def test_drawing_never_raises(settings, models_dir, clean_jobs, monkeypatch):
    def broken():
        raise RuntimeError("runtime exploded")

    monkeypatch.setattr(panel_memory, "loaded_sessions", broken)
    monkeypatch.setattr(panel_memory, "memory_snapshot", lambda gpu=None: 1 / 0)
    panels.invalidate_memory_snapshot()
    for name in MAIN_PANELS + MEMORY_PANELS + DETAILS_PANELS:
        layout = draw(getattr(panels, name))  # must not raise
        errors = [c.text for c in layout.calls("label") if c.icon == "ERROR"]
        assert errors, name
    main = draw(panels.LEAN_IMAGE_AI_PT_view3d)
    assert "Device unavailable: RuntimeError: runtime exploded" in main.texts()
    assert len(main.operators("lean_image_ai.upscale")) == 1  # the other sections still drew
    memory = draw(panels.LEAN_IMAGE_AI_PT_view3d_memory)
    assert any(t.startswith("Memory stats unavailable: ") for t in memory.texts())
