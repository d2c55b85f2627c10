"""Issue 37 item 3: a Process Sequence frame is read over several timer calls (Blender's load and
decode alone in its call, its pixels taken in the next, the conversion for the model a band a call),
so no call of the main thread reads a frame whole (0.1 s for a 3840x2160 PNG's decode, as much again
for its copy and conversion); the model gets the pixels the one-call read gave, and Esc mid-read
leaves no datablock. Driven by timer events as tests/test_sequence_frame_writes.py (real bpy 5.0.1,
the real onnxruntime)."""

from __future__ import annotations

import collections
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
from lean_image_ai.models import colour  # noqa: E402
from lean_image_ai.models.file_bytes import bands, read_steps  # noqa: E402
from lean_image_ai.models.worker import protocol, remote_batch  # noqa: E402
from lean_image_ai.operators import batch_ops, image_io, jobs, model_job, shot_ops, sources  # noqa: E402
from modal_standins import ESC, TIMER, StandInContext, driver_class  # noqa: E402
from onnx_builders import sr_model  # noqa: E402

LEANTEST_OT_drive_frame_reads = driver_class(
    batch_ops.LEAN_IMAGE_AI_OT_process_sequence, "lean_image_ai_test.drive_frame_reads", "LEANTEST_OT_drive_frame_reads"
)
LEANTEST_OT_drive_preview_read = driver_class(
    shot_ops.LEAN_IMAGE_AI_OT_preview_frame, "lean_image_ai_test.drive_preview_read", "LEANTEST_OT_drive_preview_read"
)
SMALL_CALL = 1024  # pixels a call: a 48x64 frame's conversion takes three calls or more
HEIGHT, WIDTH = 48, 64


@pytest.fixture(scope="module", autouse=True)
def registered():
    with bh.registered_classes([*jobs.classes, *batch_ops.classes, *shot_ops.classes, LEANTEST_OT_drive_frame_reads,
                                LEANTEST_OT_drive_preview_read]):
        yield


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    monkeypatch.setattr(bands, "MAX_PIXELS_PER_CALL", SMALL_CALL)
    yield from bh.fresh_blender(tmp_path, monkeypatch)
    jobs.manager.cancel_all()


def byte_frames(folder: Path, count: int, bits: int = 8) -> Path:
    folder.mkdir()
    for n in range(1, count + 1):
        values = np.random.default_rng(n).random((HEIGHT, WIDTH, 3))
        if bits == 8:
            PILImage.fromarray((values * 255).astype(np.uint8), "RGB").save(folder / f"p_{n:04d}.png")
        else:  # a 16-bit grey PNG (Pillow writes 16-bit as one channel): Blender reads it to a float buffer
            PILImage.fromarray((values[..., 0] * 65535).astype(np.uint16)).save(folder / f"p_{n:04d}.png")
    return folder


def float_frames(folder: Path, count: int) -> Path:
    folder.mkdir()
    for n in range(1, count + 1):
        image = bpy.data.images.new(f"f{n}", WIDTH, HEIGHT, alpha=True, float_buffer=True)
        pixels = np.random.default_rng(n).random((HEIGHT, WIDTH, 4)).astype(np.float32)
        pixels[..., 3] = 0.25 + 0.75 * pixels[..., 3]  # premultiplied colour, straightened for the model
        image.pixels.foreach_set(pixels.ravel())
        image.filepath_raw = str(folder / f"p_{n:04d}.exr")
        image.file_format = "OPEN_EXR"
        image.save()
        bpy.data.images.remove(image)
    return folder


def one_call_read(path: Path) -> np.ndarray:
    """The frame as the read before the steps gave it, all in one call (operators/model_job.py's
    read_frame of main 576c154, written out)."""
    image = image_io.load_image_file(str(path), check_existing=False)
    try:
        rgba, info = image_io.read_image(image)
        return sources.as_kind(colour.to_model_rgb(rgba, info.is_linear, premultiplied=info.premultiplied),
                               sources._kind(image))
    finally:
        bpy.data.images.remove(image)


