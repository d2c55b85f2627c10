"""The modal path of the job operators (invoke / modal / cancel, Esc, unregister mid-job).

Background-mode Blender (the bpy module) cannot run a modal operator: `bpy.ops` calls `execute`
even for 'INVOKE_DEFAULT', there is no event loop, and an operator instance exists only while
Blender is calling into it. So these tests drive the modal protocol themselves:

- A test-only operator is registered with the real upscale operator's bases, properties and
  gather/work/apply (copied from its class dict: registering a *subclass* of a registered
  operator breaks Blender's lookup of the parent's Python class). Its `execute` is the one place
  where a live operator instance exists (real properties, real `report`); there it calls the
  real `start_modal` (what `invoke` does when Blender has a UI; background mode always takes
  `execute`) and then `modal` with stand-in events, exactly the calls Blender makes.
- Stand-ins for what background mode lacks: events (objects with `.type`/`.value`), and a context
  whose window manager and workspace record `event_timer_add/remove`, `modal_handler_add`,
  `progress_*` and `status_text_set` (everything else comes from the real `bpy.context`).
- The model worker process runs the real upscale adapter on the real onnxruntime; the modal
  timer pumps the job (no thread in this process). "Mid-job" is the first tile's progress report
  come back from the worker (`BlenderJob.report` is recorded by a gate) while tiles are still to come: the
  model is slow enough per tile (a wide compact net) that the job is still running when the test
  acts. Nothing holds the worker: Esc reaches it as a message.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
bh.import_package()

import modal_standins  # noqa: E402
from builders_upscale import compact_model  # noqa: E402
from lean_image_ai import operators  # noqa: E402
from lean_image_ai.models.store import library  # noqa: E402
from lean_image_ai.models.worker import client as worker_client  # noqa: E402
from lean_image_ai.models.worker import host_record  # noqa: E402
from lean_image_ai.operators import geometry_ops, image_io, image_ops, job_operator, jobs  # noqa: E402
from modal_standins import ESC, TIMER, Event, StandInContext, driver_class, pump  # noqa: E402

SIZE = 96  # with 48 px tiles (16 px overlap): several tiles, so there is a "between runs"
TILE = 48


# --- stand-ins ----------------------------------------------------------------------------------


class Gate:
    """Records the job's progress reports (on this thread: the pump hands them over)."""

    def __init__(self):
        self.reports = []

    @property
    def reached(self) -> bool:
        return any("tile" in stage for _, stage in self.reports)

    def install(self, monkeypatch):
        gate = self

        def report(job, fraction, stage):
            job.progress, job.stage = fraction, stage
            gate.reports.append((fraction, stage))

        monkeypatch.setattr(jobs.BlenderJob, "report", report)
        return self

    def wait(self, op, ctx, timeout=60.0) -> None:
        """Pump like Blender's timer until the first tile is reported; the job still runs."""
        deadline = time.monotonic() + timeout
        while not self.reached:
            assert time.monotonic() < deadline, "no tile was reported in time"
            assert op.modal(ctx, TIMER) == {"RUNNING_MODAL"}, "the job ended before a tile was reported"
            time.sleep(0.005)


# --- the driver ---------------------------------------------------------------------------------

LEANTEST_OT_drive_upscale = driver_class(
    image_ops.LEAN_IMAGE_AI_OT_upscale, "lean_image_ai_test.drive_upscale", "LEANTEST_OT_drive_upscale"
)


def drive(script, **props):
    return modal_standins.drive(bpy.ops.lean_image_ai_test.drive_upscale, script, **props)


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def registered():
    classes = [*jobs.classes, *image_ops.classes, *geometry_ops.classes]
    mine = [cls for cls in classes if not cls.is_registered]
    for cls in mine:
        bpy.utils.register_class(cls)
    bpy.utils.register_class(LEANTEST_OT_drive_upscale)
    yield
    if LEANTEST_OT_drive_upscale.is_registered:
        bpy.utils.unregister_class(LEANTEST_OT_drive_upscale)
    for cls in reversed(mine):
        if cls.is_registered:
            bpy.utils.unregister_class(cls)


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()  # a named models folder that is missing is an error
    monkeypatch.setenv(library.MODELS_DIR_ENV, str(tmp_path / "models"))
    bh.reset_blender()
    yield
    jobs.manager.cancel_all()  # never leave a worker behind, even when a test failed
    bh.reset_blender()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # wide enough that each tile takes a while: the job is still running when the test acts
    return compact_model(tmp_path_factory.mktemp("modal_models") / "sr.onnx", num_conv=16, feat=48, scale=2)


