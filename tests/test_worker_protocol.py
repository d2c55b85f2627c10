"""The worker's protocol (models/worker/protocol.py, wire.py): every message a frozen dataclass
with a stable kind; what crosses is JSON plus raw array bytes, never a pickle; the job crosses as
plain values; the worker's hello carries its version and a mismatch is one line naming both and
ends that worker; a worker under Python 3.13 and numpy 2 driven by this 3.11 / numpy 1.26 host
gives the same pixels as one under the host's own Python."""

from __future__ import annotations

import dataclasses
import json
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from builders_upscale import compact_model  # noqa: E402
from lean_image_ai.models.adapters.upscale import UpscaleResult  # noqa: E402
from lean_image_ai.models.batch.frame_lists import FrameRef  # noqa: E402
from lean_image_ai.models.model_run import ModelRun  # noqa: E402
from lean_image_ai.models.worker import client as worker_client  # noqa: E402
from lean_image_ai.models.worker import protocol as p  # noqa: E402
from lean_image_ai.models.worker import wire  # noqa: E402
from lean_image_ai.models.worker.remote_batch import RemoteBatchRun  # noqa: E402
from lean_image_ai.runtime.errors import LeanImageError  # noqa: E402

PY313 = Path.home() / ".pyenv/versions/3.13.0/bin/python3"
WORKER313 = Path.home() / ".cache/lean_image_ai/worker313"


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return compact_model(tmp_path_factory.mktemp("protocol") / "small.onnx", num_conv=4, feat=8)


@pytest.fixture
def exchange():
    made = wire.Exchange.create()
    yield made
    made.remove()


class Pipe:
    """Both ends of a connection in this process: what one side sends, the other receives."""

    def __init__(self):
        from multiprocessing import Pipe as make

        self.a, self.b = make()

    def cross(self, message, exchange):
        wire.send(self.a, message, exchange)
        return wire.receive(self.b, exchange)


def test_every_kind_has_one_frozen_message_and_a_stable_tag():
    assert len(p.KINDS) == 20 and all(cls.KIND == kind for kind, cls in p.KINDS.items())
    for cls in p.KINDS.values():
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen


def test_a_result_record_crosses_as_json_and_raw_bytes_never_a_pickle(exchange):
    image = np.random.default_rng(0).random((33, 17, 4), dtype=np.float32)
    result = UpscaleResult(image, 4, 64, warnings=["a note"], clipped=None)
    message = p.Result(7, result)
    pipe = Pipe()
    wire.send(pipe.a, message, exchange)
    frame = pipe.b.recv_bytes()
    document = json.loads(frame)  # one JSON document: no pickle opcode could parse as JSON
    assert document["kind"] == "result" and document["arrays"][0]["dtype"] == "<f4"
    assert document["arrays"][0]["shape"] == [33, 17, 4] and not frame.startswith(b"\x80")
    exchange.discard(document["arrays"])

    wire.send(pipe.a, message, exchange)
    back = wire.receive(pipe.b, exchange)
    assert isinstance(back, p.Result) and back.number == 7
    assert isinstance(back.result, UpscaleResult) and back.result.image.tobytes() == image.tobytes()
    assert back.result.warnings == ["a note"] and back.result.scale == 4
    assert not [f for folder in exchange.folders.values() for f in folder.iterdir()]  # every file read and removed


def test_the_job_crosses_as_plain_values(small_model):
    job = ModelRun.resolve("upscale", small_model.parent, model_path=str(small_model), device="cpu")
    values = p.run_values(job)
    assert json.loads(json.dumps(values)) == values  # nothing but JSON
    again = p.run_from(values)
    assert again.family_id == "upscale" and Path(again.model.path) == small_model.resolve()
    assert again.adapter_kwargs() == job.adapter_kwargs() and again.budgets == job.budgets


@dataclasses.dataclass
class Unregistered:
    value: int


def test_nothing_outside_the_package_is_built_or_sent(exchange):
    with pytest.raises(TypeError, match="cannot cross"):
        p.encode(p.Answer(object()))
    with pytest.raises(TypeError, match="cannot cross"):  # a record of no registered family's module
        p.encode(p.Answer(Unregistered(1)))
    with pytest.raises(p.ProtocolError):
        p.decode({"kind": "answer", "fields": {"value": {"$record": f"@{__name__}:Unregistered", "fields": {}}}}, [])
    forged = {"kind": "answer", "fields": {"value": {"$record": "os:system", "fields": {}}}}
    with pytest.raises(p.ProtocolError):
        p.decode(forged, [])
    with pytest.raises(p.ProtocolError):
        p.decode({"kind": "no such kind", "fields": {}}, [])


def wrapper(tmp_path: Path, version: int) -> Path:
    """An interpreter whose worker says another protocol version (an add-on of another release)."""
    script = tmp_path / "other_python"
    code = ("import runpy, sys; import lean_image_ai.models.worker.protocol as p; "
            f"p.VERSION = {version}; sys.argv = ['worker', *sys.argv[1:]]; "
            "runpy.run_module('lean_image_ai.models.worker', run_name='__main__')")
    script.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} -c "{code}" "$@"\n')
    script.chmod(0o755)
    return script


