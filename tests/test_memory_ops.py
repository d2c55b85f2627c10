"""operators/memory_ops.py with real bpy: Release now keeps the session objects, Unload all drops
them, both report what they freed; idle unload's timer (off in background mode, re-armed only
while sessions are cached), these with jobs run in this process (LEAN_IMAGE_AI_IN_PROCESS: the only
case where Blender's process has a runtime; the worker's side is tests/test_worker_blender.py); the leak check on the job engine (synchronous, and modal driven with
the stand-ins of tests/modal_standins.py); the event log and its folder; the memory picture; the
RAM budget preference."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402
import onnx_builders as ob  # noqa: E402

bpy = pytest.importorskip("bpy")
memory_ops = bh.import_submodule("operators.memory_ops")
prefs = bh.import_submodule("operators.prefs")
jobs = bh.import_submodule("operators.jobs")
from lean_image_ai.models.worker import host_record  # noqa: E402
from lean_image_ai.models.worker.remote_batch import IN_PROCESS_ENV  # noqa: E402
from lean_image_ai.runtime import get_runtime, mark_last  # noqa: E402
from lean_image_ai.runtime.log import event_file  # noqa: E402
from lean_image_ai.runtime.measure import memory_plot  # noqa: E402
from modal_standins import ESC, StandInContext, drive, driver_class, pump  # noqa: E402


@pytest.fixture
def runtime(monkeypatch):
    """This process's runtime, where jobs run here (LEAN_IMAGE_AI_IN_PROCESS)."""
    monkeypatch.setenv(IN_PROCESS_ENV, "1")
    with bh.registered_addon():
        rt = get_runtime()
        rt.clear("test setup")
        yield rt
        rt.clear("test teardown")


def grown_job(runtime, model):
    runtime.configure(release_memory=False)
    try:
        with runtime.operation("grow") as op:
            handle = op.session(model, "cpu")
            for _, last in mark_last(range(2)):
                op.run(handle, {"x": np.ones((1, 3, 320, 320), np.float32)}, last=last)
    finally:
        runtime.configure(release_memory=True)
    return handle


def test_release_now_keeps_the_session_and_unload_all_drops_it(runtime, tmp_path):
    handle = grown_job(runtime, ob.conv_model(tmp_path / "conv.onnx"))
    assert bpy.ops.lean_image_ai.release_memory() == {"FINISHED"}
    assert runtime.cached_sessions() == [handle] and handle.session is not None
    released = runtime.events.recent("memory_freed")[-1]
    assert released["action"] == "release now" and released["sessions"] == 0 and released["by"]["ram"] is not None
    assert bpy.ops.lean_image_ai.unload_all() == {"FINISHED"}
    assert runtime.cached_sessions() == [] and handle.evicted and handle.session is None
    assert runtime.events.recent("memory_freed")[-1]["sessions"] == 1


def test_both_refuse_while_a_job_runs(runtime, tmp_path):
    runtime.session(ob.conv_model(tmp_path / "conv.onnx", mid_channels=4), "cpu")
    saved = jobs.manager.current
    jobs.manager.current = jobs.BlenderJob("Depth")
    try:
        for op in (bpy.ops.lean_image_ai.release_memory, bpy.ops.lean_image_ai.unload_all):
            with pytest.raises(RuntimeError, match="'Depth' is using the loaded models"):
                op()
        assert len(runtime.cached_sessions()) == 1
    finally:
        jobs.manager.current = saved