@pytest.fixture
def source(tmp_path):
    from PIL import Image as PILImage

    rng = np.random.default_rng(0)
    path = tmp_path / "src.png"
    PILImage.fromarray((rng.random((SIZE, SIZE, 4)) * 255).astype(np.uint8), "RGBA").save(path)
    return path


def release_events_since(mark):
    """``mark``: time.time() before the job (a count would stall once the bounded buffer is full)."""
    return [e for e in host_record.events.recent("memory_release") if e["time"] >= mark]


# --- tests --------------------------------------------------------------------------------------


def test_modal_job_reports_progress_and_finishes(monkeypatch, model, source):
    gate = Gate().install(monkeypatch)
    ctx = StandInContext()
    wm = ctx.window_manager
    mark = time.time()

    def script(op):
        started = op.start_modal(ctx)
        assert started == {"RUNNING_MODAL"}
        assert wm.handlers == [op] and len(wm.live_timers) == 1
        job = jobs.manager.current
        assert job is not None and job.task is None  # the source's load, then the job's preparing: timer calls
        assert op.modal(ctx, Event("MOUSEMOVE")) == {"PASS_THROUGH"}  # other events are not ours
        assert [op.modal(ctx, TIMER) for _ in range(2)] == [{"RUNNING_MODAL"}] * 2
        assert isinstance(job.task, jobs.PumpedTask)  # no thread
        gate.wait(op, ctx)
        return pump(op, ctx, timeout=120)

    result = drive(script, filepath=str(source), model_path=str(model), tile_size=TILE)

    assert result == {"FINISHED"}
    assert any(0 < p < 100 for p in wm.progress)  # updates sent while the worker was mid-job
    assert wm.progress == sorted(wm.progress)
    assert wm.calls[0] == ("event_timer_add", job_operator.TIMER_INTERVAL) and ("progress_begin", 0, 100) in wm.calls
    assert wm.live_timers == [] and wm.calls[-1] == ("progress_end",)
    assert ctx.workspace.status[-1] is None and "Esc to cancel" in ctx.workspace.status[0]
    assert len([s for _, s in gate.reports if "tile" in s]) > 1
    image = bpy.data.images["src_x2"]
    assert tuple(image.size) == (2 * SIZE, 2 * SIZE)
    assert jobs.manager.current is None and jobs.manager.last.state == "finished"
    assert release_events_since(mark)[-1]["reason"] == "operation_complete"


def test_esc_cancels_between_runs(monkeypatch, model, source):
    gate = Gate().install(monkeypatch)
    ctx = StandInContext()
    wm = ctx.window_manager
    mark = time.time()

    def script(op):
        images_before = len(bpy.data.images)
        assert op.start_modal(ctx) == {"RUNNING_MODAL"}
        gate.wait(op, ctx)
        job = jobs.manager.current
        pid = worker_client.shared().pid
        assert op.modal(ctx, ESC) == {"RUNNING_MODAL"}  # Esc is consumed, the job winds down
        assert job.cancel_event.is_set() and job.stage == "cancelling..."
        result = pump(op, ctx)
        return result, job, images_before, pid

    result, job, images_before, pid = drive(script, filepath=str(source), model_path=str(model), tile_size=TILE)

    assert result == {"CANCELLED"}
    assert job.state == "cancelled" and job.progress < 1.0
    assert len(bpy.data.images) == images_before == 0  # no result, and the loaded source is gone
    assert jobs.manager.current is None
    assert wm.live_timers == [] and ("progress_end",) in wm.calls
    released = release_events_since(mark)
    # the worker stopped between two tiles and released, or (a tile past the grace time) was ended
    stopped = released and released[-1]["reason"] == "cancelled" and released[-1]["operation"] == "upscale"
    assert stopped or not worker_client.shared().running or worker_client.shared().pid != pid


def test_second_job_refused_and_cancel_job_operator(monkeypatch, model, source):
    gate = Gate().install(monkeypatch)
    ctx = StandInContext()

    def script(op):
        assert op.start_modal(ctx) == {"RUNNING_MODAL"}
        gate.wait(op, ctx)
        refused = None
        try:
            bpy.ops.lean_image_ai.remove_background(filepath=str(source), model_path=str(model))
        except RuntimeError as exc:
            refused = str(exc)
        cancelled = bpy.ops.lean_image_ai.cancel_job()
        return refused, cancelled, pump(op, ctx)

    refused, cancelled, result = drive(script, filepath=str(source), model_path=str(model), tile_size=TILE)

    assert refused is not None and "'Upscale' is still running" in refused and "cancel it" in refused
    assert cancelled == {"FINISHED"} and result == {"CANCELLED"}
    assert jobs.manager.last.state == "cancelled" and len(bpy.data.images) == 0


