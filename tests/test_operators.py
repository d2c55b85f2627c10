"""The image operators (remove_background, estimate_depth, upscale) with real bpy 5.0.1 in
background mode, small contract ONNX models and the real onnxruntime.

`bpy.ops.lean_image_ai.<op>(...)` runs `execute` synchronously here (no UI). An operator that
reports an ERROR makes the bpy.ops call raise RuntimeError with the message, which is how the
error tests read what the user would see. Expected results come from calling the models layer
directly on the same pixels.
"""

from __future__ import annotations

import re
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

from builders_families import ben2_like_model, da3_like_model  # noqa: E402
from builders_upscale import resize_model  # noqa: E402
from lean_image_ai.models.adapters import ben2, da3, upscale  # noqa: E402
from lean_image_ai.models.base import RunOptions  # noqa: E402
from lean_image_ai.models.imaging import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402
from lean_image_ai.models.store import catalog, library  # noqa: E402
from lean_image_ai.models.worker import host_record  # noqa: E402
from lean_image_ai.operators import geometry_ops, image_io, image_ops, jobs  # noqa: E402
from lean_image_ai.runtime import Runtime  # noqa: E402
from onnx_builders import sr_model  # noqa: E402

W, H = 48, 32  # not square, not a tile multiple: catches width/height mix-ups
IMAGENET = {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}


@pytest.fixture(scope="module", autouse=True)
def registered():
    with bh.registered_classes([*jobs.classes, *image_ops.classes, *geometry_ops.classes]):
        yield


