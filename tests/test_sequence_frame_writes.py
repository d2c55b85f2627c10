"""Issue 37 item 3: a Process Sequence frame whose file the add-on writes (8- or 16-bit PNG, 8- or
16-bit TIFF, float EXR from a float source, JPEG) is encoded a band per timer call and written to its
temporary file as the bands come, renamed whole by the add-on's atomic writer in the last call (Blender's
writer took 0.4-0.5 s of the main thread for a 3840x2160 PNG);
the file holds what Blender's writer gave, and Esc mid-write leaves no partial file. Driven by
timer events as tests/test_cancelled_sequence.py (real bpy 5.0.1, the real onnxruntime). So are
MoGe-2's frame files (mesh, camera, normal map), written together in the frame's last call."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
bh.import_package()

import modal_standins  # noqa: E402
from lean_image_ai.models import file_bytes, files  # noqa: E402
from lean_image_ai.models.adapters import moge2_mesh  # noqa: E402
from lean_image_ai.models.file_bytes import bands  # noqa: E402
from lean_image_ai.models.result_images import ImageProduct  # noqa: E402
from lean_image_ai.operators import batch_ops, jobs, model_job, results  # noqa: E402
from modal_standins import ESC, TIMER, StandInContext, driver_class  # noqa: E402
from onnx_builders import sr_model  # noqa: E402

LEANTEST_OT_drive_frame_writes = driver_class(
    batch_ops.LEAN_IMAGE_AI_OT_process_sequence, "lean_image_ai_test.drive_frame_writes", "LEANTEST_OT_drive_frame_writes"
)
SMALL_CALL = 4096  # pixels a call: a 96x128 result takes several calls


@pytest.fixture(scope="module", autouse=True)
def registered():
    with bh.registered_classes([*jobs.classes, *batch_ops.classes, LEANTEST_OT_drive_frame_writes]):
        yield


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    monkeypatch.setattr(bands, "MAX_PIXELS_PER_CALL", SMALL_CALL)
    yield from bh.fresh_blender(tmp_path, monkeypatch)
    jobs.manager.cancel_all()


def byte_frames(folder: Path, count: int, size: tuple[int, int] = (48, 64)) -> Path:
    folder.mkdir()
    for n in range(1, count + 1):
        rgba = (np.random.default_rng(n).random((*size, 4)) * 255).astype(np.uint8)
        PILImage.fromarray(rgba, "RGBA").save(folder / f"p_{n:04d}.png")
    return folder


def float_frames(folder: Path, count: int) -> Path:
    folder.mkdir()
    for n in range(1, count + 1):
        image = bpy.data.images.new(f"f{n}", 64, 48, alpha=True, float_buffer=True)
        pixels = np.random.default_rng(n).random((48, 64, 4)).astype(np.float32)
        pixels[..., 3] = 1.0
        image.pixels.foreach_set(pixels.ravel())
        image.filepath_raw = str(folder / f"p_{n:04d}.exr")
        image.file_format = "OPEN_EXR"
        image.save()
        bpy.data.images.remove(image)
    return folder


def sixteen_bit_frames(folder: Path, count: int) -> Path:
    """16-bit RGBA PNG frames (Blender's writer), partly transparent: the results are 16-bit too."""
    folder.mkdir()
    for n in range(1, count + 1):
        rgba = np.random.default_rng(n).random((48, 64, 4)).astype(np.float32)
        rgba[..., 3] = 0.2 + 0.8 * rgba[..., 3]
        results.save_product(folder / f"p_{n:04d}.png", ImageProduct(rgba, False, bits="16-bit"))
    return folder


FRAMES = {"8-bit": byte_frames, "16-bit": sixteen_bit_frames}


def stored_samples(path: Path) -> tuple[str, np.ndarray]:
    """(Pillow's raw mode, the samples as stored): a 16-bit file's read from Pillow's own decoders
    twice (high bytes, then low), as models/batch/image_files.py does; premultiplied stays so."""
    with PILImage.open(path) as image:
        rawmode = image.tile[0].args[0] if isinstance(image.tile[0].args, tuple) else image.tile[0].args
        if ";16" not in rawmode:
            return rawmode, np.asarray(image)
    order = {"N": "L" if sys.byteorder == "little" else "B"}.get(rawmode[-1], rawmode[-1])
    halves = []
    for byte_order in (order, {"B": "L", "L": "B"}[order]):
        with PILImage.open(path) as image:
            args = image.tile[0].args
            args = (f"RGBA;16{byte_order}", *args[1:]) if isinstance(args, tuple) else f"RGBA;16{byte_order}"
            image.tile = [image.tile[0]._replace(args=args)]
            image.load()
            halves.append(np.asarray(image).astype(np.uint16))
    return rawmode[:-1], (halves[0] << 8) | halves[1]


def blender_reads(path: Path) -> np.ndarray:
    image = bpy.data.images.load(str(path), check_existing=False)
    try:
        pixels = np.empty(len(image.pixels), np.float32)
        image.pixels.foreach_get(pixels)
        return pixels
    finally:
        bpy.data.images.remove(image)


def assert_same_file_pixels(ours: Path, blenders: Path) -> None:
    """The same samples stored the same way (bits, alpha associated or not), and so the same pixels
    for Pillow and for Blender itself."""
    (our_mode, our_samples), (their_mode, their_samples) = stored_samples(ours), stored_samples(blenders)
    assert our_mode == their_mode and our_samples.dtype == their_samples.dtype, (our_mode, their_mode)
    assert np.array_equal(our_samples, their_samples), (ours.name, np.argwhere(our_samples != their_samples)[:5])
    with PILImage.open(ours) as a, PILImage.open(blenders) as b:
        assert np.array_equal(np.asarray(a.convert("RGBA")), np.asarray(b.convert("RGBA")))
    assert np.array_equal(blender_reads(ours), blender_reads(blenders))


class Recorder:
    """Each FrameFile.pump: the timer call it ran in and the pixels it encoded."""

    def __init__(self, monkeypatch, on_written=None):
        self.timer_call, self.encoded, self.on_written = 0, [], on_written
        real = model_job.FrameFile.pump
        recorder = self

        def pump(frame_file, budget):
            before = sum(frame_file.made.calls)
            done = real(frame_file, budget)
            recorder.encoded.append((frame_file.path.name, recorder.timer_call, sum(frame_file.made.calls) - before))
            if done and recorder.on_written is not None:
                recorder.on_written(frame_file.path)
            return done

        monkeypatch.setattr(model_job.FrameFile, "pump", pump)

    def drive(self, ctx, **props):
        def script(op):
            self.op = op
            assert op.start_modal(ctx) == {"RUNNING_MODAL"}
            for _ in range(5000):
                self.timer_call += 1
                result = op.modal(ctx, TIMER)
                if result != {"RUNNING_MODAL"}:
                    return result
            raise AssertionError("the job did not end in time")

        return modal_standins.drive(bpy.ops.lean_image_ai_test.drive_frame_writes, script, **props)


def output_of(folder: Path, name: str = "") -> str:
    """Process Sequence's output: the folder (default names: PNG), a pattern (``f_####.jpg``), or a
    pattern of the suffix ``name`` (``.tif``)."""
    if not name:
        return str(folder) + "/"
    folder.mkdir(exist_ok=True)
    return str(folder / (name if "#" in name else f"p_####{name}"))


def blender_written(tmp_path, monkeypatch, args, name: str, suffix: str = "") -> Path:
    """The same frames written by Blender's writer (save_product), as before; ``suffix``: as output_of's ``name``."""
    out = tmp_path / name
    with monkeypatch.context() as patch:
        patch.setattr(file_bytes, "product_file", lambda path, product: None)
        assert bpy.ops.lean_image_ai.process_sequence(**args, output=output_of(out, suffix)) == {"FINISHED"}
    return out


# (input frames, output suffix): 8-bit PNG (the default for byte frames), 16-bit PNG (the default
# for 16-bit frames), 8- and 16-bit TIFF
FRAME_FILES = [("8-bit", ""), ("16-bit", ""), ("8-bit", ".tif"), ("16-bit", ".tif")]
FRAME_FILE_IDS = ["8-bit-png", "16-bit-png", "8-bit-tif", "16-bit-tif"]


@pytest.mark.parametrize(("kind", "suffix"), FRAME_FILES, ids=FRAME_FILE_IDS)
def test_frames_are_encoded_over_several_timer_calls_and_match_blenders_writer(tmp_path, monkeypatch, kind, suffix):
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    args = dict(family="upscale", source=str(FRAMES[kind](tmp_path / "in", 3)), model_path=str(model))
    reference = blender_written(tmp_path, monkeypatch, args, "blender", suffix)
    recorder = Recorder(monkeypatch)
    out = tmp_path / "banded"
    assert recorder.drive(StandInContext(), **args, output=output_of(out, suffix)) == {"FINISHED"}
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in reference.iterdir()) and len(names) == 3
    assert all(name.endswith(suffix or ".png") for name in names), names
    for name in names:
        per_call: dict[int, int] = {}
        for written, call, pixels in recorder.encoded:
            if written == name:
                per_call[call] = per_call.get(call, 0) + pixels
        assert sum(per_call.values()) == 96 * 128, name
        assert len([c for c, p in per_call.items() if p]) >= 96 * 128 // SMALL_CALL, per_call
        assert max(per_call.values()) <= SMALL_CALL, per_call
        assert_same_file_pixels(out / name, reference / name)