class Recorder:
    """Each step of a frame's read (load, take, convert with its pixels) and each frame file's pump,
    with the timer call it ran in; the pixels each frame sent to the worker."""

    def __init__(self, monkeypatch, during=None):
        self.timer_call, self.events, self.sent, self.during = 0, [], {}, during
        real_pump, real_write, real_send = read_steps.ReadSteps.pump, model_job.FrameFile.pump, remote_batch.RemoteBatchRun._send
        recorder = self

        def pump(steps, budget):
            step = "convert" if steps._fill is not None else "take" if steps._loaded is not None else "load"
            before = sum(steps.converted)
            done = real_pump(steps, budget)
            recorder.events.append((recorder.timer_call, step, sum(steps.converted) - before))
            if recorder.during is not None:
                recorder.during(steps, step)
            return done

        def write(frame_file, budget):
            recorder.events.append((recorder.timer_call, "write", 0))
            return real_write(frame_file, budget)

        def send(batch, message):
            if isinstance(message, protocol.Frame):
                recorder.sent[message.number] = message.pixels
            return real_send(batch, message)

        monkeypatch.setattr(read_steps.ReadSteps, "pump", pump)
        monkeypatch.setattr(model_job.FrameFile, "pump", write)
        monkeypatch.setattr(remote_batch.RemoteBatchRun, "_send", send)

    def drive(self, ctx, operator=None, **props):
        def script(op):
            self.op = op
            assert op.start_modal(ctx) == {"RUNNING_MODAL"}
            for _ in range(5000):
                self.timer_call += 1
                result = op.modal(ctx, TIMER)
                if result != {"RUNNING_MODAL"}:
                    return result
            raise AssertionError("the job did not end in time")

        return modal_standins.drive(operator or bpy.ops.lean_image_ai_test.drive_frame_reads, script, **props)


def run_sequence(tmp_path, monkeypatch, source: Path):
    recorder = Recorder(monkeypatch)
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    out = tmp_path / "out"
    args = dict(family="upscale", source=str(source), model_path=str(model), output=str(out) + "/")
    assert recorder.drive(StandInContext(), **args) == {"FINISHED"}
    return recorder, out


def test_a_frames_read_is_spread_over_timer_calls_with_the_decode_alone_in_its_call(tmp_path, monkeypatch):
    recorder, out = run_sequence(tmp_path, monkeypatch, byte_frames(tmp_path / "in", 3))
    assert len(list(out.iterdir())) == 3
    events = recorder.events
    loads = [call for call, step, _ in events if step == "load"]
    assert len(loads) == 3, events
    for call in loads:  # Blender's decode: nothing else of a read or a write in its call
        assert [step for c, step, _ in events if c == call] == ["load"], (call, events)
    takes = [call for call, step, _ in events if step == "take"]
    assert len(takes) == 3 and not set(takes) & set(loads), events
    converted = [(call, pixels) for call, step, pixels in events if step == "convert" and pixels]
    assert sum(pixels for _, pixels in converted) == 3 * HEIGHT * WIDTH, events
    assert len(converted) >= 3 * HEIGHT * WIDTH // SMALL_CALL and max(p for _, p in converted) <= SMALL_CALL, converted
    per_call = collections.Counter(call for call, _, _ in events)
    assert all(count == 1 for count in per_call.values()), per_call  # one step of a read or a write a call


@pytest.mark.parametrize("kind", ["8-bit", "16-bit", "float"])
def test_the_model_gets_the_pixels_the_one_call_read_gave(tmp_path, monkeypatch, kind):
    if kind == "float":
        source = float_frames(tmp_path / "in", 2)
    else:
        source = byte_frames(tmp_path / "in", 2, bits=8 if kind == "8-bit" else 16)
    recorder, _ = run_sequence(tmp_path, monkeypatch, source)
    assert sorted(recorder.sent) == [1, 2]
    for number, sent in recorder.sent.items():
        path = next(source.glob(f"*_{number:04d}.*"))
        want = one_call_read(path)
        assert sent.dtype == want.dtype == {"8-bit": np.uint8, "16-bit": np.uint16, "float": np.float32}[kind]
        assert np.array_equal(sent, want), (kind, number)
        if kind == "8-bit":  # a byte PNG's stored values, exactly
            stored = np.asarray(PILImage.open(path).convert("RGBA"))
            assert np.array_equal(sent, stored)
    assert len([e for e in recorder.events if e[1] == "convert" and e[2]]) >= 2 * HEIGHT * WIDTH // SMALL_CALL