def test_blender_cancelling_the_modal_operator(monkeypatch, model, source):
    """`cancel()` (Blender ending the modal operator, e.g. on file load) stops the job at once."""
    gate = Gate().install(monkeypatch)
    ctx = StandInContext()

    def script(op):
        assert op.start_modal(ctx) == {"RUNNING_MODAL"}
        gate.wait(op, ctx)
        job = jobs.manager.current
        job_task = job.task
        op.cancel(ctx)
        return job, job_task

    job, task = drive(script, filepath=str(source), model_path=str(model), tile_size=TILE)

    assert task.batch.report.cancelled and job.state == "cancelled"
    assert job.task is None, "an ended job lets go of its task (issue #37: it held the job's arrays)"
    assert jobs.manager.current is None and ctx.window_manager.live_timers == []
    assert len(bpy.data.images) == 0


def test_unregister_while_a_job_runs_stops_it_and_the_worker(monkeypatch, model, source):
    gate = Gate().install(monkeypatch)
    ctx = StandInContext()

    def script(op):
        assert op.start_modal(ctx) == {"RUNNING_MODAL"}
        gate.wait(op, ctx)
        return jobs.manager.current

    # the driver's execute returns with the job still running (its instance is gone: the task
    # must not need it); then the add-on's operators are unregistered, as on disabling the add-on
    job = drive(script, filepath=str(source), model_path=str(model), tile_size=TILE)
    client = worker_client.shared()
    assert not job.done and jobs.manager.current is job and client.running
    bpy.utils.unregister_class(LEANTEST_OT_drive_upscale)
    registered_before = {cls for cls in operators._classes() if cls.is_registered}
    listeners_before = list(jobs.manager.on_end)  # register() adds memory_ops' after-job hook
    task = job.task  # the job lets go of it when it ends
    try:
        operators.unregister()
        assert task.batch.report.cancelled and not client.running  # the add-on's model process ended too
        assert jobs.manager.current is None and job.state == "cancelled"
        assert ctx.window_manager.live_timers == [] and ("progress_end",) in ctx.window_manager.calls
        assert not image_ops.LEAN_IMAGE_AI_OT_upscale.is_registered
        assert len(bpy.data.images) == 0
    finally:
        operators.register()
        for cls in operators._classes():  # back to what this module registered itself
            if cls not in registered_before and cls.is_registered:
                bpy.utils.unregister_class(cls)
        bpy.utils.register_class(LEANTEST_OT_drive_upscale)
        jobs.manager.on_end[:] = listeners_before  # later modules' jobs must not draw the memory picture
    assert image_ops.LEAN_IMAGE_AI_OT_upscale.is_registered and jobs.manager.current is None


def test_cancel_all_without_a_job_is_harmless():
    jobs.manager.cancel_all()
    assert jobs.manager.current is None


def test_failed_gather_in_invoke_ends_the_job(tmp_path):
    ctx = StandInContext()

    def script(op):
        return op.start_modal(ctx)

    with pytest.raises(RuntimeError, match="Image file not found"):
        drive(script, filepath=str(tmp_path / "missing.png"))
    assert jobs.manager.current is None and jobs.manager.last.state == "failed"
    assert ctx.window_manager.timers_added == []  # nothing was started


def test_result_values_match_a_synchronous_run(monkeypatch, model, source):
    """The modal path and `execute` produce the same image."""
    ctx = StandInContext()

    def script(op):
        assert op.start_modal(ctx) == {"RUNNING_MODAL"}
        return pump(op, ctx)

    assert drive(script, filepath=str(source), model_path=str(model), tile_size=TILE) == {"FINISHED"}
    modal = image_io.image_to_array(bpy.data.images["src_x2"])
    bpy.data.images.remove(bpy.data.images["src_x2"])
    bpy.ops.lean_image_ai.upscale(filepath=str(source), model_path=str(model), tile_size=TILE)
    np.testing.assert_array_equal(image_io.image_to_array(bpy.data.images["src_x2"]), modal)