def run_job(client, model, pixels):
    job = ModelRun.resolve("upscale", model.parent, model_path=str(model), device="cpu")
    written = []
    run = RemoteBatchRun(job, [FrameRef(1, Path("a.png"))], lambda ref: pixels,
                         lambda ref, result: written.append(result), options=job.options(), client=client)
    run.run()
    return written


def test_another_protocol_version_is_one_line_naming_both_and_ends_that_worker(tmp_path, small_model):
    client = worker_client.WorkerClient(python=wrapper(tmp_path, p.VERSION + 5))
    try:
        with pytest.raises(LeanImageError) as raised:
            run_job(client, small_model, np.zeros((8, 8, 4), np.float32))
        text = str(raised.value)
        assert f"protocol version {p.VERSION + 5}, this add-on version {p.VERSION}" in text and "\n" not in text
        assert not client.running and client.folder is None
    finally:
        client.kill()


def _worker313() -> Path:
    python = WORKER313 / "bin" / "python"
    if not python.exists():
        if not PY313.exists():
            pytest.skip("no Python 3.13 here (pyenv 3.13.0)")
        made = subprocess.run([str(PY313), "-m", "venv", str(WORKER313)], capture_output=True, text=True)
        if made.returncode == 0:
            made = subprocess.run([str(python), "-m", "pip", "install", "-q", "numpy>=2", "onnxruntime"],
                                  capture_output=True, text=True, timeout=900)
        if made.returncode != 0:  # no index reachable (a CI without the wheels): pip's own words
            subprocess.run(["rm", "-rf", str(WORKER313)], check=False)
            pytest.skip((made.stderr.strip().splitlines() or ["the 3.13 worker venv could not be built"])[-1])
    return python


def test_a_python_313_numpy_2_worker_gives_the_pixels_of_the_hosts_own(small_model):
    python = _worker313()
    pixels = np.random.default_rng(5).random((24, 24, 4), dtype=np.float32)
    foreign = worker_client.WorkerClient(python=python)
    own = worker_client.WorkerClient()
    try:
        there = run_job(foreign, small_model, pixels)
        assert foreign.peer.python.startswith("3.13") and foreign.peer.numpy.startswith("2.")
        assert (foreign.peer.python, foreign.peer.numpy) != (sys.version.split()[0], np.__version__)
        here = run_job(own, small_model, pixels)
    finally:
        foreign.kill()
        own.kill()
    assert there[0].image.dtype == here[0].image.dtype and there[0].image.tobytes() == here[0].image.tobytes()


HOSTILE_PREFIX = struct.pack("!i", -1) + struct.pack("!Q", 1 << 40)  # multiprocessing's long form: 1 TiB follows


@pytest.mark.parametrize("prefix", [HOSTILE_PREFIX, struct.pack("!i", 512 << 20), struct.pack("!i", 20 << 10)],
                         ids=["1 TiB", "512 MiB", "20 KiB"])
def test_a_huge_length_prefix_is_refused_from_the_prefix_without_waiting_for_its_bytes(exchange, prefix):
    """Issue #37 hostrt item 3: a peer that announces more than any message is (and sends nothing
    more) is a ProtocolError at once. Before, recv_bytes took memory for 1 TiB (a MemoryError) and
    read on for 512 MiB that never came: the receiver (Blender's main thread) blocked for good.
    Issue #37 wire: a frame is at most 8 KiB now (a longer message crosses as a file), so a 20 KiB
    prefix, which the 256 MiB cap let through to a read that waited for the missing bytes, is refused too."""
    pipe = Pipe()
    pipe.a._send(prefix)

    def stuck(signum, frame):
        raise TimeoutError("receive waited for the announced bytes")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        with pytest.raises(p.ProtocolError, match="a message longer than the 8 KiB the connection carries"):
            wire.receive(pipe.b, exchange)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def hostile_worker(tmp_path: Path) -> Path:
    """An interpreter whose worker says hello, then answers a job with a 1 TiB length prefix."""
    code = tmp_path / "hostile.py"
    code.write_text(
        "import runpy, sys\n"
        "import lean_image_ai.models.worker.wire as wire\n"
        "real = wire.send\n"
        "def send(conn, message, exchange):\n"
        "    if type(message).__name__ == 'Hello':\n"
        "        return real(conn, message, exchange)\n"
        f"    conn._send({HOSTILE_PREFIX!r})\n"
        "wire.send = send\n"
        "sys.argv = ['worker', *sys.argv[1:]]\n"
        "runpy.run_module('lean_image_ai.models.worker', run_name='__main__')\n"
    )
    script = tmp_path / "hostile_python"
    script.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {code} "$@"\n')
    script.chmod(0o755)
    return script


def test_a_worker_sending_a_huge_length_prefix_ends_the_job_in_one_line_and_is_replaced(tmp_path, small_model):
    client = worker_client.WorkerClient(python=hostile_worker(tmp_path))
    pixels = np.random.default_rng(0).random((8, 8, 4), dtype=np.float32)
    try:
        with pytest.raises(LeanImageError) as raised:
            run_job(client, small_model, pixels)
        text = str(raised.value)
        assert "could not be received" in text and "KiB the connection carries" in text and "\n" not in text
        assert not client.running and client.folder is None  # reset: the next job starts a fresh worker
        client.python = ""  # the host's own Python: a worker that speaks the protocol
        (result,) = run_job(client, small_model, pixels)
        assert client.spawns == 2 and result.image.shape[:2] == (32, 32)
    finally:
        client.kill()