def test_exr_frames_of_a_float_source_match_blenders_writer(tmp_path, monkeypatch):
    openexr = pytest.importorskip("OpenEXR")
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    args = dict(family="upscale", source=str(float_frames(tmp_path / "in", 2)), model_path=str(model))
    reference = blender_written(tmp_path, monkeypatch, args, "blender")
    recorder = Recorder(monkeypatch)
    out = tmp_path / "banded"
    assert recorder.drive(StandInContext(), **args, output=str(out) + "/") == {"FINISHED"}
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in reference.iterdir()) and len(names) == 2 and names[0].endswith(".exr")
    assert {name for name, _, pixels in recorder.encoded if pixels} == set(names)
    for name in names:
        with openexr.File(str(out / name)) as ours, openexr.File(str(reference / name)) as blenders:
            a, b = ours.channels(), blenders.channels()
            for channel in "RGBA":
                got = a[channel].pixels if channel in a else a["RGBA"].pixels[..., "RGBA".index(channel)]
                want = b[channel].pixels if channel in b else b["RGBA"].pixels[..., "RGBA".index(channel)]
                assert np.array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32)), (name, channel)


def exr_rgba(path: Path) -> np.ndarray:
    import OpenEXR

    with OpenEXR.File(str(path)) as file:
        channels = file.channels()
        if "RGBA" in channels:
            return np.asarray(channels["RGBA"].pixels)
        return np.stack([np.asarray(channels[c].pixels) for c in "RGBA"], axis=-1)