@pytest.fixture(autouse=True)
def clean_blender(tmp_path, monkeypatch):
    yield from bh.fresh_blender(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("op_models")
    return {
        "ben2": ben2_like_model(root / "ben2.onnx", size=64),
        "ben2_nan": ben2_like_model(root / "ben2_nan.onnx", size=64, output="nan"),
        "da3": da3_like_model(root / "da3.onnx", fixed_hw=(28, 42)),
        "sr": sr_model(root / "sr.onnx", scale=2),
        "nearest2": resize_model(root / "nearest2.onnx", factor=2.0),
    }


@pytest.fixture
def private_runtime():
    runtime = Runtime()
    yield runtime
    runtime.clear("test teardown")


def source_pixels(seed=3, *, alpha=True):
    """(H, W, 4) uint8 RGBA, top row first: a smooth gradient plus noise, partial alpha."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W].astype(np.float32)
    rgb = np.stack([x / W, y / H, 0.5 + 0.3 * np.sin(x / 5)], axis=-1) * 200 + rng.random((H, W, 3)) * 40
    a = np.where(x < W // 2, 255, 128) if alpha else np.full((H, W), 255)
    return np.concatenate([rgb, a[..., None]], axis=-1).clip(0, 255).astype(np.uint8)


def write_png(path, pixels) -> Path:
    PILImage.fromarray(pixels, "RGBA").save(path)
    return Path(path)


def counts():
    return len(bpy.data.images), len(bpy.data.objects), len(bpy.data.meshes), len(bpy.data.textures)


def releases_since(mark):
    return [e for e in host_record.events.recent("memory_release") if e["time"] >= mark]


def release_mark():
    """Now, by the events' clock (a count would stall once the bounded event buffer is full)."""
    return time.time()


# --- remove_background ------------------------------------------------------------------------


def test_remove_background_from_file_makes_cutout(tmp_path, models, private_runtime):
    pixels = source_pixels()
    src = write_png(tmp_path / "photo.png", pixels)
    out = tmp_path / "cut.png"
    mark = release_mark()

    result = bpy.ops.lean_image_ai.remove_background(
        filepath=str(src), model_path=str(models["ben2"]), output_path=str(out)
    )

    assert result == {"FINISHED"}
    # the file-loaded source was only read: the cut-out is the one new image
    assert [im.name for im in bpy.data.images] == ["photo_cutout"]
    image = bpy.data.images["photo_cutout"]
    assert tuple(image.size) == (W, H) and not image.is_float and image.channels == 4
    got = image_io.image_to_array(image)
    expected = ben2.run(
        pixels,
        models["ben2"],
        options=RunOptions(runtime=private_runtime),
        input_size=(1024, 1024),
        **IMAGENET,
    )
    assert np.abs(got[..., 3] - expected.rgba[..., 3]).max() <= 1 / 255 + 1e-6
    # the source alpha is multiplied in: the half-transparent right half stays at most half
    assert got[:, W // 2 :, 3].max() <= 0.51 and got[:, : W // 2, 3].max() > 0.6
    assert np.abs(got[..., :3] - pixels[..., :3] / 255).max() <= 1e-6  # colour untouched
    assert releases_since(mark)[-1]["reason"] == "operation_complete"
    saved = np.asarray(PILImage.open(out).convert("RGBA"))
    assert saved.shape == (H, W, 4)
    assert np.abs(saved[..., 3] / 255 - got[..., 3]).max() <= 1 / 255 + 1e-6


def test_remove_background_replace_in_image_editor(models):
    pixels = source_pixels(alpha=False).astype(np.float32) / 255
    image = bh.make_image("editor", W, H, pixels=pixels)
    window = bpy.context.window_manager.windows[0]
    area = window.screen.areas[0]
    area.type = "IMAGE_EDITOR"
    area.spaces.active.image = image
    before = counts()

    with bpy.context.temp_override(window=window, area=area):
        result = bpy.ops.lean_image_ai.remove_background(model_path=str(models["ben2"]), replace=True)

    assert result == {"FINISHED"}
    assert counts() == before  # written into the editor's image, nothing new
    got = image_io.image_to_array(image)
    assert got[..., 3].min() < 0.9  # the matte went into its alpha
    assert np.abs(got[..., :3] - pixels[..., :3]).max() <= 1 / 255


def test_source_image_removed_while_the_job_ran_is_a_clear_error(models, monkeypatch):
    from lean_image_ai.operators import model_job

    pixels = source_pixels(alpha=True).astype(np.float32) / 255
    image = bh.make_image("editor", W, H, pixels=pixels)
    window = bpy.context.window_manager.windows[0]
    area = window.screen.areas[0]
    area.type = "IMAGE_EDITOR"
    area.spaces.active.image = image
    shape = model_job.ModelJobOperator.shape

    def shape_then_the_artist_deletes_the_image(self, inputs, result, report):
        bpy.data.images.remove(inputs.source)  # what deleting it in the UI during the job does
        return shape(self, inputs, result, report)

    monkeypatch.setattr(model_job.ModelJobOperator, "shape", shape_then_the_artist_deletes_the_image)
    with bpy.context.temp_override(window=window, area=area):
        with pytest.raises(RuntimeError, match="Image 'editor' was removed while the job ran; nothing was changed"):
            bpy.ops.lean_image_ai.remove_background(model_path=str(models["ben2"]), replace=True)
    assert counts() == (0, 0, 0, 0)


# --- estimate_depth ---------------------------------------------------------------------------


def test_estimate_depth_from_texture_node_with_plane(tmp_path, models, private_runtime):
    pixels = source_pixels()
    image = bh.make_image("tex", W, H, pixels=pixels.astype(np.float32) / 255)
    mesh = bpy.data.meshes.new("holder")
    obj = bpy.data.objects.new("holder", mesh)
    bpy.context.scene.collection.objects.link(obj)
    bpy.context.view_layer.objects.active = obj
    material = bpy.data.materials.new("mat")
    if not material.node_tree:
        material.use_nodes = True
    node = material.node_tree.nodes.new("ShaderNodeTexImage")
    node.image = image
    material.node_tree.nodes.active = node
    obj.data.materials.append(material)
    out = tmp_path / "depth.png"

    result = bpy.ops.lean_image_ai.estimate_depth(
        model_path=str(models["da3"]), make_plane=True, output_path=str(out)
    )

    assert result == {"FINISHED"}
    depth_image = bpy.data.images["tex_depth"]
    assert depth_image.is_float and depth_image.colorspace_settings.name == "Non-Color"
    assert tuple(depth_image.size) == (W, H)
    got = image_io.image_to_array(depth_image)
    expected = da3.run(
        pixels,
        models["da3"],
        options=RunOptions(runtime=private_runtime),
        process_res=504,
        multiple=14,
        **IMAGENET,
    ).depth
    for channel in range(3):
        np.testing.assert_allclose(got[..., channel], expected, rtol=1e-5, atol=1e-5)
    assert np.all(got[..., 3] == 1.0)
    assert PILImage.open(out).size == (W, H)

    plane = bpy.data.objects["tex_depth_plane"]
    assert plane.dimensions.x / plane.dimensions.y == pytest.approx(W / H, rel=1e-3)
    modifier = plane.modifiers["Depth"]
    assert modifier.type == "DISPLACE" and modifier.texture_coords == "UV"
    assert modifier.texture.image == depth_image
    evaluated = plane.evaluated_get(bpy.context.evaluated_depsgraph_get()).to_mesh()
    z = np.empty(len(evaluated.vertices) * 3, np.float32)
    evaluated.vertices.foreach_get("co", z)
    relief = np.ptp(z.reshape(-1, 3)[:, 2])
    plane.evaluated_get(bpy.context.evaluated_depsgraph_get()).to_mesh_clear()
    # the nearest depth stands PLANE_RELIEF * PLANE_SIZE out of the plane (sampled at vertices)
    assert 0.25 < relief <= geometry_ops.PLANE_RELIEF * geometry_ops.PLANE_SIZE + 1e-4


def test_estimate_depth_uses_installed_catalog_model(clean_blender, tmp_path, models):
    """Family default: the first installed catalog entry, with its settings."""
    entry = catalog.Catalog().get("da3-metric-large")  # no size/sha256 known: a present file counts
    (clean_blender / entry.filename).write_bytes(Path(models["da3"]).read_bytes())
    src = write_png(tmp_path / "p.png", source_pixels())

    result = bpy.ops.lean_image_ai.estimate_depth(filepath=str(src))

    assert result == {"FINISHED"}
    assert "p_depth" in bpy.data.images


def test_user_model_counts_as_installed(clean_blender, tmp_path, models):
    user_catalog = catalog.Catalog()
    user_catalog.add_user_model("upscale", models["sr"], title="My SR")
    user_catalog.save_user_models(clean_blender / library.USER_MODELS_FILE)
    choice = library.resolve("upscale", clean_blender)
    assert choice.title == "My SR" and Path(choice.path) == Path(models["sr"]).resolve()


# --- upscale ----------------------------------------------------------------------------------


def test_upscale_byte_image_from_file(tmp_path, models):
    """A nearest-neighbour x2 model: the result must be the source pixels, each repeated 2x2,
    colour and alpha alike (byte in, byte out, straight alpha, no colour conversion drift)."""
    pixels = source_pixels()
    src = write_png(tmp_path / "small.png", pixels)
    out = tmp_path / "big.png"

    result = bpy.ops.lean_image_ai.upscale(
        filepath=str(src), model_path=str(models["nearest2"]), output_path=str(out), tile_size=40
    )

    assert result == {"FINISHED"}
    assert [im.name for im in bpy.data.images] == ["small_x2"]
    image = bpy.data.images["small_x2"]
    assert tuple(image.size) == (2 * W, 2 * H) and not image.is_float
    got = image_io.image_to_array(image)
    expected = np.repeat(np.repeat(pixels, 2, axis=0), 2, axis=1) / 255
    assert np.abs(got - expected).max() <= 1 / 255 + 1e-6
    saved = np.asarray(PILImage.open(out).convert("RGBA"))
    assert saved.shape == (2 * H, 2 * W, 4)
    assert np.abs(saved.astype(int) - np.round(expected * 255).astype(int)).max() <= 1


def test_upscale_reads_the_model_scale(tmp_path, models, private_runtime):
    src = write_png(tmp_path / "s.png", source_pixels())
    assert bpy.ops.lean_image_ai.upscale(filepath=str(src), model_path=str(models["sr"])) == {"FINISHED"}
    got = image_io.image_to_array(bpy.data.images["s_x2"])
    expected = upscale.run(source_pixels(), models["sr"], options=RunOptions(runtime=private_runtime)).image
    assert got.shape == (2 * H, 2 * W, 4)
    assert np.abs(got - expected).max() <= 1 / 255 + 1e-6


def test_upscale_float_image_keeps_linear_colour():
    """Default model (the embedded bicubic x2; nothing installed), float source: the result is a
    float image in the same linear encoding, so a smooth gradient keeps its values."""
    y, x = np.mgrid[0:H, 0:W].astype(np.float32)
    linear = np.stack([x / W, y / H, np.full_like(x, 0.2), np.ones_like(x)], axis=-1) ** 2.2
    image = bh.make_image("lin", W, H, float_buffer=True, pixels=linear)
    window = bpy.context.window_manager.windows[0]
    area = window.screen.areas[0]
    area.type = "IMAGE_EDITOR"
    area.spaces.active.image = image

    with bpy.context.temp_override(window=window, area=area):
        result = bpy.ops.lean_image_ai.upscale()

    assert result == {"FINISHED"}
    big = bpy.data.images["lin_x2"]
    assert big.is_float and tuple(big.size) == (2 * W, 2 * H)
    got = image_io.image_to_array(big)
    # compare away from the border (bicubic overshoot there); a missing sRGB->linear step would be
    # off by ~0.2 in the mid-tones
    inner = got[8:-8:2, 8:-8:2, :3]
    np.testing.assert_allclose(inner, linear[4:-4, 4:-4, :3], atol=0.03)
    assert np.all(got[..., 3] == 1.0)


# --- errors: clear message, nothing changed ---------------------------------------------------


@pytest.mark.parametrize("op", ["remove_background", "estimate_depth", "reconstruct_geometry", "upscale"])
def test_no_source_image_is_a_clear_error(op):
    """Said first, even with no model installed (the more basic problem)."""
    before = counts()
    with pytest.raises(RuntimeError, match="Open an image in the Image Editor, select an Image Texture node"):
        getattr(bpy.ops.lean_image_ai, op)()
    assert counts() == before


@pytest.mark.parametrize(
    "op, model_id, expected",
    [
        (
            "remove_background",
            "",
            r"No BEN2 background removal model is installed\. Install one in "
            r"Preferences > Add-ons > Lean Image AI \(for example 'BEN2",
        ),
        (
            "estimate_depth",
            "da3-metric-large",
            r"Model 'Depth Anything 3 Metric Large \(fixed 280x504\)' "
            r"\(da3-metric-large\) is not installed\. Install it in Preferences > Add-ons > Lean Image AI",
        ),
        ("reconstruct_geometry", "", r"No MoGe-2 geometry model is installed"),
        (
            "upscale",
            "ben2-base",
            r"'BEN2 Base \(official ONNX, PramaLLC\)' is a BEN2 background removal model",
        ),
        ("upscale", "nope", r"Unknown model 'nope'"),
    ],
)
def test_model_not_installed_is_a_clear_error(tmp_path, op, model_id, expected):
    src = write_png(tmp_path / "p.png", source_pixels())
    before = counts()
    with pytest.raises(RuntimeError, match=expected):
        getattr(bpy.ops.lean_image_ai, op)(filepath=str(src), model_id=model_id)
    assert counts() == before


def test_missing_model_path_is_a_clear_error(tmp_path):
    src = write_png(tmp_path / "p.png", source_pixels())
    with pytest.raises(RuntimeError, match=r"Model file not found: '.*nowhere\.onnx'"):
        bpy.ops.lean_image_ai.upscale(filepath=str(src), model_path=str(tmp_path / "nowhere.onnx"))
    assert counts() == (0, 0, 0, 0)


def test_unreadable_image_file_is_named(tmp_path, models):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n this is not really a PNG")
    with pytest.raises(RuntimeError, match=r"cannot read '.*broken\.png'"):
        bpy.ops.lean_image_ai.remove_background(filepath=str(broken), model_path=str(models["ben2"]))
    assert counts() == (0, 0, 0, 0)


def test_bad_output_suffix_fails_before_any_model_run(tmp_path, models):
    src = write_png(tmp_path / "p.png", source_pixels())
    runs_before = len(host_record.events.recent("operation_start"))
    with pytest.raises(RuntimeError, match=r"unknown image format '\.gif'.*Use \.png, \.exr, \.jpg or \.tif"):
        bpy.ops.lean_image_ai.upscale(
            filepath=str(src), model_path=str(models["sr"]), output_path=str(tmp_path / "x.gif")
        )
    assert len(host_record.events.recent("operation_start")) == runs_before
    assert counts() == (0, 0, 0, 0)
    with pytest.raises(RuntimeError, match=r"the folder '.*missing' does not exist"):
        bpy.ops.lean_image_ai.upscale(
            filepath=str(src), model_path=str(models["sr"]), output_path=str(tmp_path / "missing" / "x.png")
        )


@pytest.mark.parametrize("replace", [False, True])
def test_failing_job_changes_nothing(tmp_path, models, replace):
    """A model producing NaN fails after the run: no image, the loaded source removed again."""
    src = write_png(tmp_path / "p.png", source_pixels())
    before = counts()
    with pytest.raises(RuntimeError, match="NaN"):
        bpy.ops.lean_image_ai.remove_background(
            filepath=str(src), model_path=str(models["ben2_nan"]), replace=replace
        )
    assert counts() == before


def test_wrong_model_family_fails_and_changes_nothing(tmp_path, models):
    src = write_png(tmp_path / "p.png", source_pixels())
    with pytest.raises(RuntimeError, match="does not look like a"):
        bpy.ops.lean_image_ai.estimate_depth(filepath=str(src), model_path=str(models["sr"]), make_plane=True)
    assert counts() == (0, 0, 0, 0)


def test_failed_save_removes_the_result(tmp_path, models, monkeypatch):
    src = write_png(tmp_path / "p.png", source_pixels())

    def refuse(image, path, file_format):
        raise image_io.ImageSaveError(f"Cannot save '{path}': disk full (test)")

    def refuse_bytes(path, data):
        raise OSError("disk full (test)")

    from lean_image_ai.models import files

    monkeypatch.setattr(image_io, "save_image_atomically", refuse)
    def refuse_commit(staged):
        staged.discard()
        raise OSError("disk full (test)")

    monkeypatch.setattr(files, "write_bytes", refuse_bytes)  # the EXR the pump wrote, saved by the add-on
    monkeypatch.setattr(files.StagedFile, "commit", refuse_commit)  # ... or written there a band per call
    with pytest.raises(RuntimeError, match="disk full"):
        bpy.ops.lean_image_ai.estimate_depth(
            filepath=str(src),
            model_path=str(models["da3"]),
            make_plane=True,
            output_path=str(tmp_path / "d.exr"),
        )
    assert counts() == (0, 0, 0, 0)


def test_second_job_is_refused_while_one_runs(tmp_path, models):
    src = write_png(tmp_path / "p.png", source_pixels())
    job = jobs.manager.begin("Upscale")
    try:
        with pytest.raises(RuntimeError, match=r"'Upscale' is still running.*cancel it"):
            bpy.ops.lean_image_ai.remove_background(filepath=str(src), model_path=str(models["ben2"]))
    finally:
        jobs.manager.end(job)
    assert counts() == (0, 0, 0, 0)


def test_cancel_job_operator(tmp_path):
    assert bpy.ops.lean_image_ai.cancel_job() == {"CANCELLED"}  # nothing running: says so
    job = jobs.manager.begin("Estimate Depth")
    try:
        assert bpy.ops.lean_image_ai.cancel_job() == {"FINISHED"}
        assert job.cancel_event.is_set() and job.stage == "cancelling..."
    finally:
        jobs.manager.end(job)


def test_operators_are_built_from_the_family_records():
    """Each family's operator takes the common properties plus exactly the options its record
    declares, with the record's defaults and ranges (the panel and scene settings use the same)."""
    from lean_image_ai.models import families

    for family in families.ALL:
        cls = next(c for c in (*image_ops.classes, *geometry_ops.classes) if c.family is family)
        assert cls.bl_idname == f"lean_image_ai.{family.operator}" and cls.bl_description
        props = getattr(bpy.ops.lean_image_ai, family.operator).get_rna_type().properties
        for name in ("filepath", "output_path", "model_id", "model_path"):
            assert props[name].type == "STRING", (cls.bl_idname, name)
        own = {p.identifier for p in props} - {"rna_type", "filepath", "output_path", "model_id", "model_path", "overwrite"}
        assert own == {o.name for o in family.options}, family.id
        for option in family.options:
            prop = props[option.name]
            assert prop.default == pytest.approx(option.default), (family.id, option.name)
            if option.min is not None:
                assert prop.hard_min == pytest.approx(option.min)
            if option.max is not None:
                assert prop.hard_max == pytest.approx(option.max)


# --- what the operators hand to the model --------------------------------------------------------


@pytest.fixture
def recorded(monkeypatch):
    """The process-wide runtime replaced by one whose real CPU sessions record every run (in this
    process: the model worker's runtime is another process's)."""
    from lean_image_ai.models.worker.remote_batch import IN_PROCESS_ENV
    from lean_image_ai.runtime import core
    from recording import RecordingFactory

    monkeypatch.setenv(IN_PROCESS_ENV, "1")

    factory = RecordingFactory()
    runtime = Runtime(session_factory=factory)
    monkeypatch.setattr(core, "_runtime", runtime)
    yield factory
    runtime.clear("test teardown")


FLAT = (200, 100, 50)  # a flat colour: every resize kernel keeps it, so the feed is exact


def _register(models_dir, family, model, settings) -> str:
    """A user model carrying a built-in entry's settings; returns its id."""
    user_catalog = catalog.Catalog()
    entry = user_catalog.add_user_model(family, model, title=f"test {family}", settings=dict(settings))
    user_catalog.save_user_models(models_dir / library.USER_MODELS_FILE)
    return entry.id


# constants unlike every adapter default, so an operator that dropped them would be caught
UNUSUAL = {
    "ben2": {"mean": (0.25, 0.5, 0.75), "std": (0.5, 0.25, 2.0), "input_size": (40, 72)},
    "da3": {"mean": (0.1, 0.2, 0.3), "std": (0.3, 0.2, 0.1), "process_res": 140, "patch_multiple": 10},
    "moge2": {"num_tokens_range": (600, 1500), "patch_size": 10},
}


@pytest.mark.parametrize(
    "entry_id, unusual",
    [
        ("ben2-fp16", False),
        ("ben2-base", False),
        ("da3-metric-large", False),
        ("moge2-vits", False),
        ("ben2-base", True),
        ("da3-metric-large", True),
        ("moge2-vits", True),
    ],
)
def test_catalog_constants_reach_the_model_input(tmp_path, clean_blender, recorded, entry_id, unusual):
    """A catalog entry's settings (normalisation, input size, DA3 process_res and
    patch multiple, MoGe-2 token range and patch size) are what the model really receives
    through the operator: the built-in entries' own constants, and constants unlike any adapter
    default (a registered model overriding them), so dropped constants cannot go unnoticed.

    BEN2/MoGe-2 entries have a verified size, so a small model of the same contract is registered
    with the entry's constants; the DA3 entry's size is unknown, so a file under its name in the
    models folder is the installed built-in entry itself."""
    entry = catalog.Catalog().get(entry_id)
    pre = {**entry.settings, **(UNUSUAL[entry.family] if unusual else {})}
    models_dir = clean_blender
    pixels = np.zeros((H, W, 4), np.uint8)
    pixels[..., :3] = FLAT
    pixels[..., 3] = 255
    src = write_png(tmp_path / "flat.png", pixels)
    rgb = np.asarray(FLAT, np.float64) / 255

    if entry.family == "ben2":
        model = ben2_like_model(tmp_path / "ben2.onnx", fixed=False)  # dynamic: input_size decides
        result = bpy.ops.lean_image_ai.remove_background(
            filepath=str(src), model_id=_register(models_dir, "ben2", model, pre)
        )
        mean, std = np.asarray(pre["mean"]), np.asarray(pre["std"])
        expected_shape = (1, 3, *pre["input_size"])
    elif entry.family == "da3":
        if unusual:
            model = da3_like_model(tmp_path / "da3.onnx", fixed_hw=None)
            model_id = _register(models_dir, "da3", model, pre)
        else:  # dynamic input: process_res decides the size
            model_id = entry_id
            da3_like_model(models_dir / entry.filename, fixed_hw=None)
        result = bpy.ops.lean_image_ai.estimate_depth(filepath=str(src), model_id=model_id)
        mean, std = np.asarray(pre["mean"]), np.asarray(pre["std"])
        long_side, multiple = pre["process_res"], pre["patch_multiple"]
        short_side = round(H * long_side / W / multiple) * multiple
        expected_shape = (1, 3, short_side, long_side)  # W > H: the long side is the width
    else:
        from builders_moge2 import moge2_like_model

        model = moge2_like_model(tmp_path / "moge2.onnx")
        # the operator's default resolution level (the top one) must pick the top of the range
        result = bpy.ops.lean_image_ai.reconstruct_geometry(
            filepath=str(src), model_id=_register(models_dir, "moge2", model, pre)
        )
        mean, std = np.zeros(3), np.ones(3)  # the export normalises inside the graph
        # fed at the picture's own size (moge2.at_source_size: MoGe's forward() takes the picture);
        # smaller than the token grid, it is the picture itself
        expected_shape = (1, 3, H, W)

    assert result == {"FINISHED"}
    assert len(recorded.runs) == 1 and recorded.shrink_entries == ["cpu:0"]
    feeds = recorded.runs[0]["feeds"]
    image = next(v for v in feeds.values() if v.ndim == 4)
    assert image.shape == expected_shape and image.dtype == np.float32
    want = (rgb - mean) / std
    for channel in range(3):
        np.testing.assert_allclose(image[0, channel], want[channel], atol=2e-5, err_msg=f"channel {channel}")
    if entry.family == "moge2":
        assert int(feeds["num_tokens"]) == pre["num_tokens_range"][1]


def test_the_two_ben2_exports_feed_their_models_differently(tmp_path, clean_blender, recorded):
    """The catalog keeps the BEN2 exports' normalisations apart, and that difference reaches the
    model: the same picture gives different inputs through the two entries."""
    src = write_png(tmp_path / "p.png", source_pixels())
    model = ben2_like_model(tmp_path / "ben2.onnx", size=64)
    fed = []
    for entry_id in ("ben2-fp16", "ben2-base"):
        model_id = _register(clean_blender, "ben2", model, catalog.Catalog().get(entry_id).settings)
        assert bpy.ops.lean_image_ai.remove_background(filepath=str(src), model_id=model_id) == {"FINISHED"}
        fed.append(recorded.runs[-1]["feeds"]["input"])
    imagenet, plain = fed
    assert imagenet.shape == plain.shape == (1, 3, 64, 64)
    assert 0.0 <= plain.min() and plain.max() <= 1.0, "ben2-base: plain /255"
    np.testing.assert_allclose(
        imagenet,
        (plain - np.reshape(IMAGENET_MEAN, (1, 3, 1, 1)))
        / np.reshape(IMAGENET_STD, (1, 3, 1, 1)),
        atol=2e-5,
    )


BEN2_LOOKS = r"this looks like a background-removal \(matte\) model: .*Use remove-background \(Remove Background in Blender\)"


@pytest.mark.parametrize(
    "op, wrong, says",
    [
        ("remove_background", "ben2_4ch", r"does not look like a BEN2 model.*input 0 'input': expected 3 channels, found 4"),
        ("estimate_depth", "sr", r"does not look like a Depth Anything 3 model.*expected a float depth output .* found 'output'"),
        # plainly another family's file: what it looks like and which button takes it, not the shapes
        ("reconstruct_geometry", "ben2", BEN2_LOOKS + r" for it \(geometry cannot use it\)"),
        ("upscale", "ben2", BEN2_LOOKS + r" for it \(upscale cannot use it\)"),
    ],
)
def test_every_operator_rejects_a_model_of_another_contract_readably(tmp_path, models, recorded, op, wrong, says):
    """A model whose inputs/outputs do not fit the operator's family fails before any model run,
    with a message that names the file and what does not fit (or, for a file plainly another
    family's, what it looks like), and changes nothing."""
    if wrong == "ben2_4ch":
        model = ben2_like_model(tmp_path / "ben2_4ch.onnx", size=64, channels=4)
    else:
        model = models[wrong]
    src = write_png(tmp_path / "p.png", source_pixels())
    with pytest.raises(RuntimeError) as info:
        getattr(bpy.ops.lean_image_ai, op)(filepath=str(src), model_path=str(model))
    message = str(info.value)
    assert Path(model).name in message and re.search(says, message), message
    assert recorded.runs == [], "the contract is checked before any run"
    assert counts() == (0, 0, 0, 0)


def test_upscale_tile_size_property_tiles_the_job(tmp_path, models, recorded):
    """tile_size 0 (the default: automatic) runs this small picture in one window; a tile size
    below the picture's size splits it into several runs, one job with one release at its end,
    and the result is the same picture."""
    src = write_png(tmp_path / "t.png", source_pixels(alpha=False))  # opaque: colour runs only
    assert bpy.ops.lean_image_ai.upscale(filepath=str(src), model_path=str(models["sr"])) == {"FINISHED"}
    untiled = image_io.image_to_array(bpy.data.images["t_x2"])
    assert recorded.shrink_entries == ["cpu:0"]
    bpy.data.images.remove(bpy.data.images["t_x2"])
    assert bpy.ops.lean_image_ai.upscale(filepath=str(src), model_path=str(models["sr"]), tile_size=16) == {
        "FINISHED"
    }
    tiled = image_io.image_to_array(bpy.data.images["t_x2"])
    runs = recorded.shrink_entries[1:]
    assert len(runs) > 1 and runs == [""] * (len(runs) - 1) + ["cpu:0"]
    whole = recorded.runs[0]["shape"]
    assert all(r["shape"][2] * r["shape"][3] < whole[2] * whole[3] for r in recorded.runs[1:])
    assert np.abs(tiled - untiled).max() <= 1 / 255 + 1e-6
