"""Issue #37 (wire): every frame on the worker's connection is small and written by one write; a
message whose JSON is longer crosses whole as a file of the exchange, named by the frame. The
host's receive never waits on the other side: a worker stopped in the middle of a frame leaves the
host free until the heartbeat deadline ends the job in one line; a length prefix over the frame cap
is refused at once. Large real messages (a 20,000-frame job, a long memory timeline) round-trip
exactly; the file is removed once read, and when its read fails."""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import time
from multiprocessing import Pipe
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from lean_image_ai.models.batch.frame_lists import FrameRef  # noqa: E402
from lean_image_ai.models.model_run import ModelRun  # noqa: E402
from lean_image_ai.models.worker import client as worker_client  # noqa: E402
from lean_image_ai.models.worker import launch, wire  # noqa: E402
from lean_image_ai.models.worker import protocol as p  # noqa: E402
from lean_image_ai.models.worker.remote_batch import RemoteBatchRun  # noqa: E402
from lean_image_ai.runtime.errors import LeanImageError  # noqa: E402
from worker_fixtures import image  # noqa: E402


class Blocked(BaseException):
    """The receive waited (raised by an alarm: not an OSError, which the client would turn into a line)."""


class bounded:
    """Raises :class:`Blocked` in the main thread when the block runs past ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __enter__(self):
        def stuck(signum, frame):
            raise Blocked(f"still blocked after {self.seconds} s")

        self.previous = signal.signal(signal.SIGALRM, stuck)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)


@pytest.fixture
def exchange():
    made = wire.Exchange.create()
    yield made
    made.remove()


def sent(conn, message, exchange) -> None:
    """``wire.send`` with a bound: a sender that wrote a long message into the socket itself
    (before: one frame of megabytes) blocks until the receiver reads, here the same thread."""
    with bounded(10.0):
        wire.send(conn, message, exchange)


def files(exchange) -> list[Path]:
    return sorted(f for folder in set(exchange.folders.values()) for f in folder.iterdir())


def long_timeline(samples: int = 400_000) -> dict:
    """A memory timeline as long as a ~5.5 hour job's at 20 samples a second (runtime/measure/timeline.py)."""
    rng = np.random.default_rng(0)
    t = np.round(np.arange(samples) * 0.05, 3).tolist()
    rss = (1_000_000_000 + rng.integers(0, 1 << 26, samples)).tolist()
    return {"t": t, "rss_bytes": rss, "vram_bytes": [None] * 16, "marks": [[1.5, "load"], [2.0, "run"]],
            "operation": "upscale", "outcome": "done"}


# ---- (b) large real messages round-trip exactly through the file path ----------------------------
@pytest.mark.parametrize("direction", ["host to worker: a 20,000-frame job", "worker to host: a long timeline"])
def test_a_large_message_round_trips_exactly_through_a_file_and_the_frame_stays_small(exchange, direction):
    if direction.startswith("host"):
        refs = [(n, f"/renders/shot_010/plate_v003/plate.{n:06d}.exr") for n in range(1, 20_001)]
        message = p.Job({"family_id": "upscale"}, refs, name="Upscale 20,000 frames", settings={"threads": 2})
    else:
        message = p.Status({"pid": 1, "timeline": long_timeline(), "job_memory": {"peak_rss_bytes": 123}})
    a, b = Pipe()
    frames = []
    real = a.send_bytes
    a.send_bytes = lambda data: (frames.append(len(data)), real(data))[1]
    sent(a, message, exchange)
    (carried,) = files(exchange)
    assert frames[0] <= wire.MAX_MESSAGE_BYTES and carried.stat().st_size > 1 << 20
    back = wire.receive(b, exchange)
    assert back == message and type(back) is type(message)
    assert files(exchange) == []  # the file is removed once read


def test_a_small_message_still_crosses_in_its_frame_alone(exchange):
    a, b = Pipe()
    wire.send(a, p.Progress(0.5, "tile 2/4"), exchange)
    assert files(exchange) == []
    assert wire.receive(b, exchange) == p.Progress(0.5, "tile 2/4")