@pytest.mark.parametrize("is_data", [True, False], ids=["values", "colour"])
def test_a_float_products_file_holds_what_blenders_writer_gives(tmp_path, is_data):
    pytest.importorskip("OpenEXR")
    rng = np.random.default_rng(3)
    pixels = (rng.random((40, 24), np.float32) * 7) if is_data else rng.random((40, 24, 3)).astype(np.float32)
    product = ImageProduct(pixels, is_data, bits="float")
    results.save_product(tmp_path / "blender.exr", product)
    made = file_bytes.product_file(tmp_path / "ours.exr", product)
    frame_file = model_job.FrameFile(tmp_path / "ours.exr", made)
    while not frame_file.pump(0.01):
        pass
    ours, blenders = exr_rgba(tmp_path / "ours.exr"), exr_rgba(tmp_path / "blender.exr")
    assert ours.dtype == blenders.dtype and np.array_equal(ours, blenders)


@pytest.mark.parametrize("is_data", [True, False], ids=["values", "colour"])
@pytest.mark.parametrize(("suffix", "bits"), [(".png", "16-bit"), (".tif", "8-bit"), (".tif", "16-bit"), (".tiff", "16-bit")])
def test_a_png_or_tiff_products_file_holds_what_blenders_writer_gives(tmp_path, is_data, suffix, bits):
    """Colour partly transparent (alpha 0 and 1 too), dark and out of range; values out of range."""
    rng = np.random.default_rng(5)
    if is_data:
        pixels = rng.random((80, 40), np.float32) * 1.4 - 0.2
    else:
        pixels = rng.random((80, 40, 4), np.float32)
        pixels[:8, :, 3], pixels[8:16, :, 3] = 0.0, 1.0
        pixels[16:32, :, :3] = pixels[16:32, :, :3] ** 6 * 1.3 - 0.1
    product = ImageProduct(pixels, is_data, bits=bits)
    results.save_product(tmp_path / f"blender{suffix}", product)
    made = file_bytes.product_file(tmp_path / f"ours{suffix}", product)
    frame_file = model_job.FrameFile(tmp_path / f"ours{suffix}", made)
    while not frame_file.pump(0.01):
        pass
    assert len([pixels for pixels in made.calls if pixels]) >= 80 * 40 // SMALL_CALL and max(made.calls) <= SMALL_CALL
    assert_same_file_pixels(tmp_path / f"ours{suffix}", tmp_path / f"blender{suffix}")


