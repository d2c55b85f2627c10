"""Issue #37 item 3: no single call of the add-on on Blender's main thread makes a large result whole.

The real Upscale operator (bpy 5.0.1, built-in bicubic x2 in the model worker, 1024x1024 ->
2048x2048) driven as Blender's UI drives it (tests/modal_standins.py: ``start_modal``, then one
TIMER event at a time). Every call of ``zlib``'s deflate on this process is counted per timer call:
the result's packed file (a PNG for a byte source, a float EXR for a float one) is deflated over
several calls, none more than ``MAX_PIXELS_PER_CALL`` pixels' worth, and the image appears only in
the last call, which deflates nothing; the model's input is converted over several calls too.
Before, one call converted and deflated all 2048 rows (a byte result) or Blender's pack() wrote
the whole EXR (a float one), and the operator's start converted the whole source for the model. Behaviour, not seconds: the
time of a call depends on the machine (bench/worker.py --ops-only measures it).
"""

from __future__ import annotations

import io
import struct
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
bh.import_package()

from lean_image_ai.models import colour  # noqa: E402
from lean_image_ai.models.file_bytes import MAX_PIXELS_PER_CALL  # noqa: E402
from lean_image_ai.models.store import library  # noqa: E402
from lean_image_ai.operators import image_io, image_ops, jobs, memory_ops  # noqa: E402
from modal_standins import ESC, TIMER, StandInContext, drive, driver_class  # noqa: E402
from PIL import Image as PILImage  # noqa: E402

SIDE = 1024  # the built-in bicubic x2 makes 2048x2048
RESULT = 2 * SIDE

LEANTEST_OT_drive_upscale_apply = driver_class(
    image_ops.LEAN_IMAGE_AI_OT_upscale, "lean_image_ai_test.drive_upscale_apply", "LEANTEST_OT_drive_upscale_apply"
)


@pytest.fixture(scope="module", autouse=True)
def registered():
    mine = [cls for cls in (*jobs.classes, *image_ops.classes) if not cls.is_registered]
    for cls in mine:
        bpy.utils.register_class(cls)
    bpy.utils.register_class(LEANTEST_OT_drive_upscale_apply)
    yield
    bpy.utils.unregister_class(LEANTEST_OT_drive_upscale_apply)
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


class Deflate:
    """Counts the bytes this process hands to zlib's deflate, per timer call (``call``; -1: the
    operator's start), and the pixels it converts for the model (``converted``)."""

    def __init__(self, monkeypatch):
        self.call, self.fed, self.converted = -1, {}, {}
        real_to_model_rgb = colour.to_model_rgb

        def to_model_rgb(array, *args, **kwargs):
            self.converted[self.call] = self.converted.get(self.call, 0) + int(np.prod(np.shape(array)[:2]))
            return real_to_model_rgb(array, *args, **kwargs)

        monkeypatch.setattr(colour, "to_model_rgb", to_model_rgb)
        real_compress, real_compressobj, deflate = zlib.compress, zlib.compressobj, self

        def compress(data, *args, **kwargs):
            deflate.count(data)
            return real_compress(data, *args, **kwargs)

        class CountingCompressor:
            def __init__(self, *args, **kwargs):
                self._real = real_compressobj(*args, **kwargs)

            def compress(self, data):
                deflate.count(data)
                return self._real.compress(data)

            def flush(self, *args):
                return self._real.flush(*args)

        monkeypatch.setattr(zlib, "compress", compress)
        monkeypatch.setattr(zlib, "compressobj", CountingCompressor)

    def count(self, data) -> None:
        self.fed[self.call] = self.fed.get(self.call, 0) + memoryview(data).nbytes


def byte_source(folder: Path) -> Path:
    rng = np.random.default_rng(5)
    y, x = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    pixels = np.stack([x, y, (x + y) / 2, 0.5 + x / 2], axis=-1) * 235 + rng.integers(0, 20, (SIDE, SIDE, 4))
    path = folder / "photo.png"
    PILImage.fromarray(pixels.astype(np.uint8), "RGBA").save(path)
    return path


def float_source(folder: Path) -> Path:
    """A float EXR with colour above 1 and alpha below 1 (so premultiplying matters)."""
    y, x = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
    straight = np.stack([3 * x, y, (x + y) / 2, 0.25 + 0.75 * y], axis=-1)
    image = bpy.data.images.new("plate", SIDE, SIDE, alpha=True, float_buffer=True)
    image.pixels.foreach_set(np.ascontiguousarray(colour.premultiply(straight)[::-1]).ravel())
    path = folder / "plate.exr"
    image.filepath_raw, image.file_format = str(path), "OPEN_EXR"
    image.save()
    bpy.data.images.remove(image)
    return path


