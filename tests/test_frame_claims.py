"""Two `--skip-existing` runs on one folder share the work: each missing frame is computed by one
of them (models/batch/frame_claims.py), a dead writer's claim is free at once, nothing is left behind
and a file that is not a claim is never removed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from lean_image_ai.models.batch.frame_claims import FrameClaims, claim_path
from lean_image_ai.runtime.errors import LeanImageError
from PIL import Image

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the subprocess holders use fcntl")

FRAMES = 12

# both processes wait for each other before planning (so neither finishes before the other
# starts), and each progress report waits a little (so frames take long enough to overlap)
TOGETHER = (
    "import os, sys, time\n"
    "from pathlib import Path\n"
    "gate = Path(sys.argv[1])\n"
    "(gate / str(os.getpid())).touch()\n"
    "while len(list(gate.iterdir())) < 2:\n"
    "    time.sleep(0.01)\n"
    "from lean_image_ai.ui.cli import main as _cli\n"
    "_report = _cli._Progress.__call__\n"
    "def _slow(self, fraction, stage):\n"
    "    _report(self, fraction, stage)\n"
    "    time.sleep(0.03)\n"
    "_cli._Progress.__call__ = _slow\n"
    "sys.exit(_cli.main(sys.argv[2:]))\n"
)


def _frames(folder: Path) -> str:
    rng = np.random.default_rng(5)
    for number in range(1, FRAMES + 1):
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), np.uint8)).save(folder / f"s_{number:04d}.png")
    return str(folder / "s_####.png")


def test_two_skip_existing_runs_on_one_folder_compute_each_frame_once(tmp_path):
    pattern = _frames(tmp_path)
    out = tmp_path / "out"
    gate = tmp_path / "gate"
    gate.mkdir()
    args = ["upscale", pattern, str(out / "o_####.png"), "--device", "cpu", "--tile", "16", "--skip-existing"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TOGETHER, str(gate), *args],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [proc.communicate(timeout=240) for proc in procs]
    wrote = []
    for proc, (stdout, stderr) in zip(procs, results, strict=True):
        assert proc.returncode == 0, stderr
        assert "Traceback" not in stderr
        wrote.append({Path(line.split()[1]).name for line in stdout.splitlines() if line.startswith("wrote:")})
        summary = json.loads(stdout.strip().splitlines()[-1])
        assert summary["written"] == len(wrote[-1])
        assert summary["written"] + summary["skipped"] == FRAMES, summary
    assert not wrote[0] & wrote[1], "a frame was computed by both processes"
    assert wrote[0] | wrote[1] == {f"o_{n:04d}.png" for n in range(1, FRAMES + 1)}
    assert wrote[0] and wrote[1], f"one process did everything: {wrote}"  # the work was shared
    assert sorted(p.name for p in out.iterdir()) == sorted(wrote[0] | wrote[1])  # no claim or temp file left


HOLD = (
    "import os, sys, time\n"
    "from lean_image_ai.models.batch.frame_claims import FrameClaims\n"
    "claims = FrameClaims()\n"
    "print(claims.take(sys.argv[1]), flush=True)\n"
    "time.sleep(60)\n"
)


def _holder(target: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(target)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "True"
    return proc


def test_a_claim_held_by_a_live_process_is_skipped_and_a_killed_ones_taken_over(tmp_path):
    target = tmp_path / "o_0001.png"
    holder = _holder(target)
    try:
        claims = FrameClaims()
        assert claims.take(target) is False  # that process is computing it now
        assert b"pid %d" % holder.pid in claim_path(target).read_bytes()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert claim_path(target).exists()  # SIGKILL ran no cleanup: its claim file stays, unlocked
    assert claims.take(target) is True  # free at once, no waiting for an age limit
    assert b"pid %d" % os.getpid() in claim_path(target).read_bytes()
    claims.release(target)
    assert list(tmp_path.iterdir()) == []


def test_an_output_written_meanwhile_is_skipped_and_leaves_no_claim(tmp_path):
    target = tmp_path / "o_0001.png"
    target.write_bytes(b"done by another process")
    claims = FrameClaims()
    assert claims.take(target) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o_0001.png"]


def test_a_file_in_the_way_that_is_not_a_claim_is_never_removed(tmp_path):
    target = tmp_path / "o_0001.png"
    foreign = claim_path(target)
    foreign.write_bytes(b"a user's own notes")
    with pytest.raises(LeanImageError, match="is in the way of this frame's claim file and is not one"):
        FrameClaims().take(target)
    assert foreign.read_bytes() == b"a user's own notes"


def test_a_claim_file_removed_between_open_and_lock_is_claimed_anew(tmp_path, monkeypatch):
    """The holder removes its claim file while locked; a claimant that opened the old file just
    before finds it gone once it gets the lock and claims a new file, so one frame never has two
    holders (one on the removed file, one on the new)."""
    from lean_image_ai.models.batch import frame_claims

    target = tmp_path / "o_0001.png"
    first, second = FrameClaims(), FrameClaims()
    assert first.take(target)
    real_lock, calls = frame_claims._try_lock, []

    def release_then_lock(fd):
        calls.append(os.fstat(fd).st_ino)
        if len(calls) == 1:
            first.release(target)  # between the claimant's open and its lock
        return real_lock(fd)

    monkeypatch.setattr(frame_claims, "_try_lock", release_then_lock)
    assert second.take(target) is True
    assert len(calls) == 2  # it went round again, on the new file (the old inode may be reused)
    assert os.stat(claim_path(target)).st_ino == calls[1]
    monkeypatch.setattr(frame_claims, "_try_lock", real_lock)
    assert first.take(target) is False  # the new claim is held
    second.release_all()
    assert list(tmp_path.iterdir()) == []