def test_esc_mid_read_leaves_no_datablock(tmp_path, monkeypatch):
    ctx = StandInContext()
    seen = []

    def esc_after_frame_twos_load(steps, step):
        if step == "load" and len([e for e in recorder.events if e[1] == "load"]) == 2:
            seen.append(len(bpy.data.images))  # frame 2 loaded: its datablock is there
            recorder.op.modal(ctx, ESC)

    recorder = Recorder(monkeypatch, during=esc_after_frame_twos_load)
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    args = dict(family="upscale", source=str(byte_frames(tmp_path / "in", 3)), model_path=str(model),
                output=str(tmp_path / "out") + "/")
    before = len(bpy.data.images)
    assert recorder.drive(ctx, **args) == {"CANCELLED"}
    assert seen == [before + 1]
    assert len(bpy.data.images) == before, list(bpy.data.images)
    assert 2 not in recorder.sent


@pytest.mark.parametrize("frames", ["png", "exr"])
def test_the_start_decodes_no_frame(tmp_path, monkeypatch, frames):
    """The runner asks for the first frame's kind at its start (its plan, then the job's name): each
    answer was Blender's load and decode of the frame in the start's call (1.0 s for a 4K EXR); the
    frame's header tells it now, and the results still follow it (EXR for a float source)."""
    source = byte_frames(tmp_path / "in", 3) if frames == "png" else float_frames(tmp_path / "in", 3)
    recorder, loads = Recorder(monkeypatch), []
    real = image_io.load_image_file

    def load(path, **kw):
        loads.append((recorder.timer_call, Path(path).name))
        return real(path, **kw)

    monkeypatch.setattr(image_io, "load_image_file", load)
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    args = dict(family="upscale", source=str(source), model_path=str(model), output=str(tmp_path / "out") + "/")
    assert recorder.drive(StandInContext(), **args) == {"FINISHED"}
    assert [name for call, name in loads if call == 0] == [], loads  # timer_call 0: start_modal
    assert sorted(name for _, name in loads) == [f"p_000{n}.{frames}" for n in (1, 2, 3)], loads
    assert {path.suffix for path in (tmp_path / "out").iterdir()} == {f".{frames}"}


def test_preview_frame_reads_its_frame_in_the_batchs_timer_calls(tmp_path, monkeypatch):
    """Preview Frame read its frame whole in the job's preparing call; now its batch reads it in steps."""
    loads = []
    real = image_io.load_image_file
    monkeypatch.setattr(image_io, "load_image_file", lambda path, **kw: loads.append(Path(path).name) or real(path, **kw))
    recorder = Recorder(monkeypatch)
    source = byte_frames(tmp_path / "in", 3)
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    result = recorder.drive(StandInContext(), bpy.ops.lean_image_ai_test.drive_preview_read, family="upscale",
                            source=str(source), model_path=str(model), frame=2)
    assert result == {"FINISHED"}
    assert loads == ["p_0002.png"], loads  # read once, by the steps
    assert [step for _, step, _ in recorder.events][:2] == ["load", "take"], recorder.events
    per_call = collections.Counter(call for call, _, _ in recorder.events)
    assert all(count == 1 for count in per_call.values()), per_call
    converted = [pixels for _, step, pixels in recorder.events if step == "convert" and pixels]
    assert sum(converted) == HEIGHT * WIDTH and max(converted) <= SMALL_CALL, recorder.events
    assert np.array_equal(recorder.sent[2], one_call_read(source / "p_0002.png"))
