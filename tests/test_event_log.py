"""Issue 11, the event log on disk (runtime/log/event_file.py): real runtime jobs, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from lean_image_ai.runtime import Runtime, mark_last
from lean_image_ai.runtime.log import event_file
from onnx_builders import conv_model


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conv_model(tmp_path_factory.mktemp("models") / "conv.onnx", mid_channels=4)


def job(runtime, model, runs=2):
    with runtime.operation("logged") as op:
        handle = op.session(model, "cpu")
        for _, last in mark_last(range(runs)):
            op.run(handle, {"x": np.ones((1, 3, 32, 32), np.float32)}, last=last)
    return op


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_jobs_events_appear_as_json_lines(conv, tmp_path):
    runtime = Runtime()
    log = event_file.EventFile(tmp_path / "logs").attach(runtime.events)
    try:
        job(runtime, conv)
        assert log.flush()
        written = lines(log.path)
        assert [e["event"] for e in written] == [e["event"] for e in runtime.events.recent()]
        kinds = [e["event"] for e in written]
        assert kinds[0] == "operation_start" and kinds[-1] == "operation_end"
        assert {"session_create", "memory_release", "job_memory"} <= set(kinds)
        assert written[-1]["operation"] == "logged" and written[-1]["outcome"] == "success"
        assert log.written == len(written) and log.failures == 0
    finally:
        log.close()
    job(runtime, conv)  # closed: no longer listening
    assert len(lines(log.path)) == log.written


def test_rotation_keeps_the_number_of_files(conv, tmp_path):
    runtime = Runtime()
    line = len(json.dumps({"event": "filler", "time": 0.0, "n": 0, "pad": "x" * 200}, sort_keys=True)) + 1
    log = event_file.EventFile(tmp_path, max_bytes=4 * line, files=3).attach(runtime.events)
    try:
        for n in range(40):
            runtime.events.emit("filler", n=n, pad="x" * 200)
        assert log.flush()
    finally:
        log.close()
    names = sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".lock")
    assert names == ["events.jsonl", "events.jsonl.1", "events.jsonl.2"]
    for path in (tmp_path / name for name in names):
        assert path.stat().st_size <= 4 * line + 4  # (the counter's digits vary by a few bytes)
    # newest in events.jsonl, then .1, then .2: the kept events are the last ones, in order
    kept = [e["n"] for name in reversed(names) for e in lines(tmp_path / name)]
    assert kept == list(range(40 - len(kept), 40)) and log.written == 40


def test_an_unwritable_folder_never_breaks_a_job(conv, tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    runtime = Runtime()
    log = event_file.EventFile(blocker / "logs").attach(runtime.events)  # mkdir fails, even as root
    try:
        op = job(runtime, conv)
        assert log.flush()
        assert op.memory["outcome"] == "success" and log.written == 0
        assert log.failures == len(runtime.events.recent()) and "Not a directory" in log.error
    finally:
        log.close()


def test_the_folder_order(tmp_path, monkeypatch):
    monkeypatch.delenv(event_file.LOG_DIR_ENV, raising=False)
    assert event_file.log_folder(tmp_path / "host") == tmp_path / "host"
    assert event_file.log_folder().parts[-2:] == ("lean_image_ai", "logs")
    monkeypatch.setenv(event_file.LOG_DIR_ENV, str(tmp_path / "env"))
    assert event_file.log_folder(tmp_path / "host") == tmp_path / "env"


def test_the_command_line_logs_its_run(tmp_path):
    env = {**os.environ, event_file.LOG_DIR_ENV: str(tmp_path / "logs")}
    command = [sys.executable, "-m", "lean_image_ai", "upscale", "--output", str(tmp_path / "out.png"), "--device", "cpu"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    kinds = [e["event"] for e in lines(tmp_path / "logs" / "events.jsonl")]
    assert kinds[0] == "operation_start" and "job_memory" in kinds and kinds[-1] == "operation_end"


# one writer process: waits for the go file (so every writer starts at once), logs COUNT events
_WRITER = """
import sys, time
from pathlib import Path
from lean_image_ai.runtime.log import event_file
folder, me, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
log = event_file.EventFile(folder, max_bytes=600, files=500)
while not go.exists():
    time.sleep(0.001)
for n in range(count):
    log._enqueue({"event": "filler", "writer": me, "n": n})
log.close(120)
print(log.failures, log.written, log.error)
"""


def test_processes_rotating_one_log_lose_no_event(tmp_path):
    """Issue 33 item 19: four processes append to one folder with a small size limit, so each
    rotates about 25 times while the others append and rotate too; every event of every
    process is in one of the files (room for all of them: nothing is dropped as old)."""
    writers, count = 4, 250
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path / "logs"), str(w), str(count), str(go)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for w in range(writers)
    ]
    time.sleep(1.0)  # every writer imported and waiting
    go.touch()
    outcomes = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), outcomes
    assert [out.split()[0] for out, _ in outcomes] == ["0"] * writers, outcomes
    logged = [(e["writer"], e["n"]) for path in (tmp_path / "logs").glob("events.jsonl*")
              if path.suffix != ".lock" for e in lines(path)]
    assert len(list((tmp_path / "logs").glob("events.jsonl.*"))) > writers  # it did rotate, many times
    assert sorted(logged) == sorted((str(w), n) for w in range(writers) for n in range(count))


@pytest.mark.skipif(os.name != "posix", reason="flock")
def test_a_lock_held_for_good_by_another_process_fails_the_write_in_bounded_time(tmp_path, monkeypatch):
    """A holder stopped for good must not stall the log: the write waits LOCK_WAIT_S, then is
    counted as failed (and said once), and the next write after the release goes through."""
    import fcntl

    monkeypatch.setattr(event_file, "LOCK_WAIT_S", 0.2)
    tmp_path.mkdir(exist_ok=True)
    holder = os.open(tmp_path / "events.jsonl.lock", os.O_RDWR | os.O_CREAT)  # another open file: another lock owner
    fcntl.flock(holder, fcntl.LOCK_EX)
    said = []
    log = event_file.EventFile(tmp_path, on_error=lambda path, text: said.append((path, text)))
    try:
        log._enqueue({"event": "held"})
        assert log.flush(30)
        assert log.failures == 1 and "held by another process" in log.error
        assert said == [(log.path, log.error)]
        fcntl.flock(holder, fcntl.LOCK_UN)
        log._enqueue({"event": "free"})
        assert log.flush(30)
        assert [e["event"] for e in lines(log.path)] == ["free"] and len(said) == 1
    finally:
        os.close(holder)
        log.close()