@pytest.mark.parametrize(("kind", "suffix"), FRAME_FILES, ids=FRAME_FILE_IDS)
def test_esc_while_a_frame_is_encoded_leaves_no_partial_file(tmp_path, monkeypatch, kind, suffix):
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    args = dict(family="upscale", source=str(FRAMES[kind](tmp_path / "in", 3)), model_path=str(model))
    ctx = StandInContext()
    recorder = Recorder(monkeypatch)
    real = model_job.FrameFile.pump
    written_at_esc = []

    def esc_in_frame_two(frame_file, budget):
        done = real(frame_file, budget)
        if frame_file.path.stem.endswith("0002") and not done and sum(frame_file.made.calls):
            written_at_esc.extend(files.leftover_temps(frame_file.path))  # its bands on disk so far
            recorder.op.modal(ctx, ESC)  # the artist presses Esc half way through frame 2's file
        return done

    monkeypatch.setattr(model_job.FrameFile, "pump", esc_in_frame_two)
    out = tmp_path / "cancelled"
    assert recorder.drive(ctx, **args, output=output_of(out, suffix)) == {"CANCELLED"}
    first = f"p_0001{suffix}" if suffix else "p_upscaled_0001.png"
    assert sorted(p.name for p in out.iterdir()) == [first]  # no temporary, no half file
    assert "kept the 1 frame(s) written before it (1)" in jobs.manager.last.error_text
    assert len(written_at_esc) == 1  # the frame's file was being written, and the cancel removed it


def geometry_frames(folder: Path, count: int) -> Path:
    """Frames for the seeded MoGe-2 (tests/builders_moge2.py): its mask is the red channel."""
    folder.mkdir()
    for n in range(1, count + 1):
        rng = np.random.default_rng(n)
        rgb = (rng.random((48, 64, 3)) * 255).astype(np.uint8)
        rgb[..., 0] = np.where(rng.random((48, 64)) < 0.9, 230, 10)
        PILImage.fromarray(rgb, "RGB").save(folder / f"p_{n:04d}.png")
    return folder


def geometry_args(tmp_path) -> dict:
    from builders_moge2 import moge2_like_model

    return dict(family="moge2", source=str(geometry_frames(tmp_path / "in", 3)),
                model_path=str(moge2_like_model(tmp_path / "m.onnx")))


class GeometryRecorder(Recorder):
    """Each GeometryFiles.pump (MoGe-2's frame files): its timer call, the pixels it encoded (mesh
    grid points and normal map pixels) and whether any of the frame's files existed after it."""

    def __init__(self, monkeypatch, during=None):
        self.timer_call, self.encoded, self.during = 0, [], during
        real = moge2_mesh.GeometryFiles.pump
        recorder = self

        def pump(files, budget):
            before = sum(files.mesh.calls) + sum(files.normals.calls)
            done = real(files, budget)
            pixels = sum(files.mesh.calls) + sum(files.normals.calls) - before
            there = [p.name for p in files.paths if p.exists()]
            recorder.encoded.append((files.path.name, recorder.timer_call, pixels, done, there))
            if recorder.during is not None:
                recorder.during(files, done)
            return done

        monkeypatch.setattr(moge2_mesh.GeometryFiles, "pump", pump)