# ---- (c) the file is removed on a failed read too --------------------------------------------------
def test_a_carried_message_cut_short_is_one_error_and_its_file_is_removed(exchange):
    a, b = Pipe()
    sent(a, p.Status({"timeline": long_timeline(50_000)}), exchange)
    (carried,) = files(exchange)
    os.truncate(carried, carried.stat().st_size // 2)  # a write that never finished (a full disk, a crash)
    with pytest.raises(wire.ExchangeError, match="cut short"):
        wire.receive(b, exchange)
    assert files(exchange) == []


def test_a_carried_message_over_the_document_cap_is_refused_before_it_is_read_and_removed(exchange, monkeypatch):
    a, b = Pipe()
    sent(a, p.Status({"timeline": long_timeline(100_000)}), exchange)  # ~2 MB
    monkeypatch.setattr(wire, "MAX_DOCUMENT_BYTES", 1 << 20)
    monkeypatch.setattr(wire.Exchange, "read", lambda self, entry: pytest.fail("a refused document was read"))
    with pytest.raises(p.ProtocolError, match="longer than the 1 MiB no real one reaches"):
        wire.receive(b, exchange)
    assert files(exchange) == []


@pytest.mark.parametrize("names", ["an array", "a document"])
def test_a_frame_naming_a_file_outside_the_exchange_is_refused_and_that_file_kept(exchange, tmp_path, names):
    """Before, an array entry's ``../`` name made the receiver read that file and delete it."""
    outside = tmp_path / "precious.bin"
    outside.write_bytes(b"{}")
    entry = {"dtype": "|u1", "shape": [2], "where": "m", "file": os.path.relpath(outside, exchange.folders["m"])}
    frame = ({"kind": "frame", "fields": {"number": 1, "pixels": {"$array": 0}}, "arrays": [entry]}
             if names == "an array" else {"document": entry})
    a, b = Pipe()
    a.send_bytes(json.dumps(frame).encode())
    with pytest.raises(p.ProtocolError):
        wire.receive(b, exchange)
    assert outside.read_bytes() == b"{}"


# ---- (a) a frame that is not all there never blocks the receive -----------------------------------
def test_a_frame_not_all_there_is_not_read_until_it_is(exchange):
    a, b = Pipe()
    data = json.dumps({"kind": "progress", "fields": {"fraction": 0.25, "stage": "x" * 5000}, "arrays": []}).encode()
    a._send(struct.pack("!i", len(data)) + data[:3000])  # its sender stopped in the middle of the write
    assert b.poll(0)
    with bounded(5.0):
        assert wire.receive(b, exchange) is None  # before: recv_bytes waited for the 2,000 bytes that never came
    a._send(data[3000:])
    assert wire.receive(b, exchange) == p.Progress(0.25, "x" * 5000)


def stopping_worker(tmp_path: Path, prefix_bytes: int) -> Path:
    """An interpreter whose worker says hello, then sends the first part of a frame announcing
    ``prefix_bytes`` and stops itself (SIGSTOP), as a worker stopped in the middle of a send."""
    code = tmp_path / "stopping.py"
    code.write_text(
        "import os, runpy, signal, struct, sys\n"
        "import lean_image_ai.models.worker.wire as wire\n"
        "real = wire.send\n"
        "def send(conn, message, exchange):\n"
        "    if type(message).__name__ == 'Hello':\n"
        "        return real(conn, message, exchange)\n"
        f"    conn._send(struct.pack('!i', {prefix_bytes}) + b'{{' * 2000)\n"
        "    os.kill(os.getpid(), signal.SIGSTOP)\n"
        "wire.send = send\n"
        "sys.argv = ['worker', *sys.argv[1:]]\n"
        "runpy.run_module('lean_image_ai.models.worker', run_name='__main__')\n"
    )
    script = tmp_path / "stopping_python"
    script.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {code} "$@"\n')
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("prefix_bytes, line", [
    (6000, "stopped answering for 2 s (hung?) and was ended"),  # a frame under the cap: the heartbeat deadline
    (300_000, "KiB the connection carries"),  # a large message as the old protocol sent it: refused from its prefix
], ids=["small frame cut", "large message cut"])
def test_a_worker_stopped_in_the_middle_of_a_message_never_blocks_the_host(tmp_path, small_model, monkeypatch,
                                                                          prefix_bytes, line):
    monkeypatch.setenv(worker_client.HEARTBEAT_ENV, "2")
    client = worker_client.WorkerClient(python=stopping_worker(tmp_path, prefix_bytes))
    job = ModelRun.resolve("upscale", small_model.parent, model_path=str(small_model), device="cpu")
    run = RemoteBatchRun(job, [FrameRef(1, Path("a.png"))], lambda ref: image(16), lambda ref, result: None,
                         options=job.options(), client=client)
    started = time.monotonic()
    try:
        with bounded(30.0), pytest.raises(LeanImageError) as raised:
            while not run.pump(0.01):
                pass
        text = str(raised.value)
        assert line in text and "\n" not in text
        assert not client.running
        assert run.longest_pump_s < 1.0  # no pump call waited for the missing bytes
        assert time.monotonic() - started < 25.0
    finally:
        client.kill()


# ---- both directions through a real worker, on both ways to connect -------------------------------
@pytest.mark.parametrize("listen", [False, True], ids=["POSIX socket pair", "Windows branch (dials in)"])
def test_a_real_job_with_a_long_frame_list_crosses_both_ways_through_files(small_model, monkeypatch, listen):
    """The job's frame list (host -> worker) and the worker's status with the job's timeline and
    marks (worker -> host) are over the frame cap: both cross as files, and the job runs whole."""
    carried, documents = [], []
    real_carried, real_document = wire._carried, wire._document
    monkeypatch.setattr(wire, "_carried", lambda data, *rest: (carried.append(len(data)), real_carried(data, *rest))[1])
    monkeypatch.setattr(wire, "_document", lambda *args: (documents.append(1), real_document(*args))[1])
    if listen:  # Linux' Popen refuses the Windows-only flag the branch passes (tests/test_worker_windows.py)
        real_popen = launch.subprocess.Popen
        monkeypatch.setattr(launch.subprocess, "Popen",
                            lambda args, creationflags=0, **kwargs: real_popen(args, **kwargs))
    client = worker_client.WorkerClient(listen=listen)
    frames = 200
    refs = [FrameRef(n, Path(f"/renders/shot_010/plate_v003/plate.{n:06d}.exr")) for n in range(1, frames + 1)]
    job = ModelRun.resolve("upscale", small_model.parent, model_path=str(small_model), device="cpu")
    written = []
    run = RemoteBatchRun(job, refs, lambda ref: image(8, ref.number), lambda ref, result: written.append(ref.number),
                         options=job.options(), client=client)
    try:
        with bounded(120.0):
            run.run()
        left = [f.name for folder in set(client.exchange.folders.values()) for f in folder.glob("*.bin")]
    finally:
        client.kill()
    assert sorted(written) == list(range(1, frames + 1))
    assert carried and max(carried) > wire.MAX_MESSAGE_BYTES  # the job went as a file
    assert documents  # and something long came back as one (the status with the job's timeline)
    assert left == []  # every file was removed once read


# ---- the timeline the worker sends is thinned to what a picture draws ------------------------------
def job_timeline(samples: int, *, vram: bool) -> dict:
    """A timeline as runtime/measure/timeline.py's as_dict gives it: a load, then runs that each
    rise and fall, sampled every 50 ms, with a mark per run (a frame every 0.25 s) and the edges."""
    rng = np.random.default_rng(1)
    t = np.arange(samples) * 0.05
    ram = 900e6 + 300e6 * (np.sin(t / 7.0) > 0) + rng.normal(0, 20e6, samples)
    ram[samples // 3] = 2.5e9  # one short spike: the job's peak, one sample wide
    gpu = 2e9 + 1e9 * np.cos(t / 11.0) ** 2
    rows = [(round(float(a), 4), {"ram": int(b), "vram": int(c) if vram else None}) for a, b, c in zip(t, ram, gpu, strict=True)]
    marks = [(rows[i][0], f"run {n}", dict(rows[i][1])) for n, i in enumerate(range(2, samples - 2, 5), 1)]
    edges = [(rows[0][0], "before", dict(rows[0][1])), (rows[-2][0], "release", dict(rows[-2][1])),
             (rows[-1][0], "after", dict(rows[-1][1]))]
    return {"samples": rows, "marks": sorted(marks + edges), "operation": "upscale", "outcome": "done", "peaks": {}}


@pytest.mark.parametrize("vram", [False, True], ids=["CPU job", "GPU job"])
def test_the_worker_sends_a_long_timeline_thinned_keeping_every_peak_and_mark(monkeypatch, vram):
    from lean_image_ai.models.worker.serve import Worker
    from lean_image_ai.runtime import get_runtime
    from lean_image_ai.runtime.measure import memory_plot, timeline

    full = job_timeline(120_000, vram=vram)  # 100 minutes at 20 samples a second
    monkeypatch.setattr(get_runtime(), "last_timeline", full)
    sent = Worker(None, None).status(with_job=True)["timeline"]
    series = 2 if vram else 1
    assert len(sent["samples"]) <= series * timeline.PLOT_POINTS < len(full["samples"]) // 50
    runs = [m for m in sent["marks"] if m[1].startswith("run ")]
    assert len(runs) <= series * timeline.PLOT_POINTS and sent["run_count"] == 24_000
    assert [m for m in sent["marks"] if not m[1].startswith("run ")] == [m for m in full["marks"] if
                                                                          not m[1].startswith("run ")]
    assert {m[:2] for m in runs} <= {m[:2] for m in full["marks"]} and sent["marks"] == sorted(sent["marks"])
    assert {k: v for k, v in sent.items() if k not in ("samples", "marks", "run_count")} == \
        {k: v for k, v in full.items() if k not in ("samples", "marks")}
    assert memory_plot.legend(sent) == memory_plot.legend(full)  # the runs counted, every series' low and peak
    times = [t for t, _ in sent["samples"]]
    assert times == sorted(times) and set(map(tuple, map(lambda s: (s[0],), sent["samples"]))) <= \
        {(t,) for t, _ in full["samples"]}
    sent_at = {t: v for t, v in sent["samples"]}
    step = -(-len(full["samples"]) // (timeline.PLOT_POINTS // 2))
    for key in ("ram", "vram") if vram else ("ram",):
        assert memory_plot.job_peak(sent, key) == memory_plot.job_peak(full, key)  # the one-sample spike too
        for start in range(0, len(full["samples"]), step):  # each stretch keeps its lowest and highest figure
            stretch = full["samples"][start:start + step]
            kept = [sent_at[t][key] for t, _ in stretch if t in sent_at]
            assert min(kept) == min(v[key] for _, v in stretch) and max(kept) == max(v[key] for _, v in stretch)
