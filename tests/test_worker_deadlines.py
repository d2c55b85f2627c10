"""Deadlines at the worker boundary (models/worker/client.py): a worker that stops answering
(SIGSTOP) ends its job within the heartbeat deadline with one line; a result the host cannot
receive (its address space full under RLIMIT_AS, its array file removed) ends the job with one
line naming the cause and resets the worker; an exchange folder removed between jobs restarts the
worker. After each, the next job works."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from lean_image_ai.models.batch.frame_lists import FrameRef  # noqa: E402
from lean_image_ai.models.model_run import ModelRun  # noqa: E402
from lean_image_ai.models.worker import client as worker_client  # noqa: E402
from lean_image_ai.models.worker import host_record  # noqa: E402
from lean_image_ai.models.worker.remote_batch import RemoteBatchRun  # noqa: E402
from lean_image_ai.runtime.errors import LeanImageError  # noqa: E402
from worker_fixtures import SLOW, image  # noqa: E402


@pytest.fixture
def client():
    made = worker_client.WorkerClient()
    yield made
    made.kill()




def batch(client, model, pixels, frames=1):
    job = ModelRun.resolve("upscale", model.parent, model_path=str(model), device="cpu")
    written, stages = [], []
    run = RemoteBatchRun(job, [FrameRef(n, Path(f"f{n}.png")) for n in range(1, frames + 1)], lambda ref: pixels,
                         lambda ref, result: written.append(result),
                         options=job.options(progress=lambda f, s: stages.append(s)), client=client)
    return run, written, stages


def pump_until_over(run, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if run.pump(0.01):
            return
    raise AssertionError("the job did not end in time")


def next_job_works(client, model) -> None:
    run, written, _ = batch(client, model, image(16))
    run.run()
    assert len(written) == 1


def test_a_hung_worker_ends_its_job_within_the_heartbeat_deadline(client, slow_model, small_model, monkeypatch):
    monkeypatch.setenv(worker_client.HEARTBEAT_ENV, "2")
    run, written, stages = batch(client, slow_model, image(SLOW))
    while not stages:
        run.pump(0.01)
    pid = client.pid
    os.kill(pid, signal.SIGSTOP)
    with pytest.raises(LeanImageError) as raised:
        pump_until_over(run, limit=60.0)  # a bound: before the deadline existed this never ended
    text = str(raised.value)
    assert text.startswith("Frame 1: the model process stopped answering for 2 s (hung?) and was ended")
    assert "\n" not in text and written == []
    assert not client.running and run.longest_pump_s > 0
    next_job_works(client, small_model)
    assert client.pid != pid


def test_a_worker_stopped_while_idle_is_replaced_and_the_next_job_runs(client, small_model, monkeypatch):
    """hostrt item 2: a worker SIGSTOPped between jobs says nothing once the next job begins; at
    the heartbeat deadline a new worker runs that job (its frames sent again), and the report and
    the event log say in one line that the old one did not answer and was replaced. Before, the
    job failed with "stopped answering ... and was ended"."""
    monkeypatch.setenv(worker_client.HEARTBEAT_ENV, "2")
    next_job_works(client, small_model)
    pid, mark = client.pid, time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        run, written, _ = batch(client, small_model, image(16), frames=2)
        pump_until_over(run, limit=60.0)
    finally:
        with contextlib.suppress(ProcessLookupError):  # reaped once replaced; else no stopped process stays
            os.kill(pid, signal.SIGCONT)
    assert len(written) == 2 and run.report.failed == [] and client.pid not in (None, pid)
    (said,) = run.report.warnings
    assert said.startswith("The model process did not answer for 2 s when ") and "a new one ran the job" in said
    assert "\n" not in said
    restarts = [e for e in host_record.events.recent("worker_restart") if e["time"] >= mark]
    assert [e["reason"] for e in restarts] == [said]
    next_job_works(client, small_model)  # and the job after it needs no replacing
    assert client.spawns == 2


def test_the_idle_timer_ends_a_worker_stopped_while_idle_and_keeps_one_that_answers(client, small_model, monkeypatch):
    """hostrt item 2, the idle timer's side (operators/memory_ops.py idle_tick): it asks an idle
    worker for its state at one tick and, at a tick past the heartbeat deadline, ends one that
    never answered (no wait at either tick); the next job then starts a new worker at once."""
    monkeypatch.setenv(worker_client.HEARTBEAT_ENV, "1")
    next_job_works(client, small_model)
    client.status = {}
    assert client.check_alive() and client.running  # asked; it answers between ticks
    deadline = time.monotonic() + 30
    while not client.status and time.monotonic() < deadline:  # its answer is a status
        client.messages()
        time.sleep(0.01)
    time.sleep(1.1)  # the next tick, past the deadline
    assert client.status and client.check_alive() and client.running, "it answered: kept (and asked again)"
    pid, mark = client.pid, time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        assert client.check_alive() and client.running  # a new question; its answer cannot come
        time.sleep(1.5)
        began = time.monotonic()
        assert client.check_alive() is False
        assert time.monotonic() - began < 6  # a kill and its reap, no wait for an answer
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert not client.running
    (said,) = [e["reason"] for e in host_record.events.recent("worker_restart") if e["time"] >= mark]
    assert said.startswith("the idle model process did not answer for ") and "\n" not in said
    next_job_works(client, small_model)
    assert client.pid != pid


def test_an_array_file_removed_before_it_is_read_is_one_line_and_a_reset(client, small_model):
    run, written, _ = batch(client, small_model, image(64))
    run.pump(0.01)  # the job and its frame are sent; the result comes back as a file
    pid = client.pid
    folders = list(client.exchange.folders.values())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        theirs = [f for folder in folders for f in folder.glob(f"{pid}-*.bin")]
        if theirs and client.conn.poll(0):  # the result's message is there, its file named in it
            for path in theirs:
                path.unlink()
            break
        time.sleep(0.005)
    with pytest.raises(LeanImageError) as raised:
        pump_until_over(run)
    assert str(raised.value) == ("A result from the model process could not be received (its array file or exchange "
                                 "folder was removed); the model process was restarted, run it again.")
    assert written == [] and not client.running
    next_job_works(client, small_model)


def test_an_exchange_folder_removed_between_jobs_restarts_the_worker(client, small_model):
    next_job_works(client, small_model)
    pid, mark = client.pid, time.time()
    for folder in client.exchange.folders.values():
        subprocess.run(["rm", "-rf", str(folder)], check=True)  # a cleaner of /dev/shm or /tmp
    next_job_works(client, small_model)
    assert client.pid != pid
    restarts = [e for e in host_record.events.recent("worker_restart") if e["time"] >= mark]
    assert restarts and "exchange folder was removed" in restarts[-1]["reason"]


RLIMIT_SCRIPT = """
import json, resource, sys
from pathlib import Path
import numpy as np
from lean_image_ai.models.batch.frame_lists import FrameRef
from lean_image_ai.models.model_run import ModelRun
from lean_image_ai.models.worker.client import WorkerClient
from lean_image_ai.models.worker.remote_batch import RemoteBatchRun

