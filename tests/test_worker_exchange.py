"""The exchange folder cannot lock anyone out (models/worker/wire.py): a frame the in-memory folder
has no room for crosses through the folder on disk (said once in the event log), a write that
fails leaves no partial file, both folders full is one line; a tiny tmpfs as /dev/shm, mounted in a
private mount namespace (``unshare -m``), still runs a big job and then a 16x16 one. The worker
removes its folders when its connection ends (a host killed by SIGKILL), the client at exit (a
headless script that never calls stop_shared), and a start removes folders whose owner is gone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from builders_upscale import compact_model  # noqa: E402
from lean_image_ai.models.worker import client as worker_client  # noqa: E402
from lean_image_ai.models.worker import wire  # noqa: E402

needs_unshare = pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0 or not sys.platform.startswith("linux"),
    reason="a private mount namespace needs unshare as root on Linux",
)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return compact_model(tmp_path_factory.mktemp("exchange") / "small.onnx", num_conv=4, feat=8)


def in_namespace(script: str, *args: str, mounts: str = "mount -t tmpfs -o size=1m tmpfs /dev/shm") -> list[dict]:
    """``script`` run by this Python in a private mount namespace; its JSON lines."""
    done = subprocess.run(["unshare", "-m", "sh", "-c", f'{mounts} && exec "$0" -c "$@"',
                           sys.executable, script, *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


JOBS = """
import json, sys
from pathlib import Path
import numpy as np
from lean_image_ai.models.batch.frame_lists import FrameRef
from lean_image_ai.models.model_run import ModelRun
from lean_image_ai.models.worker.client import WorkerClient
from lean_image_ai.models.worker.remote_batch import RemoteBatchRun
from lean_image_ai.models.worker import host_record

model = Path(sys.argv[1])
client = WorkerClient()
for size in (256, 16, 256):
    job = ModelRun.resolve("upscale", model.parent, model_path=str(model), device="cpu")
    pixels = np.random.default_rng(size).random((size, size, 4), dtype=np.float32)
    out = []
    RemoteBatchRun(job, [FrameRef(1, Path("a.png"))], lambda ref: pixels, lambda ref, r: out.append(r.image),
                   options=job.options(), client=client).run()
    same = out[0].tobytes() == job.infer(pixels).image.tobytes()
    left = [str(f) for folder in client.exchange.folders.values() for f in folder.iterdir() if f.suffix == ".bin"]
    print(json.dumps({"size": size, "same": same, "left": left, "spilled": client.exchange.spilled,
                      "memory": str(client.exchange.folders["m"])}))
print(json.dumps({"notices": [e["text"] for e in host_record.events.recent("exchange_spill")]}))
client.kill()
"""


@needs_unshare
def test_a_frame_too_big_for_a_1_mib_tmpfs_crosses_on_disk_and_a_16x16_job_follows(small_model):
    *jobs, notices = in_namespace(JOBS, str(small_model))
    assert [j["size"] for j in jobs] == [256, 16, 256] and all(j["same"] and j["left"] == [] for j in jobs)
    assert jobs[0]["memory"].startswith("/dev/shm/") and jobs[0]["spilled"] >= 1
    assert jobs[1]["spilled"] == jobs[0]["spilled"]  # 16x16 fits in memory: nothing more went to disk
    assert len(notices["notices"]) == 1 and "has no room for a 1 MiB frame" in notices["notices"][0]


PARTIAL = """
import errno, json, sys
from pathlib import Path
import numpy as np
from lean_image_ai.models.worker import wire

memory, disk = Path(sys.argv[1]), Path(sys.argv[2])
exchange = wire.Exchange(memory, disk)
wire._free = lambda folder: 1 << 40  # the room "seen" before writing is gone when writing (another process took it)
array = np.ones((512, 512, 4), np.float32)  # 4 MiB: more than the 1 MiB tmpfs
written = []
exchange.write(array, written)
print(json.dumps({"entry": written, "memory_files": [f.name for f in memory.iterdir()],
                  "same": exchange.read(written[0]).tobytes() == array.tobytes()}))
"""


@needs_unshare
def test_a_write_that_runs_out_of_room_leaves_no_partial_file_and_goes_to_disk(tmp_path):
    memory, disk = Path("/dev/shm") / "lean_image_ai_worker_partial", tmp_path / "disk"
    disk.mkdir()
    (result,) = in_namespace(PARTIAL, str(memory), str(disk),
                             mounts=f"mount -t tmpfs -o size=1m tmpfs /dev/shm && mkdir {memory}")
    assert result["memory_files"] == [] and result["entry"][0]["where"] == "d" and result["same"]
    assert list(disk.iterdir()) == []  # read, then removed


@needs_unshare
def test_both_folders_full_is_one_line_and_leaves_nothing(tmp_path):
    full = """
import json, sys
from pathlib import Path
import numpy as np
from lean_image_ai.models.worker import wire
exchange = wire.Exchange(Path(sys.argv[1]), Path(sys.argv[2]))
try:
    exchange.write(np.ones((512, 512, 4), np.float32), [])
except wire.ExchangeError as exc:
    print(json.dumps({"error": str(exc), "left": [str(f) for d in exchange.folders.values() for f in d.iterdir()]}))
"""
    disk = tmp_path / "disk"
    disk.mkdir()
    (result,) = in_namespace(full, "/dev/shm", str(disk), mounts=f"mount -t tmpfs -o size=1m tmpfs /dev/shm && "
                             f"mount -t tmpfs -o size=1m tmpfs {disk}")
    assert result["error"].startswith("No room for a 4 MiB frame to cross to the model process (")
    assert result["error"].endswith("free some disk space and run it again.") and result["left"] == []


def test_a_start_removes_the_folders_of_a_host_that_is_gone(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(60)
    stale = Path(tempfile.mkdtemp(prefix=f"{wire.PREFIX}{gone.pid}_"))
    (stale / "1-1.bin").write_bytes(b"x" * 1000)
    mine = Path(tempfile.mkdtemp(prefix=f"{wire.PREFIX}{os.getpid()}_"))
    client = worker_client.WorkerClient()
    try:
        client.ensure()
        assert not stale.exists() and mine.exists()
    finally:
        client.kill()
        shutil.rmtree(mine, ignore_errors=True)


HOST = """
import json, os, signal, sys
from pathlib import Path
import numpy as np
from lean_image_ai.models.batch.frame_lists import FrameRef
from lean_image_ai.models.model_run import ModelRun
from lean_image_ai.models.worker.client import shared
from lean_image_ai.models.worker.remote_batch import RemoteBatchRun

model = Path(sys.argv[1])
job = ModelRun.resolve("upscale", model.parent, model_path=str(model), device="cpu")
client = shared()
RemoteBatchRun(job, [FrameRef(1, Path("a.png"))], lambda ref: np.zeros((16, 16, 4), np.float32), lambda ref, r: None,
               options=job.options(), client=client).run()
print(json.dumps({"pid": client.pid, "folders": [str(f) for f in client.exchange.folders.values()]}), flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_no_folder_or_worker_outlives_its_host(small_model, how):
    done = subprocess.run([sys.executable, "-c", HOST, str(small_model), how], capture_output=True, text=True,
                          timeout=600)
    (state,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert state["folders"] and all(Path(f).parent in (Path("/dev/shm"), Path(tempfile.gettempdir()))
                                    for f in state["folders"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_alive(state["pid"]) or any(Path(f).exists() for f in state["folders"])):
        time.sleep(0.05)
    assert not _alive(state["pid"]) and not any(Path(f).exists() for f in state["folders"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (its parent, the killed host, is gone; the init of this container may not reap it)
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