def run_modal(path: Path, deflate: Deflate, *, cancel_when=None, stop_when=None, **properties) -> dict:
    """Drive one Upscale job; per timer call, the new images after it. Returns what was seen,
    with the job's own result pixels (taken as the lane ends the job). ``cancel_when()``: Esc
    once it is true while the job runs; ``stop_when()``: Blender's own cancel of the operator
    (a file load, say) once it is true after a timer call."""
    seen = {"images": [], "result": None}
    cancel = [cancel_when]

    def keep_result(job):
        seen["result"] = getattr(job.result, "image", None)

    def script(op):
        ctx = StandInContext()
        before = set(bpy.data.images)
        state = op.start_modal(ctx)
        deadline = time.monotonic() + 300
        while state == {"RUNNING_MODAL"}:
            assert time.monotonic() < deadline, "the job did not end in time"
            if cancel[0] is not None and cancel[0]() and jobs.manager.current is not None:
                op.modal(ctx, ESC)
                cancel[0] = None
                seen["cancelled_at"] = deflate.call
            deflate.call += 1
            state = op.modal(ctx, TIMER)
            # the made ones: not the source, which the job's first call loads (and its read removes again)
            seen["images"].append(sorted(image.name for image in bpy.data.images
                                         if image not in before and image.filepath != str(path)))
            if stop_when is not None and state == {"RUNNING_MODAL"} and stop_when():
                op.cancel(ctx)
                seen["stopped_at"], state = deflate.call, {"CANCELLED"}
                seen["live_timers"] = list(ctx.window_manager.live_timers)
            time.sleep(0.005)
        seen["state"] = state
        return state

    jobs.manager.on_end.append(keep_result)
    try:
        drive(bpy.ops.lean_image_ai_test.drive_upscale_apply, script, filepath=str(path), **properties)
    finally:
        jobs.manager.on_end.remove(keep_result)
    return seen


def check_spread(seen: dict, deflate: Deflate, bytes_per_call: int, file_bytes: int) -> None:
    calls = sorted(deflate.fed)
    assert seen["state"] == {"FINISHED"}
    assert len(calls) >= 2, f"the result was deflated in one timer call: {deflate.fed}"
    assert max(deflate.fed.values()) <= bytes_per_call, deflate.fed
    assert sum(deflate.fed.values()) >= file_bytes  # the whole image went through deflate
    applied = next(index for index, images in enumerate(seen["images"]) if images)  # the call that made it
    assert applied not in deflate.fed, "the call that makes the image also deflates"
    assert max(deflate.fed) < applied, "a band was written after the image was made"
    assert len(seen["images"][applied]) == 1 and seen["images"][-1] == seen["images"][applied]


