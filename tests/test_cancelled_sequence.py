"""Issue 32 item 9, after Esc: a Process Sequence cancelled once frame 1 was written says what it
kept (the panel showed "nothing was changed"), and the memory picture shows the job the Memory
panel reports (it kept the previous job's). Driven through the modal path as in
tests/test_jobs_modal.py (real bpy 5.0.1, the real onnxruntime)."""

from __future__ import annotations

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
from lean_image_ai.models.worker import host_record  # noqa: E402
from lean_image_ai.operators import batch_ops, jobs, memory_ops, model_job  # noqa: E402
from lean_image_ai.runtime.measure import memory_plot  # noqa: E402
from modal_standins import ESC, StandInContext, driver_class, pump  # noqa: E402
from onnx_builders import sr_model  # noqa: E402
from recording_layout import RecordingLayout  # noqa: E402

panels = bh.import_submodule("ui.panels")

LEANTEST_OT_drive_sequence = driver_class(
    batch_ops.LEAN_IMAGE_AI_OT_process_sequence, "lean_image_ai_test.drive_sequence", "LEANTEST_OT_drive_sequence"
)


@pytest.fixture(scope="module", autouse=True)
def registered():
    with bh.registered_classes([*jobs.classes, *batch_ops.classes, LEANTEST_OT_drive_sequence]):
        yield


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs.manager, "on_end", [memory_ops._after_job])  # what post_register() hooks
    yield from bh.fresh_blender(tmp_path, monkeypatch)
    jobs.manager.cancel_all()


def picture_pixels() -> np.ndarray:
    image = bpy.data.images[memory_ops.PLOT_IMAGE]
    pixels = np.empty(len(image.pixels), np.float32)
    image.pixels.foreach_get(pixels)
    return np.rint(pixels.reshape(image.size[1], image.size[0], 4) * 255).astype(np.uint8)[::-1]


def test_esc_after_frame_one_says_what_was_kept_and_the_picture_follows_the_panel(tmp_path, monkeypatch):
    model = sr_model(tmp_path / "sr.onnx", scale=2)
    frames = tmp_path / "in"
    frames.mkdir()
    for n in range(1, 5):
        PILImage.fromarray((np.random.default_rng(n).random((24, 32, 3)) * 255).astype(np.uint8)).save(frames / f"p_{n:04d}.png")
    args = dict(family="upscale", source=str(frames), model_path=str(model))
    assert bpy.ops.lean_image_ai.process_sequence(**args, output=str(tmp_path / "first") + "/") == {"FINISHED"}
    previous = host_record.last_timeline
    assert np.array_equal(picture_pixels(), memory_plot.render(previous))

    ctx = StandInContext()
    live = {}
    real_write = model_job.FrameFile.pump  # a PNG frame's file: encoded a band per call, then written whole

    def write_then_esc(frame_file, budget):
        done = real_write(frame_file, budget)
        if done:
            live["op"].modal(ctx, ESC)  # the artist presses Esc once frame 1 is on disk
        return done

    monkeypatch.setattr(model_job.FrameFile, "pump", write_then_esc)

    def script(op):
        live["op"] = op
        assert op.start_modal(ctx) == {"RUNNING_MODAL"}
        return pump(op, ctx)

    out = tmp_path / "second"
    result = modal_standins.drive(bpy.ops.lean_image_ai_test.drive_sequence, script, **args, output=str(out) + "/")
    assert result == {"CANCELLED"}
    assert sorted(p.name for p in out.iterdir()) == ["p_upscaled_0001.png"]
    last = jobs.manager.last
    assert last.state == "cancelled" and "nothing was changed" not in last.error_text
    assert f"kept the 1 frame(s) written before it (1) in {out}" in last.error_text
    layout = RecordingLayout()
    panels._draw_job(layout, bpy.context)
    assert any("kept the 1 frame(s)" in text for text in layout.texts()), layout.texts()
    assert host_record.last_timeline is not previous
    assert host_record.last_timeline["outcome"] == host_record.last_job_memory["outcome"]
    assert np.array_equal(picture_pixels(), memory_plot.render(host_record.last_timeline)), "the picture of the job the panel shows"
    assert [i.name for i in bpy.data.images] == [memory_ops.PLOT_IMAGE]  # the cancelled job added no image