def test_idle_unload_timer(runtime, tmp_path, monkeypatch):
    monkeypatch.setattr(prefs, "get_prefs", lambda context=None: prefs.DefaultPreferences(idle_unload_minutes=5))
    assert bpy.app.background
    assert memory_ops.arm_idle_unload() is False, "off in background mode"
    assert memory_ops.idle_tick() is None, "nothing cached: the timer stops"
    handle = runtime.session(ob.conv_model(tmp_path / "conv.onnx", mid_channels=4), "cpu")
    wait = memory_ops.idle_tick()
    assert wait is not None and 1.0 <= wait <= memory_ops.IDLE_CHECK_MAX_S, "re-armed while a session is cached"
    assert runtime.cached_sessions() == [handle]
    handle.last_used = time.time() - 301
    assert memory_ops.idle_tick() is None and handle.evicted and runtime.cached_sessions() == []
    monkeypatch.setattr(prefs, "get_prefs", lambda context=None: prefs.DefaultPreferences(idle_unload_minutes=0))
    runtime.session(ob.conv_model(tmp_path / "conv.onnx", mid_channels=4), "cpu")
    assert memory_ops.idle_tick() is None, "0 minutes: keep, and no timer"


def test_the_job_engine_arms_idle_unload_after_each_job(runtime):
    assert memory_ops._after_job in jobs.manager.on_end


def test_leak_check_operator(runtime):
    assert bpy.ops.lean_image_ai.leak_check(runs=10) == {"FINISHED"}


# ---- the leak check on the job engine ---------------------------------------------------------


LEANTEST_OT_drive_leak_check = driver_class(
    memory_ops.LEAN_IMAGE_AI_OT_leak_check, "lean_image_ai_test.drive_leak_check", "LEANTEST_OT_drive_leak_check"
)


@pytest.fixture
def leak_driver(runtime):
    bpy.utils.register_class(LEANTEST_OT_drive_leak_check)
    yield bpy.ops.lean_image_ai_test.drive_leak_check
    jobs.manager.cancel_all()
    bpy.utils.unregister_class(LEANTEST_OT_drive_leak_check)


def test_leak_check_runs_through_the_job_engine(runtime):
    assert bpy.ops.lean_image_ai.leak_check(runs=10) == {"FINISHED"}
    job = jobs.manager.last
    assert job.name == "Leak Check" and job.state == "finished" and job.result.verdict in ("stable", "growing")
    assert job.result.runs == 10 and job.stage == "run 10/10" and job.progress == 1.0


def test_leak_check_modal_on_the_worker_with_progress(leak_driver):
    ctx = StandInContext()

    def script(op):
        assert op.start_modal(ctx) == {"RUNNING_MODAL"}
        job = jobs.manager.current
        assert job.name == "Leak Check" and isinstance(job.task, jobs.PumpedTask)  # in the worker
        return job, pump(op, ctx, timeout=120)

    job, result = drive(leak_driver, script, runs=8)
    assert result == {"FINISHED"} and job.state == "finished" and job.result.runs == 8
    wm = ctx.window_manager
    assert wm.progress and wm.progress == sorted(wm.progress) and wm.live_timers == []
    assert any(text and text.startswith("Leak Check: run ") for text in ctx.workspace.status)
    assert jobs.manager.current is None and jobs.manager.last is job


def test_leak_check_esc_cancels(leak_driver):
    ctx = StandInContext()

    def script(op):
        assert op.start_modal(ctx) == {"RUNNING_MODAL"}
        job = jobs.manager.current
        assert op.modal(ctx, ESC) == {"RUNNING_MODAL"} and job.cancel_event.is_set()
        return job, pump(op, ctx, timeout=120)

    job, result = drive(leak_driver, script, runs=500)
    assert result == {"CANCELLED"} and job.state == "cancelled" and job.result is None
    assert "cancelled" in job.error_text and jobs.manager.current is None


# ---- the event log, the memory picture, the RAM budget preference ------------------------------


def test_the_event_log_is_written_and_its_folder_opens(runtime):
    log = event_file.current()
    assert log is not None and log.folder == prefs.log_folder()
    host_record.events.emit("test_marker", where="blender")  # the host's log: the worker's events replayed
    assert log.flush()
    assert '"event": "test_marker"' in log.path.read_text().splitlines()[-1]
    assert bpy.ops.lean_image_ai.open_log_folder() == {"FINISHED"}