def test_a_large_byte_result_is_deflated_over_several_calls_and_made_in_the_last(tmp_path, monkeypatch):
    path = byte_source(tmp_path)
    deflate = Deflate(monkeypatch)
    seen = run_modal(path, deflate)
    row = 1 + 4 * RESULT  # a PNG row: its filter byte and 8-bit RGBA
    check_spread(seen, deflate, (MAX_PIXELS_PER_CALL // RESULT) * row, RESULT * row)

    image = bpy.data.images[seen["images"][-1][0]]
    assert image.packed_file is not None and tuple(image.size) == (RESULT, RESULT)
    decoded = np.asarray(PILImage.open(io.BytesIO(image.packed_file.data)))
    expected = np.floor(np.clip(image_io.to_rgba(seen["result"]) * 255.0 + 0.5, 0, 255)).astype(np.uint8)
    np.testing.assert_array_equal(decoded, expected)  # Blender's rounding of float pixels into a byte image


def test_a_large_float_result_is_deflated_over_several_calls_and_reads_back_exactly(tmp_path, monkeypatch):
    path = float_source(tmp_path)
    deflate = Deflate(monkeypatch)
    seen = run_modal(path, deflate)
    check_spread(seen, deflate, MAX_PIXELS_PER_CALL * 16, RESULT * RESULT * 16)  # 4 float32 samples a pixel

    image = bpy.data.images[seen["images"][-1][0]]
    assert image.packed_file is not None and image.is_float
    straight = colour.from_model_rgb(image_io.to_rgba(seen["result"]), True)
    expected = colour.premultiply(straight)  # as Blender keeps float pixels, and as the old path wrote them
    assert float(expected[..., 3].min()) < 0.5  # alpha below 1 went through
    np.testing.assert_array_equal(image_io.image_to_array(image), expected)


def test_a_float_sources_conversion_for_the_model_is_spread_over_calls(tmp_path, monkeypatch):
    """The model's input (a float source unpremultiplied and sRGB-encoded) is converted by the
    pump too: neither the operator's start nor one timer call converts the whole picture."""
    path = float_source(tmp_path)
    deflate = Deflate(monkeypatch)
    assert run_modal(path, deflate)["state"] == {"FINISHED"}
    assert sum(deflate.converted.values()) == SIDE * SIDE, deflate.converted
    assert -1 not in deflate.converted, "the operator's start converted the source"
    assert max(deflate.converted.values()) <= MAX_PIXELS_PER_CALL, deflate.converted


def test_cancel_while_the_result_is_being_written_leaves_nothing(tmp_path, monkeypatch):
    path = byte_source(tmp_path)
    deflate = Deflate(monkeypatch)
    seen = run_modal(path, deflate, cancel_when=lambda: deflate.fed)
    assert "cancelled_at" in seen, "the job ended before its result was being written"
    assert seen["state"] == {"CANCELLED"}
    assert all(images == [] for images in seen["images"]), seen["images"]
    assert jobs.manager.last.state == "cancelled"


def test_cancel_while_the_models_input_is_converted_ends_before_the_model_runs(tmp_path, monkeypatch):
    path = float_source(tmp_path)
    deflate = Deflate(monkeypatch)
    seen = run_modal(path, deflate, cancel_when=lambda: deflate.converted)
    # Esc right after the call of the first band (the calls before it decoded and read the source)
    assert seen["cancelled_at"] == min(deflate.converted) and seen["state"] == {"CANCELLED"}
    assert seen["result"] is None and not deflate.fed
    assert all(images == [] for images in seen["images"]), seen["images"]
    assert jobs.manager.last.state == "cancelled"


class EndSteps:
    """The timer call (``deflate.call``) in which each part of the job's end ran: the lane's memory
    picture drawn and put into its image (operators/memory_ops.py's listener), the job's arrays
    let go, the heap trimmed."""

    def __init__(self, monkeypatch, deflate: Deflate):
        self.ran: dict[str, list[int]] = {}
        for owner, name, label in ((memory_ops, "_rendered_plot", "plot drawn"),
                                   (memory_ops, "_plot_into_image", "plot image"),
                                   (jobs.BlenderJob, "release", "release"), (jobs, "trim_process_heap", "heap trim")):
            monkeypatch.setattr(owner, name, self._recording(getattr(owner, name), label, deflate))
        monkeypatch.setattr(jobs.manager, "on_end", [*jobs.manager.on_end, memory_ops._after_job])

    def _recording(self, real, label: str, deflate: Deflate):
        def recorded(*args, **kwargs):
            self.ran.setdefault(label, []).append(deflate.call)
            return real(*args, **kwargs)

        return recorded


def test_the_jobs_end_runs_a_step_per_call_after_the_result_is_made(tmp_path, monkeypatch):
    """Issue #37 item 3: the job's last call held its end whole after making the result (the memory
    picture drawn and packed, the job's arrays let go, the heap trimmed: 0.05-0.1 s on a loaded
    machine). Now the call that makes the result does only that, each part of the end runs in a
    timer call of its own after it, and the operator ends (FINISHED, its timer removed) after them."""
    path = float_source(tmp_path)
    deflate = Deflate(monkeypatch)
    end = EndSteps(monkeypatch, deflate)
    seen = run_modal(path, deflate)

    assert seen["state"] == {"FINISHED"}
    applied = next(index for index, images in enumerate(seen["images"]) if images)
    calls = end.ran
    assert sorted(calls) == ["heap trim", "plot drawn", "plot image", "release"], calls
    assert all(len(ran) == 1 for ran in calls.values()), calls
    ends = [ran[0] for ran in calls.values()]
    assert len(set(ends + [applied])) == len(ends) + 1, f"two parts in one call: made {applied}, {calls}"
    assert min(ends) > applied
    assert memory_ops.PLOT_IMAGE in seen["images"][-1] and len(seen["images"][-1]) == 2
    assert jobs.manager.current is None and jobs.manager.last.state == "finished"
    assert jobs.manager.last.task is None  # let go of


def test_blender_stopping_the_operator_during_the_jobs_end_keeps_the_result(tmp_path, monkeypatch):
    """A file load (Blender's cancel of the operator) after the result was made: the rest of the end
    runs at once, the result stays, the job counts as finished (it was applied), no timer is left."""
    path = byte_source(tmp_path)
    deflate = Deflate(monkeypatch)
    end = EndSteps(monkeypatch, deflate)
    seen = run_modal(path, deflate, stop_when=lambda: bpy.data.images.get("photo_x2") is not None)

    assert "stopped_at" in seen, "the operator ended in the call that made the result"
    assert seen["live_timers"] == []
    assert "release" in end.ran and "heap trim" in end.ran
    assert jobs.manager.last.state == "finished" and jobs.manager.last.task is None
    assert bpy.data.images.get("photo_x2") is not None


def test_a_result_saved_at_save_result_to_is_the_files_bytes_the_pump_wrote(tmp_path, monkeypatch):
    """Save Result To (an 8-bit PNG for a byte source): the file there is the PNG the pump deflated
    over several calls, written whole by the add-on's atomic writer; the image reads it (not packed).
    Before, Blender's writer converted and compressed the whole result in the call that applied it."""
    path = byte_source(tmp_path)
    out = tmp_path / "saved.png"
    deflate = Deflate(monkeypatch)
    seen = run_modal(path, deflate, output_path=str(out))
    row = 1 + 4 * RESULT
    check_spread(seen, deflate, (MAX_PIXELS_PER_CALL // RESULT) * row, RESULT * row)

    image = bpy.data.images[seen["images"][-1][0]]
    assert image.packed_file is None and Path(bpy.path.abspath(image.filepath)) == out
    decoded = np.asarray(PILImage.open(out))
    expected = np.floor(np.clip(image_io.to_rgba(seen["result"]) * 255.0 + 0.5, 0, 255)).astype(np.uint8)
    np.testing.assert_array_equal(decoded, expected)
    np.testing.assert_array_equal(np.round(image_io.image_to_array(image) * 255.0).astype(np.uint8), expected)
    assert list(tmp_path.glob("*.tmp*")) == []


def test_a_float_result_saved_at_save_result_to_reads_back_exactly(tmp_path, monkeypatch):
    """The same for a float source and an .exr file: the EXR the pump wrote, whose pixels read back
    as the premultiplied floats Blender keeps (before: Blender's save_render of the whole result)."""
    path = float_source(tmp_path)
    out = tmp_path / "saved.exr"
    deflate = Deflate(monkeypatch)
    seen = run_modal(path, deflate, output_path=str(out))
    check_spread(seen, deflate, MAX_PIXELS_PER_CALL * 16, RESULT * RESULT * 16)

    image = bpy.data.images[seen["images"][-1][0]]
    assert image.packed_file is None and Path(bpy.path.abspath(image.filepath)) == out and image.is_float
    expected = colour.premultiply(colour.from_model_rgb(image_io.to_rgba(seen["result"]), True))
    np.testing.assert_array_equal(image_io.image_to_array(image), expected)


def test_remove_background_replace_driven_by_timer_events_writes_the_matte_into_the_source(tmp_path):
    """Replace through timer calls (bench/worker.py --ops-replace measures its calls): the driver
    of tests/modal_standins.py runs the operator's own methods, ``gather``'s super() included."""
    from builders_families import ben2_like_model

    driver = driver_class(image_ops.LEAN_IMAGE_AI_OT_remove_background, "lean_image_ai_test.drive_replace",
                          "LEANTEST_OT_drive_replace")
    model, path = ben2_like_model(tmp_path / "ben2.onnx", size=64), byte_source(tmp_path)

    def script(op):
        ctx = StandInContext()
        state = op.start_modal(ctx)
        deadline = time.monotonic() + 300
        while state == {"RUNNING_MODAL"}:
            assert time.monotonic() < deadline, "the job did not end in time"
            state = op.modal(ctx, TIMER)
            time.sleep(0.005)
        return state

    bpy.utils.register_class(driver)
    try:
        before = set(bpy.data.images)
        state = drive(bpy.ops.lean_image_ai_test.drive_replace, script, filepath=str(path), model_path=str(model),
                      replace=True)
    finally:
        bpy.utils.unregister_class(driver)
    assert state == {"FINISHED"}
    [image] = [image for image in bpy.data.images if image not in before]  # the source itself, nothing new
    assert Path(bpy.path.abspath(image.filepath_raw)) == path
    got, stored = image_io.image_to_array(image), np.asarray(PILImage.open(path)) / 255.0
    assert np.abs(got[..., :3] - stored[..., :3]).max() <= 1 / 255 + 1e-6  # colour untouched
    assert np.abs(got[..., 3] - stored[..., 3]).max() > 0.1  # the matte went into its alpha


def replace_driven(tmp_path, path: Path, deflate: Deflate) -> dict:
    """Replace on ``path`` through timer calls, counting deflate per call; the matte and the last call."""
    from builders_families import ben2_like_model

    driver = driver_class(image_ops.LEAN_IMAGE_AI_OT_remove_background, "lean_image_ai_test.drive_replace_spread",
                          "LEANTEST_OT_drive_replace_spread")
    model, seen = ben2_like_model(tmp_path / "ben2.onnx", size=64), {}

    def keep_result(job):
        seen["matte"] = np.array(job.result.rgba[..., 3])

    def script(op):
        ctx = StandInContext()
        state = op.start_modal(ctx)
        deadline = time.monotonic() + 300
        while state == {"RUNNING_MODAL"}:
            assert time.monotonic() < deadline, "the job did not end in time"
            deflate.call += 1
            state = op.modal(ctx, TIMER)
            time.sleep(0.005)
        seen["last"] = deflate.call
        return state

    bpy.utils.register_class(driver)
    jobs.manager.on_end.append(keep_result)
    try:
        seen["state"] = drive(bpy.ops.lean_image_ai_test.drive_replace_spread, script, filepath=str(path),
                              model_path=str(model), replace=True)
    finally:
        jobs.manager.on_end.remove(keep_result)
        bpy.utils.unregister_class(driver)
    return seen


def test_remove_background_replace_packs_the_cut_out_written_over_several_calls(tmp_path, monkeypatch):
    """Replace of a byte source: the cut-out's PNG is deflated by the job's pump over several timer
    calls, and the call that swaps it into the source deflates nothing. Before, that call wrote the
    pixels (foreach_set) and Blender's pack() compressed them whole (0.48 s at 2048x2048)."""
    path, deflate = byte_source(tmp_path), Deflate(monkeypatch)
    seen = replace_driven(tmp_path, path, deflate)
    assert seen["state"] == {"FINISHED"}
    row = 1 + 4 * SIDE
    assert len(deflate.fed) >= 2, f"the cut-out was deflated in one timer call: {deflate.fed}"
    assert max(deflate.fed.values()) <= (MAX_PIXELS_PER_CALL // SIDE) * row, deflate.fed
    assert sum(deflate.fed.values()) >= SIDE * row  # the whole cut-out went through deflate
    assert seen["last"] not in deflate.fed, "the call that swaps the cut-out in also deflates"

    [image] = [image for image in bpy.data.images if image.packed_file is not None]
    assert Path(bpy.path.abspath(image.filepath_raw)) == path  # the source itself, its file kept
    packed = np.asarray(PILImage.open(io.BytesIO(image.packed_file.data)))
    stored = np.asarray(PILImage.open(path))
    np.testing.assert_array_equal(packed[..., :3], stored[..., :3])  # colour untouched
    alpha = np.floor(np.clip(seen["matte"] * 255.0 + 0.5, 0, 255)).astype(np.uint8)
    np.testing.assert_array_equal(packed[..., 3], alpha)  # the matte, as Blender rounds it into bytes
    np.testing.assert_array_equal(np.round(image_io.image_to_array(image) * 255).astype(np.uint8), packed)


def test_remove_background_replace_of_a_float_source_packs_the_exr_written_over_several_calls(tmp_path, monkeypatch):
    """Replace of a float EXR source: the cut-out's float EXR is deflated by the job's pump over
    several timer calls, none in the call that packs it into the source; the source then reads it
    as written (scene-linear, premultiplied) and its alpha is the matte. Before, that call wrote
    the pixels (foreach_set) and Blender's pack() wrote the EXR whole (0.54-0.98 s at 2048x2048)."""
    path, deflate = float_source(tmp_path), Deflate(monkeypatch)
    seen = replace_driven(tmp_path, path, deflate)
    assert seen["state"] == {"FINISHED"}
    row = 4 * 4 * SIDE  # RGBA, 32-bit floats
    assert len(deflate.fed) >= 2, f"the cut-out was deflated in one timer call: {deflate.fed}"
    assert max(deflate.fed.values()) <= (MAX_PIXELS_PER_CALL // SIDE) * row, deflate.fed
    assert sum(deflate.fed.values()) >= SIDE * row  # the whole cut-out went through deflate
    assert seen["last"] not in deflate.fed, "the call that swaps the cut-out in also deflates"

    [image] = [image for image in bpy.data.images if image.packed_file is not None]
    assert Path(bpy.path.abspath(image.filepath_raw)) == path  # the source itself, its file kept
    assert image.packed_file.data[:4] == (20000630).to_bytes(4, "little") and image.file_format == "OPEN_EXR"
    assert (image.alpha_mode, image.colorspace_settings.name) == ("PREMUL", "Linear Rec.709")
    np.testing.assert_allclose(image_io.image_to_array(image)[..., 3], seen["matte"], atol=1e-6)


def rgba16_source(folder: Path) -> Path:
    """A 16-bit RGBA PNG (Blender reads it into a float buffer, linearised, alpha straight in the file)."""
    y, x = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    values = np.round(np.stack([x, y, (x + y) / 2, 0.25 + 0.75 * y], axis=-1) * 65535).astype(">u2")
    rows = b"".join(b"\0" + row.tobytes() for row in values)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", SIDE, SIDE, 16, 6, 0, 0, 0)  # 16 bits, RGBA
    path = folder / "plate16.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("source", [byte_source, float_source, rgba16_source])
def test_remove_background_replace_gives_the_pixels_blenders_own_write_gave(tmp_path, monkeypatch, source):
    """A source's cut-out packed from the pump's file (an 8-bit PNG for a byte source, a float EXR
    for a float one) reads back as the pixels written whole (``foreach_set`` then Blender's pack())
    gave: the same source replaced both ways, read again from the packed file too (as after undo,
    redo or reopen). ``float_source`` is an EXR Blender reads as sRGB, the 16-bit PNG is sRGB with
    straight alpha: the packed EXR of linear, premultiplied colour was decoded as the source was
    (colour linearised or premultiplied a second time), even Blender's own pack once re-read."""
    from builders_families import ben2_like_model

    model, path = ben2_like_model(tmp_path / "ben2.onnx", size=64), source(tmp_path)
    written, reread, formats = [], [], []
    for whole in (True, False):
        with monkeypatch.context() as patch:
            if whole:
                patch.setattr(image_ops, "_packs_cutout_in_place", lambda inputs: False)
            bpy.ops.lean_image_ai.remove_background(filepath=str(path), model_path=str(model), replace=True)
        [image] = [image for image in bpy.data.images if image.packed_file is not None]
        written.append(image_io.image_to_array(image))
        image.buffers_free()
        reread.append(image_io.image_to_array(image))
        formats.append(image.file_format)
        bpy.data.images.remove(image)
    assert formats == ["PNG" if source is byte_source else "OPEN_EXR"] * 2
    np.testing.assert_array_equal(written[1], written[0])
    np.testing.assert_array_equal(reread[0], written[0])  # Blender's own pack read back
    np.testing.assert_array_equal(reread[1], written[0])


class JpegRows:
    """Rows the add-on's JPEG encoder codes per timer call (``deflate.call``: the driver's count)."""

    def __init__(self, monkeypatch, deflate: Deflate):
        from lean_image_ai.models.file_bytes import jpeg

        self.rows: dict[int, int] = {}
        real_write = jpeg.JpegFile._write

        def write(encoder, band, start):
            self.rows[deflate.call] = self.rows.get(deflate.call, 0) + band.shape[0]
            return real_write(encoder, band, start)

        monkeypatch.setattr(jpeg.JpegFile, "_write", write)


def test_an_upscale_saved_to_jpeg_is_encoded_over_several_calls_with_blenders_pixels(tmp_path, monkeypatch):
    """Save Result To a .jpg (a format other than the result's packed PNG): the pump encodes the
    JPEG a band per call beside the packed file, the applying call only writes its bytes, and the
    file decodes to the pixels Blender's writer saved (the old path, forced: save_file gives None).
    Before, Blender's writer converted and encoded the whole result in the call that applied it."""
    path = byte_source(tmp_path)
    old_out, out = tmp_path / "blender.jpg", tmp_path / "saved.jpg"
    with monkeypatch.context() as old_path:
        old_path.setattr(image_ops.LEAN_IMAGE_AI_OT_upscale, "save_file", lambda self, inputs, result: None,
                         raising=False)  # before: no such step
        before = run_modal(path, Deflate(old_path), output_path=str(old_out))
    old_image = bpy.data.images[before["images"][-1][0]]
    old_pixels = image_io.image_to_array(old_image)
    bpy.data.images.remove(old_image)

    deflate = Deflate(monkeypatch)
    jpeg_rows = JpegRows(monkeypatch, deflate)
    seen = run_modal(path, deflate, output_path=str(out))
    assert seen["state"] == {"FINISHED"}
    applied = next(index for index, images in enumerate(seen["images"]) if images)
    assert sum(jpeg_rows.rows.values()) == RESULT and len(jpeg_rows.rows) >= 2, jpeg_rows.rows
    assert max(jpeg_rows.rows.values()) <= max(16, MAX_PIXELS_PER_CALL // RESULT), jpeg_rows.rows
    assert max(jpeg_rows.rows) < applied and applied not in deflate.fed, "the applying call encoded"
    check_spread(seen, deflate, (MAX_PIXELS_PER_CALL // RESULT) * (1 + 4 * RESULT), RESULT * (1 + 4 * RESULT))

    np.testing.assert_array_equal(np.asarray(PILImage.open(out)), np.asarray(PILImage.open(old_out)))
    image = bpy.data.images[seen["images"][-1][0]]
    assert image.packed_file is not None and image.use_fake_user  # kept, as the old path packed it
    np.testing.assert_array_equal(image_io.image_to_array(image), old_pixels)
    assert list(tmp_path.glob("*.tmp*")) == []


def test_cancel_while_the_jpeg_at_save_result_to_is_encoded_writes_nothing(tmp_path, monkeypatch):
    path = byte_source(tmp_path)
    out = tmp_path / "saved.jpg"
    deflate = Deflate(monkeypatch)
    jpeg_rows = JpegRows(monkeypatch, deflate)
    seen = run_modal(path, deflate, output_path=str(out), cancel_when=lambda: jpeg_rows.rows)
    assert "cancelled_at" in seen and seen["state"] == {"CANCELLED"}
    assert sum(jpeg_rows.rows.values()) < RESULT, "the JPEG was whole before Esc"
    assert not out.exists() and list(tmp_path.glob("*.tmp*")) == []
    assert all(images == [] for images in seen["images"]), seen["images"]


def depth_driven(tmp_path, path: Path, out: Path, monkeypatch, tag: str, *, old_path: bool = False) -> dict:
    """Estimate Depth (a DA3-like net) on ``path`` through timer calls, saving at ``out``: the
    depth image's pixels, the report's summary, the JPEG rows coded per call, the bytes deflated per
    call. ``old_path``: as before this step existed (save_file gives None, and an EXR is not the
    pump's file: Blender's writer saves in the applying call)."""
    from builders_families import da3_like_model

    real = image_ops.LEAN_IMAGE_AI_OT_estimate_depth
    seen = {}
    with monkeypatch.context() as patch:
        if old_path:
            patch.setattr(real, "save_file", lambda self, inputs, result: None, raising=False)
        apply = real.apply
        patch.setattr(real, "apply", lambda self, context, inputs, result: seen.setdefault(
            "summary", apply(self, context, inputs, result)))
        driver = driver_class(real, f"lean_image_ai_test.drive_depth_{tag}", f"LEANTEST_OT_drive_depth_{tag}")
    model = da3_like_model(tmp_path / "da3.onnx")
    with monkeypatch.context() as counting:  # this run's counters only
        deflate = Deflate(counting)
        jpeg_rows = JpegRows(counting, deflate)
        if old_path:
            counting.setattr(image_ops.results, "made_for_output", lambda output, *_: output is None)

        def script(op):
            ctx = StandInContext()
            before = set(bpy.data.images)
            state = op.start_modal(ctx)
            while state == {"RUNNING_MODAL"}:
                deflate.call += 1
                state = op.modal(ctx, TIMER)
                if "applied" not in seen and any(image not in before and image.filepath != str(path)  # not the source
                                                 for image in bpy.data.images):
                    seen["applied"] = deflate.call
                time.sleep(0.005)
            return state

        bpy.utils.register_class(driver)
        try:
            seen["state"] = drive(getattr(bpy.ops.lean_image_ai_test, f"drive_depth_{tag}"), script,
                                  filepath=str(path), model_path=str(model), make_plane=False,
                                  output_path=str(out), overwrite=True)
        finally:
            bpy.utils.unregister_class(driver)
    image = next(image for image in bpy.data.images if image.name.endswith("_depth"))
    seen["pixels"], seen["jpeg_rows"], seen["fed"] = image_io.image_to_array(image), jpeg_rows.rows, deflate.fed
    seen["reads"] = None if image.packed_file is not None else Path(bpy.path.abspath(image.filepath))
    bpy.data.images.remove(image)
    return seen


@pytest.mark.parametrize("suffix", [".jpg", ".png"])
def test_depth_saved_normalised_is_what_blenders_writer_saved(tmp_path, monkeypatch, suffix):
    """Depth at Save Result To in a format that normalises it: the same file pixels, depth image and
    range note as Blender's writer gave (the old path, forced); a .jpg is encoded by the pump over
    several calls, none of them the applying one (a 16-bit .png: Blender's writer, until
    file_bytes.product_file writes 16-bit PNG)."""
    pixels = (np.random.default_rng(7).random((1536, 2048, 4)) * 255).astype(np.uint8)
    path = tmp_path / "wide.png"
    PILImage.fromarray(pixels, "RGBA").save(path)
    old = depth_driven(tmp_path, path, tmp_path / f"blender{suffix}", monkeypatch, "old", old_path=True)
    new = depth_driven(tmp_path, path, tmp_path / f"saved{suffix}", monkeypatch, "new")

    assert old["state"] == new["state"] == {"FINISHED"}
    assert old["summary"].replace("blender", "saved") == new["summary"]
    assert "were mapped to 0..1 (write .exr to keep them)" in new["summary"]
    np.testing.assert_array_equal(new["pixels"], old["pixels"])
    np.testing.assert_array_equal(np.asarray(PILImage.open(tmp_path / f"saved{suffix}")),
                                  np.asarray(PILImage.open(tmp_path / f"blender{suffix}")))
    if suffix == ".jpg":
        rows = new["jpeg_rows"]
        assert sum(rows.values()) == 1536 and len(rows) >= 2 and max(rows) < new["applied"], rows


def test_depth_saved_as_exr_is_the_file_the_pump_wrote_with_blenders_pixels(tmp_path, monkeypatch):
    """Depth at Save Result To an .exr: the EXR the pump deflated over several calls is the file
    there (Blender's writer kept a Non-Color float image's values as full floats: the same pixels),
    and the depth image reads it as before. Before, Blender's writer saved the whole image in the
    call that applied it."""
    pixels = (np.random.default_rng(7).random((1536, 2048, 4)) * 255).astype(np.uint8)
    path = tmp_path / "wide.png"
    PILImage.fromarray(pixels, "RGBA").save(path)
    old = depth_driven(tmp_path, path, tmp_path / "blender.exr", monkeypatch, "old_exr", old_path=True)
    new = depth_driven(tmp_path, path, tmp_path / "saved.exr", monkeypatch, "new_exr")

    assert old["state"] == new["state"] == {"FINISHED"}
    assert old["summary"].replace("blender", "saved") == new["summary"]
    assert old["reads"] == tmp_path / "blender.exr" and new["reads"] == tmp_path / "saved.exr"
    np.testing.assert_array_equal(new["pixels"], old["pixels"])
    assert len(new["fed"]) >= 2 and max(new["fed"]) < new["applied"], new["fed"]


def cutout_driven(tmp_path, path: Path, out: Path, monkeypatch, tag: str, *, old_path: bool = False) -> dict:
    """Remove Background (a new cut-out image) on ``path`` through timer calls, saving at ``out``:
    the cut-out's pixels, whether it reads ``out``, the bytes deflated and JPEG rows coded per call.
    ``old_path``: save_file gives None and no file at Save Result To is the pump's (Blender's writer)."""
    from builders_families import ben2_like_model

    real = image_ops.LEAN_IMAGE_AI_OT_remove_background
    with monkeypatch.context() as patch:
        if old_path:
            patch.setattr(real, "save_file", lambda self, inputs, result: None, raising=False)
        driver = driver_class(real, f"lean_image_ai_test.drive_cutout_{tag}", f"LEANTEST_OT_drive_cutout_{tag}")
    model, seen = ben2_like_model(tmp_path / "ben2.onnx", size=64), {}
    with monkeypatch.context() as counting:
        deflate = Deflate(counting)
        jpeg_rows = JpegRows(counting, deflate)
        if old_path:
            counting.setattr(image_ops.results, "made_for_output", lambda output, *_: output is None)

        def script(op):
            ctx = StandInContext()
            before = set(bpy.data.images)
            state = op.start_modal(ctx)
            while state == {"RUNNING_MODAL"}:
                deflate.call += 1
                state = op.modal(ctx, TIMER)
                if "applied" not in seen and any(image not in before and image.filepath != str(path)  # not the source
                                                 for image in bpy.data.images):
                    seen["applied"] = deflate.call
                time.sleep(0.005)
            return state

        bpy.utils.register_class(driver)
        try:
            seen["state"] = drive(getattr(bpy.ops.lean_image_ai_test, f"drive_cutout_{tag}"), script,
                                  filepath=str(path), model_path=str(model), output_path=str(out), overwrite=True)
        finally:
            bpy.utils.unregister_class(driver)
    image = bpy.data.images["photo_cutout"]
    seen["pixels"], seen["jpeg_rows"], seen["fed"] = image_io.image_to_array(image), jpeg_rows.rows, deflate.fed
    seen["reads"] = None if image.packed_file is not None else Path(bpy.path.abspath(image.filepath))
    bpy.data.images.remove(image)
    return seen


def test_a_cut_out_saved_as_png_is_the_file_the_pump_deflated_with_blenders_pixels(tmp_path, monkeypatch):
    """Remove Background's cut-out at Save Result To a .png (a byte source): the PNG the pump
    deflated, which the cut-out reads, with the file pixels and the image Blender's writer gave (the
    old path, forced); the applying call deflates nothing. Before, Blender's writer saved the whole
    cut-out in the applying call."""
    path = byte_source(tmp_path)
    old = cutout_driven(tmp_path, path, tmp_path / "blender.png", monkeypatch, "old", old_path=True)
    new = cutout_driven(tmp_path, path, tmp_path / "saved.png", monkeypatch, "new")

    assert old["state"] == new["state"] == {"FINISHED"}
    np.testing.assert_array_equal(np.asarray(PILImage.open(tmp_path / "saved.png")),
                                  np.asarray(PILImage.open(tmp_path / "blender.png")))
    np.testing.assert_array_equal(new["pixels"], old["pixels"])
    assert new["fed"] and max(new["fed"]) < new["applied"] and new["applied"] not in new["fed"], new["fed"]
    assert old["reads"] == tmp_path / "blender.png" and new["reads"] == tmp_path / "saved.png"


def replace_saved(tmp_path, path: Path, out: Path, monkeypatch, tag: str, *, old_path: bool = False,
                  cancel_mid_encode: bool = False, non_color: bool = False) -> dict:
    """Replace on ``path`` through timer calls with Save Result To ``out``: the bytes deflated per
    call, the call that applied it, the source's pixels (as written, and read again from its packed
    file, as after undo or reopen). ``old_path``: the cut-out written whole, saved and packed by
    Blender's writer (as before). ``cancel_mid_encode``: Esc once a call has deflated some of it.
    ``non_color``: the source opened before as a Non-Color image (values, not colour)."""
    from builders_families import ben2_like_model

    model, seen = ben2_like_model(tmp_path / "ben2.onnx", size=64), {}
    if non_color:  # the job takes the image already open (check_existing)
        bpy.data.images.load(str(path), check_existing=True).colorspace_settings.name = "Non-Color"
    driver = driver_class(image_ops.LEAN_IMAGE_AI_OT_remove_background, f"lean_image_ai_test.drive_replace_{tag}",
                          f"LEANTEST_OT_drive_replace_{tag}")
    with monkeypatch.context() as patch:
        deflate = Deflate(patch)
        if old_path:
            patch.setattr(image_ops, "_packs_cutout_in_place", lambda inputs: False)

        def script(op):
            ctx = StandInContext()
            state = op.start_modal(ctx)
            while state == {"RUNNING_MODAL"}:
                if cancel_mid_encode and deflate.fed and "fed_before_esc" not in seen:
                    seen["fed_before_esc"] = dict(deflate.fed)
                    op.modal(ctx, ESC)
                deflate.call += 1
                state = op.modal(ctx, TIMER)
                if "applied" not in seen and (out.exists() or any(i.packed_file for i in bpy.data.images)):
                    seen["applied"] = deflate.call
                time.sleep(0.005)
            return state

        bpy.utils.register_class(driver)
        try:
            seen["state"] = drive(getattr(bpy.ops.lean_image_ai_test, f"drive_replace_{tag}"), script,
                                  filepath=str(path), model_path=str(model), replace=True, output_path=str(out),
                                  overwrite=True)
        finally:
            bpy.utils.unregister_class(driver)
    seen["fed"] = deflate.fed
    [image] = [image for image in bpy.data.images if Path(bpy.path.abspath(image.filepath_raw)) == path]
    seen["packed"] = image.packed_file is not None
    seen["pixels"] = image_io.image_to_array(image)
    image.buffers_free()
    seen["reread"] = image_io.image_to_array(image)
    bpy.data.images.remove(image)
    return seen


def saved_pixels(path: Path) -> np.ndarray:
    image = bpy.data.images.load(str(path), check_existing=False)
    try:
        return image_io.image_to_array(image)
    finally:
        bpy.data.images.remove(image)


@pytest.mark.parametrize(("source", "suffix"), [(byte_source, ".png"), (float_source, ".exr"), (byte_source, ".tif")])
def test_replace_saved_at_save_result_to_is_the_file_the_pump_wrote_with_blenders_pixels(
        tmp_path, monkeypatch, source, suffix):
    """Replace with Save Result To the file the pump makes anyway (an 8-bit PNG for a byte source, a
    float EXR for a float one): that file, deflated over several timer calls, none in the applying
    call, is written there and packed into the source; the saved file and the source give the pixels
    Blender's writer gave (the old path, forced). A .tif (a format the add-on encodes): the pump
    encodes it too, and the source gets the packed PNG. Before, the applying call wrote the cut-out
    whole and Blender's writer saved and packed it (0.5-1 s at 2048x2048)."""
    path = source(tmp_path)
    old = replace_saved(tmp_path, path, tmp_path / f"blender{suffix}", monkeypatch, "old_" + suffix[1:], old_path=True)
    new = replace_saved(tmp_path, path, tmp_path / f"saved{suffix}", monkeypatch, "new_" + suffix[1:])
    assert old["state"] == new["state"] == {"FINISHED"} and old["packed"] and new["packed"]
    np.testing.assert_array_equal(saved_pixels(tmp_path / f"saved{suffix}"), saved_pixels(tmp_path / f"blender{suffix}"))
    np.testing.assert_array_equal(new["pixels"], old["pixels"])
    np.testing.assert_array_equal(new["reread"], old["reread"])
    assert len(new["fed"]) >= 2, f"the cut-out was deflated in one timer call: {new['fed']}"
    assert max(new["fed"]) < new["applied"], new["fed"]  # none in the applying call, none after
    assert list(tmp_path.glob("*.tmp*")) == []


def test_esc_while_replaces_saved_file_is_encoded_writes_nothing(tmp_path, monkeypatch):
    """Esc while the pump deflates Replace's cut-out for Save Result To: no file there, the source
    neither packed nor changed."""
    path, out = byte_source(tmp_path), tmp_path / "saved.png"
    bpy.data.images.load(str(path), check_existing=True)  # open before: the job keeps it (else removes it)
    seen = replace_saved(tmp_path, path, out, monkeypatch, "esc", cancel_mid_encode=True)
    assert seen["state"] == {"CANCELLED"} and seen["fed_before_esc"], seen
    assert not out.exists() and list(tmp_path.glob("*.tmp*")) == [] and not seen["packed"]
    stored = np.asarray(PILImage.open(path))
    np.testing.assert_array_equal(np.round(seen["pixels"] * 255).astype(np.uint8), stored)


def test_replace_of_a_non_color_float_source_saved_as_exr_keeps_blenders_full_floats(tmp_path, monkeypatch):
    """A Non-Color float source (use_half_precision set, as Blender opens an EXR): Blender's writer
    saved its values as full floats, so the file at Save Result To is the pump's full-float EXR, not
    the half-float one a colour source gets: the file's values and the source's equal the old path's."""
    path = float_source(tmp_path)
    old = replace_saved(tmp_path, path, tmp_path / "blender.exr", monkeypatch, "old_data", old_path=True, non_color=True)
    new = replace_saved(tmp_path, path, tmp_path / "saved.exr", monkeypatch, "new_data", non_color=True)
    assert old["state"] == new["state"] == {"FINISHED"}
    np.testing.assert_array_equal(saved_pixels(tmp_path / "saved.exr"), saved_pixels(tmp_path / "blender.exr"))
    np.testing.assert_array_equal(new["pixels"], old["pixels"])
    assert max(new["fed"]) < new["applied"], new["fed"]