model = Path(sys.argv[1])
client = WorkerClient()

def job(size):
    run_ = ModelRun.resolve("upscale", model.parent, model_path=str(model), device="cpu")
    pixels = np.random.default_rng(0).random((size, size, 4), dtype=np.float32)
    out = []
    RemoteBatchRun(run_, [FrameRef(1, Path("a.png"))], lambda ref: pixels, lambda ref, r: out.append(r.image.shape),
                   options=run_.options(), client=client).run()
    return out

job(16)  # warm: the worker runs and this process has imported all it needs
size = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize"))
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (size + 48 * 2**20, hard))  # a 2048x2048 float RGBA result is 64 MiB
try:
    job(512)
    print(json.dumps({"first": "no error"}))
except Exception as exc:
    print(json.dumps({"first": str(exc), "type": type(exc).__name__, "running": client.running}))
finally:
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
print(json.dumps({"next": job(16)}))
client.kill()
"""


def test_a_result_the_host_has_no_memory_for_is_one_line_and_the_next_job_works(small_model, tmp_path):
    done = subprocess.run([sys.executable, "-c", RLIMIT_SCRIPT, str(small_model)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and len(lines) == 2, done.stderr[-3000:]
    assert lines[0]["first"] == ("A result from the model process could not be received (this process ran out of "
                                 "memory for the result); the model process was restarted, run it again.")
    assert lines[0]["running"] is False and lines[1]["next"] == [[64, 64, 4]]


EMFILE_SCRIPT = """
import json, os, resource, sys
from pathlib import Path
import numpy as np
from lean_image_ai.models.batch.frame_lists import FrameRef
from lean_image_ai.models.model_run import ModelRun
from lean_image_ai.models.worker.client import WorkerClient
from lean_image_ai.models.worker.remote_batch import RemoteBatchRun

model = Path(sys.argv[1])
client = WorkerClient()

def batch():
    job = ModelRun.resolve("upscale", model.parent, model_path=str(model), device="cpu")
    out = []
    run = RemoteBatchRun(job, [FrameRef(1, Path("a.png"))], lambda ref: np.zeros((16, 16, 4), np.float32),
                         lambda ref, r: out.append(r.image.shape), options=job.options(), client=client)
    return run, out

batch()[0].run()  # warm
run, out = batch()
run.pump(0)  # the job and its frame are sent: what is left is receiving the result
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
lowest_free = os.open(os.devnull, os.O_RDONLY)
os.close(lowest_free)
resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no new file can be opened
try:
    run.run()
    print(json.dumps({"first": "no error"}))
except Exception as exc:
    print(json.dumps({"first": str(exc), "running": client.running}))
finally:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
run, out = batch()
run.run()
print(json.dumps({"next": out}))
client.kill()
"""


def test_a_result_the_host_has_no_file_descriptor_for_is_one_line_and_the_next_job_works(small_model, tmp_path):
    done = subprocess.run([sys.executable, "-c", EMFILE_SCRIPT, str(small_model)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and len(lines) == 2, done.stderr[-3000:]
    assert lines[0]["first"] == ("A result from the model process could not be received (this process has too many "
                                 "open files); the model process was restarted, run it again.")
    assert lines[0]["running"] is False and lines[1]["next"] == [[64, 64, 4]]
