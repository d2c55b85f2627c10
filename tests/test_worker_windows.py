"""The worker's Windows branch (models/worker/launch.py), run here on Linux where it can run: no
inherited socket (spawn, no fork: the child dials the host's listener, AF_UNIX here in place of
Windows' loopback socket, and proves itself with a key from its stdin), an exchange folder outside
/dev/shm, ``CREATE_NO_WINDOW`` in ``creationflags`` (recorded: Linux' Popen refuses the flag, so
the recorder hands the rest to the real Popen), and the connect deadline: a child that dies before
it connects, or never connects, is one line within the deadline."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from builders_upscale import compact_model  # noqa: E402
from lean_image_ai.models.batch.frame_lists import FrameRef  # noqa: E402
from lean_image_ai.models.model_run import ModelRun  # noqa: E402
from lean_image_ai.models.worker import client as worker_client  # noqa: E402
from lean_image_ai.models.worker import launch  # noqa: E402
from lean_image_ai.models.worker.remote_batch import RemoteBatchRun  # noqa: E402
from lean_image_ai.runtime.errors import LeanImageError  # noqa: E402

REAL_POPEN = subprocess.Popen


@pytest.fixture
def recorded(monkeypatch):
    """Every Popen call: its arguments and keywords exactly as given."""
    calls = []

    def popen(args, **kwargs):
        calls.append((list(args), dict(kwargs)))
        kwargs.pop("creationflags", None)  # a Windows-only keyword: Linux' Popen raises on it
        return REAL_POPEN(args, **kwargs)

    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    return calls


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return compact_model(tmp_path_factory.mktemp("windows") / "small.onnx", num_conv=4, feat=8)


def run_job(client, model, pixels):
    job = ModelRun.resolve("upscale", model.parent, model_path=str(model), device="cpu")
    written = []
    run = RemoteBatchRun(job, [FrameRef(1, Path("a.png"))], lambda ref: pixels,
                         lambda ref, result: written.append(result), options=job.options(), client=client)
    run.run()
    return written


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_the_spawn_branch_runs_a_job_with_no_console_window_and_the_same_pixels(recorded, small_model):
    pixels = np.random.default_rng(2).random((20, 20, 4), dtype=np.float32)
    windows = worker_client.WorkerClient(listen=True)
    posix = worker_client.WorkerClient(listen=False)
    try:
        there = run_job(windows, small_model, pixels)
        folders = [str(f) for f in windows.exchange.folders.values()]
        here = run_job(posix, small_model, pixels)
    finally:
        windows.kill()
        posix.kill()
    args, options = recorded[0]
    assert options["creationflags"] == launch.CREATE_NO_WINDOW == 0x08000000
    assert options["stdin"] == subprocess.PIPE and "pass_fds" not in options and "--fd" not in args
    assert "--address" in args and not any(len(a) == 64 and a.isalnum() for a in args)  # the key is not in argv
    assert not any(f.startswith("/dev/shm") for f in folders)
    assert recorded[1][1].get("creationflags") is None  # the POSIX branch passes none
    assert there[0].image.tobytes() == here[0].image.tobytes()


def test_a_child_that_dies_before_it_connects_is_one_line_at_once(recorded, tmp_path, small_model):
    client = worker_client.WorkerClient(listen=True, python=script(tmp_path, "exit 3"))
    begun = time.monotonic()
    with pytest.raises(LeanImageError) as raised:
        run_job(client, small_model, np.zeros((8, 8, 4), np.float32))
    assert str(raised.value) == ("The model process exited with code 3 before it connected while running Upscale. "
                                 "Nothing was written. 1 frame never ran. Run it again.")
    assert time.monotonic() - begun < worker_client.connect_deadline() and client.folder is None


def test_a_child_that_never_connects_ends_at_the_connect_deadline(recorded, tmp_path, small_model, monkeypatch):
    monkeypatch.setenv(worker_client.CONNECT_ENV, "2")
    client = worker_client.WorkerClient(listen=True, python=script(tmp_path, "exec sleep 600"))
    with pytest.raises(LeanImageError) as raised:
        run_job(client, small_model, np.zeros((8, 8, 4), np.float32))
    assert str(raised.value) == ("The model process did not connect within 2 s; it was ended. Run it again "
                                 "(a slow disk or antivirus may delay its start).")
    assert not client.running and client.folder is None