def test_a_geometry_frames_files_are_made_over_several_timer_calls_as_the_one_call_write_makes_them(tmp_path, monkeypatch):
    """MoGe-2's mesh (PLY), camera (JSON) and normal map (EXR) of a frame: made a band per timer call,
    then all written in the frame's last call (none before it): the same PLY and JSON bytes and the
    same normal map pixels as the one-call write through Blender's writer."""
    monkeypatch.setattr(bands, "MAX_PIXELS_PER_CALL", 1024)  # 48x64 frames: three bands of each file
    args = geometry_args(tmp_path)
    reference = tmp_path / "one_call"
    with monkeypatch.context() as patch:
        patch.setattr(model_job.BlenderFrames, "stage", None)  # as before: the family's writer in the call
        assert bpy.ops.lean_image_ai.process_sequence(**args, output=str(reference) + "/") == {"FINISHED"}
    recorder = GeometryRecorder(monkeypatch)
    out = tmp_path / "banded"
    assert recorder.drive(StandInContext(), **args, output=str(out) + "/") == {"FINISHED"}
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in reference.iterdir()) and len(names) == 9, names
    for ply in [n for n in names if n.endswith(".ply")]:
        calls = [(call, pixels, done, there) for name, call, pixels, done, there in recorder.encoded if name == ply]
        assert sum(pixels for _, pixels, _, _ in calls) == 48 * 64 * 2, calls  # every grid point, every normal
        assert len({call for call, pixels, _, _ in calls if pixels}) >= 6 and max(p for _, p, _, _ in calls) <= 1024, calls
        assert all(there == [] for _, _, done, there in calls if not done), calls  # nothing on disk before the last call
        assert [len(there) for _, _, done, there in calls if done] == [3], calls  # then all three in it
        stem = ply[:-4]
        for name in (ply, f"{stem}.json"):
            assert (out / name).read_bytes() == (reference / name).read_bytes(), name
        ours, blenders = exr_rgba(out / f"{stem}_normal.exr"), exr_rgba(reference / f"{stem}_normal.exr")
        assert ours.dtype == blenders.dtype and np.array_equal(ours, blenders), stem


def test_esc_while_a_geometry_frame_is_made_leaves_none_of_its_files_and_skip_existing_finds_the_finished(
        tmp_path, monkeypatch):
    monkeypatch.setattr(bands, "MAX_PIXELS_PER_CALL", 1024)
    args = geometry_args(tmp_path)
    ctx = StandInContext()

    armed = [True]

    def esc_in_frame_two(files, done):
        if armed[0] and files.path.name.endswith("0002.ply") and not done and sum(files.normals.calls):
            armed[0] = False
            recorder.op.modal(ctx, ESC)  # Esc with frame 2's mesh made and its normal map half encoded

    recorder = GeometryRecorder(monkeypatch, esc_in_frame_two)
    out = tmp_path / "cancelled"
    assert recorder.drive(ctx, **args, output=str(out) + "/") == {"CANCELLED"}
    first = ["p_geometry_0001.json", "p_geometry_0001.ply", "p_geometry_0001_normal.exr"]
    assert sorted(p.name for p in out.iterdir()) == first  # no temporary, none of frame 2's files
    assert "kept the 1 frame(s) written before it (1)" in jobs.manager.last.error_text
    kept = {name: (out / name).read_bytes() for name in first}
    again = GeometryRecorder(monkeypatch)
    assert again.drive(StandInContext(), **args, output=str(out) + "/", skip_existing=True) == {"FINISHED"}
    assert {name for name, *_ in again.encoded} == {"p_geometry_0002.ply", "p_geometry_0003.ply"}  # frame 1 found
    assert len(list(out.iterdir())) == 9 and all((out / name).read_bytes() == data for name, data in kept.items())



