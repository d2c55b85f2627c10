"""Issue #37 item 3: a model operator's start on a large source does Blender's read of the pixels and
nothing more on Blender's main thread; the model still sees exactly the pixels it saw before.

The real Upscale operator (bpy 5.0.1, the built-in bicubic x2 in the model worker) driven as Blender's
UI drives it (tests/modal_standins.py: ``start_modal``, then one TIMER event at a time). Memory is
traced while ``start_modal`` runs: Blender's pixels copied out once (``pixels.foreach_get``) and the
model input's buffer (filled later, a band per timer call) are all it may hold; before, it also
made a whole top-row-first copy of the pixels (0.01-0.05 s at 2048x2048, bench/start_parts.py).
An image the Image Editor (or a texture node) names but Blender has not decoded yet is decoded in
the first timer call, alone, and the job prepared in the next: the start itself decodes nothing.
Behaviour, not seconds.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
bh.import_package()

from lean_image_ai.models import colour  # noqa: E402
from lean_image_ai.models.store import library  # noqa: E402
from lean_image_ai.operators import image_io, image_ops, jobs  # noqa: E402
from modal_standins import ESC, TIMER, StandInContext, drive, driver_class  # noqa: E402

SIDE = 512

LEANTEST_OT_drive_upscale_start = driver_class(
    image_ops.LEAN_IMAGE_AI_OT_upscale, "lean_image_ai_test.drive_upscale_start", "LEANTEST_OT_drive_upscale_start"
)


@pytest.fixture(scope="module", autouse=True)
def registered():
    mine = [cls for cls in (*jobs.classes, *image_ops.classes) if not cls.is_registered]
    for cls in mine:
        bpy.utils.register_class(cls)
    bpy.utils.register_class(LEANTEST_OT_drive_upscale_start)
    yield
    bpy.utils.unregister_class(LEANTEST_OT_drive_upscale_start)
    for cls in reversed(mine):
        if cls.is_registered:
            bpy.utils.unregister_class(cls)


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()  # empty: the built-in bicubic x2
    monkeypatch.setenv(library.MODELS_DIR_ENV, str(tmp_path / "models"))
    bh.reset_blender()
    yield
    jobs.manager.cancel_all()
    bh.reset_blender()


def source_file(folder: Path, is_float: bool) -> Path:
    """A PNG (a byte image) or a float EXR with colour above 1 and alpha below 1 (premultiplied and
    linear: the model's input is converted), saved by Blender."""
    y, x = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
    straight = np.stack([(3 if is_float else 1) * x, y, (x + y) / 2, 0.25 + 0.75 * y], axis=-1)
    pixels = colour.premultiply(straight) if is_float else straight
    image = bpy.data.images.new("plate", SIDE, SIDE, alpha=True, float_buffer=is_float)
    image.pixels.foreach_set(np.ascontiguousarray(pixels[::-1]).ravel())
    path = folder / ("plate.exr" if is_float else "plate.png")
    image.filepath_raw, image.file_format = str(path), "OPEN_EXR" if is_float else "PNG"
    image.save()
    bpy.data.images.remove(image)
    return path


def run_job(*, path: Path | None = None, image=None, cancel_at: int | None = None) -> dict:
    """One Upscale job on the file ``path`` (``filepath``) or on the Image Editor's ``image``. Seen:
    after the start and after each timer call, whether Blender has decoded the source and whether
    the job is prepared (has its task); the most memory traced from the start until the job is
    prepared; the model's input as the job handed it to the batch (taken as the lane ends the job);
    Esc before timer call ``cancel_at``."""
    seen = {"after": []}

    def keep_input(job):
        seen["model_input"] = None if job.inputs is None else np.array(job.inputs.model_rgba)

    def state_now():
        job = jobs.manager.current
        if image is not None:
            decoded = image.has_data
        else:
            decoded = any(made.has_data for made in bpy.data.images if Path(made.filepath) == path)
        return decoded, job is not None and job.task is not None

    def script(op):
        ctx = StandInContext()
        if image is not None:
            ctx.space_data = SimpleNamespace(type="IMAGE_EDITOR", image=image)
        before = set(bpy.data.images)
        tracemalloc.start()
        try:
            state = op.start_modal(ctx)
            seen["after"].append(state_now())
            deadline = time.monotonic() + 120
            while state == {"RUNNING_MODAL"}:
                assert time.monotonic() < deadline, "the job did not end in time"
                if tracemalloc.is_tracing() and seen["after"][-1][1]:  # prepared: its read is over
                    seen["start_peak"] = tracemalloc.get_traced_memory()[1]
                    tracemalloc.stop()
                if cancel_at == len(seen["after"]):
                    op.modal(ctx, ESC)
                state = op.modal(ctx, TIMER)
                seen["after"].append(state_now())
                time.sleep(0.005)
        finally:
            tracemalloc.stop()
        seen["state"], seen["made"] = state, [made.name for made in bpy.data.images if made not in before]
        return state

    jobs.manager.on_end.append(keep_input)
    try:
        props = {"filepath": str(path)} if image is None else {}
        drive(bpy.ops.lean_image_ai_test.drive_upscale_start, script, **props)
    finally:
        jobs.manager.on_end.remove(keep_input)
    return seen


def whole_model_input(path: Path) -> np.ndarray:
    """The model's input as the start made it before: the pixels copied whole, top row first, then
    converted whole (a byte image's values as uint8)."""
    image = bpy.data.images.load(str(path), check_existing=False)
    try:
        info = image_io.image_info(image)
        rgba = np.ascontiguousarray(image_io.image_to_array(image))
    finally:
        bpy.data.images.remove(image)
    converted = colour.to_model_rgb(rgba, info.is_linear, premultiplied=info.premultiplied)
    if info.is_float:
        return converted
    return (np.clip(converted, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


@pytest.mark.parametrize("is_float", [True, False], ids=["float", "byte"])
def test_the_start_holds_no_second_whole_copy_of_the_sources_pixels(tmp_path, is_float):
    """Traced from ``start_modal`` until the job is prepared: Blender's pixels as float32 (1 x the source's float bytes) and
    the model input's buffer (1 x for a float source, 1/4 x for a byte one's uint8) at most, with a
    margin of a quarter; a whole top-row-first copy of the pixels would add 1 x more."""
    path = source_file(tmp_path, is_float)
    seen = run_job(path=path)
    assert seen["state"] == {"FINISHED"}
    pixels = SIDE * SIDE * 4 * 4  # float32 RGBA
    model_buffer = pixels if is_float else pixels // 4
    assert seen["start_peak"] < pixels + model_buffer + pixels // 4, (seen["start_peak"], pixels)


@pytest.mark.parametrize("is_float", [True, False], ids=["float", "byte"])
def test_the_model_sees_the_pixels_the_whole_copy_gave(tmp_path, is_float):
    path = source_file(tmp_path, is_float)
    seen = run_job(path=path)
    assert seen["state"] == {"FINISHED"}
    expected = whole_model_input(path)
    assert seen["model_input"].dtype == expected.dtype and seen["model_input"].shape == (SIDE, SIDE, 4)
    if is_float:
        assert float(expected[..., 0].max()) > 1.0 and float(expected[..., 3].min()) < 0.5  # what was converted
    np.testing.assert_array_equal(seen["model_input"], expected)


@pytest.mark.parametrize("is_float", [True, False], ids=["float", "byte"])
def test_an_editor_image_not_yet_decoded_is_decoded_in_a_timer_call_of_its_own(tmp_path, is_float):
    path = source_file(tmp_path, is_float)
    image = bpy.data.images.load(str(path), check_existing=False)
    assert not image.has_data  # loading only names the file
    seen = run_job(image=image)
    assert seen["state"] == {"FINISHED"} and len(seen["made"]) == 1, seen
    # (decoded, prepared): the start neither; the first call decodes; the second prepares the job
    assert seen["after"][:3] == [(False, False), (True, False), (True, True)], seen["after"]
    np.testing.assert_array_equal(seen["model_input"], whole_model_input(path))


def test_an_editor_image_already_decoded_is_read_in_the_start(tmp_path):
    image = bpy.data.images.load(str(source_file(tmp_path, True)), check_existing=False)
    assert tuple(image.size) == (SIDE, SIDE) and image.has_data  # as an image the Image Editor shows
    seen = run_job(image=image)
    assert seen["state"] == {"FINISHED"}
    assert seen["after"][0] == (True, True), seen["after"]


def test_an_editor_image_whose_file_is_gone_fails_the_job_with_the_clear_message(tmp_path):
    path = source_file(tmp_path, False)
    image = bpy.data.images.load(str(path), check_existing=False)
    path.unlink()
    # the job's error, reported as it ends (bpy.ops raises an operator's ERROR report in background mode)
    with pytest.raises(RuntimeError, match=r"is empty \(0 x 0 pixels\): its file could not be loaded"):
        run_job(image=image)
    last = jobs.manager.last
    assert last.state == "failed" and "its file could not be loaded" in last.error_text
    assert jobs.manager.current is None and list(bpy.data.images) == [image]


def test_esc_before_the_job_is_prepared_cancels_it_with_nothing_made(tmp_path):
    image = bpy.data.images.load(str(source_file(tmp_path, True)), check_existing=False)
    seen = run_job(image=image, cancel_at=2)  # after the decode, before the job is prepared
    assert seen["state"] == {"CANCELLED"} and seen["made"] == [], seen
    assert seen["after"][1] == (True, False) and seen["model_input"] is None
    assert jobs.manager.last.state == "cancelled" and jobs.manager.current is None


@pytest.mark.parametrize("is_float", [True, False], ids=["float", "byte"])
def test_a_filepath_source_is_loaded_and_decoded_in_a_timer_call_of_its_own(tmp_path, is_float):
    path = source_file(tmp_path, is_float)
    seen = run_job(path=path)
    assert seen["state"] == {"FINISHED"} and len(seen["made"]) == 1, seen  # the result; the source removed again
    # (decoded, prepared): the start loads nothing; the first call loads and decodes; the second
    # prepares the job (its read done, the loaded source is removed again at once, as before)
    assert seen["after"][:3] == [(False, False), (True, False), (False, True)], seen["after"]
    np.testing.assert_array_equal(seen["model_input"], whole_model_input(path))


def test_a_filepath_blender_cannot_read_fails_the_job_with_the_loads_message(tmp_path):
    path = tmp_path / "broken.png"
    path.write_bytes(b"not a picture")
    with pytest.raises(RuntimeError, match="Blender cannot read .* as an image"):
        run_job(path=path)
    assert jobs.manager.last.state == "failed" and list(bpy.data.images) == []


def test_esc_after_a_filepath_source_is_loaded_removes_it_again(tmp_path):
    path = source_file(tmp_path, False)
    seen = run_job(path=path, cancel_at=2)  # after the load, before the job is prepared
    assert seen["state"] == {"CANCELLED"} and seen["after"][1] == (True, False), seen
    assert jobs.manager.last.state == "cancelled" and list(bpy.data.images) == []