def test_the_log_folder_without_the_variable_is_the_add_ons_user_folder(runtime, monkeypatch):
    monkeypatch.delenv(event_file.LOG_DIR_ENV)
    folder = prefs.log_folder()
    assert folder.parts[-2:] == ("lean_image_ai", "logs") and folder.parent.parent == Path(bpy.utils.user_resource("DATAFILES"))


@pytest.fixture
def upscale_input(tmp_path):
    from PIL import Image as PILImage

    path = tmp_path / "src.png"
    PILImage.fromarray((np.random.default_rng(0).random((96, 96, 3)) * 255).astype(np.uint8), "RGB").save(path)
    return path, ob.sr_model(tmp_path / "sr.onnx", scale=2)


def test_the_memory_plot_image_after_a_job(runtime, upscale_input):
    bh.reset_blender()
    source, model = upscale_input
    assert memory_ops.PLOT_IMAGE not in bpy.data.images
    assert bpy.ops.lean_image_ai.upscale(filepath=str(source), model_path=str(model), tile_size=48) == {"FINISHED"}
    image = bpy.data.images[memory_ops.PLOT_IMAGE]
    assert tuple(image.size) == (memory_plot.WIDTH, memory_plot.HEIGHT)
    pixels = np.empty(len(image.pixels), np.float32)
    image.pixels.foreach_get(pixels)
    rgba = np.rint(pixels.reshape(memory_plot.HEIGHT, memory_plot.WIDTH, 4) * 255).astype(np.uint8)[::-1]
    assert host_record.last_timeline is runtime.last_timeline  # a job run here hands its figures over too
    assert np.array_equal(rgba, memory_plot.render(host_record.last_timeline)), "the same picture as --memory-plot"
    left, top, right, bottom = memory_plot.plot_box(host_record.last_timeline)
    plot = rgba[top + 1 : bottom, left + 1 : right]  # the marks; the legend's swatches are below
    run = (plot[:, :, :3] == memory_plot.COLOURS["run"]).all(axis=2).any(axis=0)
    marks = int(np.count_nonzero(run[1:] & ~run[:-1]) + run[0])
    assert marks == host_record.last_job_memory["runs"] > 1
    assert bpy.ops.lean_image_ai.show_memory_plot() == {"FINISHED"}


def test_the_ram_budget_preference_refuses_a_job_it_cannot_fit(runtime, upscale_input):
    source, model = upscale_input
    addon = bpy.context.preferences.addons.new()
    addon.module = prefs.ADDON_ID
    try:
        prefs.get_prefs(bpy.context).ram_budget_mb = 1  # below what Blender itself uses
        with pytest.raises(RuntimeError, match=r"Not enough memory: loading sr\.onnx on auto needs about "):
            bpy.ops.lean_image_ai.upscale(filepath=str(source), model_path=str(model))
        assert runtime.settings.ram_budget_bytes is None  # the job's own budget, not the runtime's
        assert jobs.manager.last.state == "failed" and "RAM / GPU Memory Budget" in jobs.manager.last.error_text
    finally:
        bpy.context.preferences.addons.remove(addon)
        runtime.configure(ram_budget_bytes=None)


def test_leak_check_repeats_the_chosen_family_job(runtime, tmp_path, monkeypatch):
    """The family's job as every front-end builds it (models/model_run.py): its installed model from the
    preferences' models folder; a family with nothing installed says what to install."""
    from builders_families import da3_like_model
    from lean_image_ai.models.store import catalog, library

    monkeypatch.setenv(library.MODELS_DIR_ENV, str(tmp_path))
    entry = catalog.Catalog().get("da3-metric-large")  # no size/sha256 known: a present file counts
    model = da3_like_model(tmp_path / entry.filename, fixed_hw=None)
    assert bpy.ops.lean_image_ai.leak_check(runs=8, family="da3") == {"FINISHED"}
    from lean_image_ai.models.worker import client as worker_client

    assert worker_client.shared().status["models"] == [Path(model).name]  # loaded in the model worker
    with pytest.raises(RuntimeError, match="No BEN2 .* model is installed"):
        bpy.ops.lean_image_ai.leak_check(runs=8, family="ben2")