def test_jpeg_frames_are_encoded_over_several_timer_calls_and_decode_to_blenders_pixels(tmp_path, monkeypatch):
    """Odd sizes (25x37 frames, x2: 50x74, not whole 16x16 MCUs); RGBA frames, alpha dropped as Blender does."""
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    args = dict(family="upscale", source=str(byte_frames(tmp_path / "in", 3, size=(25, 37))), model_path=str(model))
    reference = blender_written(tmp_path, monkeypatch, args, "blender", "f_####.jpg")
    recorder = Recorder(monkeypatch)
    out = tmp_path / "banded"
    assert recorder.drive(StandInContext(), **args, output=str(out / "f_####.jpg")) == {"FINISHED"}
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in reference.iterdir()) == ["f_0001.jpg", "f_0002.jpg", "f_0003.jpg"]
    for name in names:
        per_call: dict[int, int] = {}
        for written, call, pixels in recorder.encoded:
            if written == name:
                per_call[call] = per_call.get(call, 0) + pixels
        assert sum(per_call.values()) == 50 * 74 and max(per_call.values()) <= SMALL_CALL, per_call
        assert len([c for c, p in per_call.items() if p]) >= 2, per_call  # 16-row bands: no frame in one call
        ours, blenders = PILImage.open(out / name), PILImage.open(reference / name)
        assert ours.format == blenders.format == "JPEG" and ours.mode == blenders.mode == "RGB"
        ours, blenders = np.asarray(ours, np.int16), np.asarray(blenders, np.int16)
        if platform.machine().lower() in ("x86_64", "amd64"):  # Blender's libjpeg-turbo SIMD rounding (tests/test_jpeg_bytes.py)
            assert np.array_equal(ours, blenders), name
        else:
            assert np.abs(ours - blenders).mean() < 0.5, name


def test_esc_while_a_jpeg_frame_is_encoded_leaves_no_partial_file(tmp_path, monkeypatch):
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    args = dict(family="upscale", source=str(byte_frames(tmp_path / "in", 3)), model_path=str(model))
    ctx = StandInContext()
    recorder = Recorder(monkeypatch)
    real = model_job.FrameFile.pump
    pressed = []

    def esc_in_frame_two(frame_file, budget):
        done = real(frame_file, budget)
        if frame_file.path.name == "f_0002.jpg" and not done and sum(frame_file.made.calls) and not pressed:
            pressed.append(sum(frame_file.made.calls))
            recorder.op.modal(ctx, ESC)  # the artist presses Esc half way through frame 2's file
        return done

    monkeypatch.setattr(model_job.FrameFile, "pump", esc_in_frame_two)
    out = tmp_path / "cancelled"
    assert recorder.drive(ctx, **args, output=str(out / "f_####.jpg")) == {"CANCELLED"}
    assert pressed and pressed[0] < 96 * 128  # it was pressed with frame 2 part-encoded
    assert sorted(p.name for p in out.iterdir()) == ["f_0001.jpg"]  # no temporary, no half file
    assert PILImage.open(out / "f_0001.jpg").size == (128, 96)


def test_frames_written_after_the_worker_is_done_end_the_job_without_a_heartbeat_kill(tmp_path, monkeypatch):
    """A frame's file written over more time than the heartbeat deadline (a 4K 16-bit frame on a
    loaded machine) while the worker has finished and said so: the job ends as done, the
    worker is not taken for hung (it was: its last messages waited behind the write)."""
    import time

    from lean_image_ai.models.worker import client as worker_client

    monkeypatch.setenv(worker_client.HEARTBEAT_ENV, "2")
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    args = dict(family="upscale", source=str(byte_frames(tmp_path / "in", 3)), model_path=str(model))
    recorder = Recorder(monkeypatch)
    recorded = model_job.FrameFile.pump

    def slow(frame_file, budget):
        time.sleep(0.8)  # a frame's write spans about 3 s: over the deadline after the worker said it is done
        return recorded(frame_file, budget)

    monkeypatch.setattr(model_job.FrameFile, "pump", slow)
    out = tmp_path / "slow"
    assert recorder.drive(StandInContext(), **args, output=str(out) + "/") == {"FINISHED"}, jobs.manager.last.error_text
    assert len(list(out.iterdir())) == 3
