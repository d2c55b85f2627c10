"""What the artist and the event log are told when the worker fails (issue 37, item 8): a Python
error of the worker reaches events.jsonl with its traceback and the report says where it is; the
report after a kill is sentences that count the frames that never ran; after Free Memory Now or
the idle end the Memory panel's last job says nothing is kept."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from lean_image_ai.models.batch.frame_lists import FrameRef  # noqa: E402
from lean_image_ai.models.model_run import ModelRun  # noqa: E402
from lean_image_ai.models.worker import host_record  # noqa: E402
from lean_image_ai.models.worker.remote_batch import RemoteBatchRun  # noqa: E402
from lean_image_ai.runtime.errors import LeanImageError  # noqa: E402
from lean_image_ai.runtime.log import event_file  # noqa: E402
from worker_fixtures import SLOW  # noqa: E402


def batch(client, model, size, frames=1):
    job = ModelRun.resolve("upscale", model.parent, model_path=str(model), device="cpu")
    pixels = np.random.default_rng(0).random((size, size, 4), dtype=np.float32)
    written, stages = [], []
    run = RemoteBatchRun(job, [FrameRef(n, Path(f"shot_{n:04d}.png")) for n in range(1, frames + 1)],
                         lambda ref: pixels, lambda ref, result: written.append(ref.number),
                         options=job.options(progress=lambda f, s: stages.append(s)), client=client)
    return run, written, stages


def pump_until_over(run, limit=120.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if run.pump(0.01):
            return
    raise AssertionError("the job did not end in time")


def test_a_python_error_in_the_worker_reaches_events_jsonl_with_its_traceback(client, slow_model, tmp_path):
    log = event_file.start(host_record.events, tmp_path)
    try:
        run, written, stages = batch(client, slow_model, SLOW)
        while not stages:
            run.pump(0.01)
        client.inject_fault("raise")
        with pytest.raises(LeanImageError) as raised:
            pump_until_over(run)
        event_file.drain()
    finally:
        event_file.stop()
    assert str(raised.value) == ("RuntimeError: a fault injected by a test (the model process's traceback is in "
                                 "events.jsonl)")
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    traces = [e for e in events if e["event"] == "worker_traceback"]
    assert traces and "Traceback (most recent call last)" in traces[0]["traceback"]
    assert "serve.py" in traces[0]["traceback"] and "a fault injected by a test" in traces[0]["traceback"]
    assert log is not None and written == []


def test_the_report_after_a_kill_counts_the_frames_kept_and_the_frames_that_never_ran(client, small_model, slow_model):
    run, written, stages = batch(client, slow_model, 96, frames=5)
    while len(written) < 1:
        assert not run.pump(0.01), "the job ended before it could be killed"
    os.kill(client.pid, signal.SIGKILL)
    with pytest.raises(LeanImageError) as raised:
        pump_until_over(run)
    text = str(raised.value)
    kept = len(written)
    number = kept + 1  # the frame in the worker when it died
    never = 5 - kept - 1
    assert text == (f"Frame {number}: the model process was killed (out of memory?) while running Upscale on "
                    f"shot_{number:04d}.png. {kept} frame{'s' if kept != 1 else ''} written before it "
                    f"{'is' if kept == 1 else 'are'} kept. {never} frame{'s' if never != 1 else ''} never ran. "
                    "Run it again.")


@pytest.mark.parametrize("how", ["free now", "idle end"])
def test_after_the_worker_ends_the_last_job_says_nothing_is_kept(client, small_model, how):
    run, _, _ = batch(client, small_model, 32)
    run.run()
    job = host_record.last_job_memory
    assert job is not None and not job.get("worker_ended")  # the job's own account: what the worker kept
    if how == "free now":
        client.free_now()
    else:
        assert client.check_idle(1.0, now=time.monotonic() + 2.0)
    assert host_record.last_job_memory["worker_ended"] is True
    assert client.state() == "Worker: not running (nothing kept)"


class Layout:
    """Records what a panel draws (Blender's UILayout records nothing outside a real draw)."""

    def __init__(self):
        self.labels = []

    def column(self, **_):
        return self

    def label(self, text="", **_):
        self.labels.append(text)


def test_the_memory_panel_says_nothing_is_kept_once_the_worker_ended(client, small_model):
    from lean_image_ai.ui import panel_memory

    run, _, _ = batch(client, small_model, 32)
    run.run()
    before = Layout()
    panel_memory._draw_last_job_summary(before, None)
    client.free_now()
    after = Layout()
    panel_memory._draw_last_job_summary(after, None)
    assert any(label.startswith("RAM") or "kept" in label for label in before.labels[1:])
    assert after.labels[1:] == ["The model process has ended: nothing is kept now."]


def test_a_job_whose_every_frame_fails_in_the_worker_ends_and_reports_each(client, small_model):
    """The client sends a frame when one in flight is answered: the worker tells failures at once
    (before, with frames 1 and 2 both failing, each side waited on the other until Esc)."""
    job = ModelRun.resolve("upscale", small_model.parent, model_path=str(small_model), device="cpu")
    bad = np.zeros((8, 8, 7), np.float32)  # no image: the adapter refuses each frame
    run = RemoteBatchRun(job, [FrameRef(n, Path(f"p{n}.png")) for n in (1, 2, 3, 4)], lambda ref: bad,
                         lambda ref, result: None, options=job.options(), client=client)
    pump_until_over(run, limit=60.0)
    assert [number for number, _ in run.report.failed] == [1, 2, 3, 4] and run.report.written == []
    assert all("(8, 8, 7)" in text for _, text in run.report.failed), run.report.failed


def test_the_hosts_runtime_settings_go_with_each_job_to_the_workers_runtime(client, small_model):
    """hostrt item 1: Blender's process has no runtime of its own; the preferences' settings are
    kept by the client (operators/prefs.py configure_runtime) and the worker's runtime applies
    them, job by job: its CPU session's release rule follows "Release CPU memory"."""
    from lean_image_ai.runtime.providers import KEEP, SHRINK

    rules = []
    for cpu_arena in (False, True):
        client.settings = {"cpu_arena": cpu_arena}
        mark = time.time()
        run, written, _ = batch(client, small_model, 16)
        run.run()
        assert written == [1]
        (created,) = [e for e in host_record.events.recent("session_create") if e["time"] >= mark]
        rules.append(created["release"])
    assert rules == [KEEP, SHRINK]
