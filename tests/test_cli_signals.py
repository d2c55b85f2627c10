"""A render farm's cancel (SIGTERM) and a kill (SIGKILL), sent for real to real CLI processes:
finished frames are kept, none is half-written, no temporary file stays, and a later
`--skip-existing` run removes what a killed run left of its own outputs (and nothing else)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import temp_writer
from lean_image_ai.models import files
from PIL import Image

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

# each progress report waits a little, so a 12-frame job lasts seconds and the signal lands mid-job
SLOW = (
    "import time\n"
    "from lean_image_ai.ui.cli import main as _cli\n"
    "_report = _cli._Progress.__call__\n"
    "def _slow(self, fraction, stage):\n"
    "    _report(self, fraction, stage)\n"
    "    time.sleep(0.02)\n"
    "_cli._Progress.__call__ = _slow\n"
)


def _frames(folder: Path, count: int = 12) -> str:
    rng = np.random.default_rng(3)
    for number in range(1, count + 1):
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), np.uint8)).save(folder / f"s_{number:04d}.png")
    return str(folder / "s_####.png")


def _start(args, cwd, prelude=SLOW) -> subprocess.Popen:
    code = f"{prelude}\nimport sys\nfrom lean_image_ai.ui.cli.main import main\nsys.exit(main({list(args)!r}))"
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _after_first_frame(proc: subprocess.Popen) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("wrote:"):
            return lines
    raise AssertionError("the job ended before writing a frame: " + "".join(lines) + proc.stderr.read())


def _check_outputs(out: Path) -> list[str]:
    """Every output a whole PNG, no temporary file anywhere."""
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if n.startswith(".")], names
    for name in names:
        with Image.open(out / name) as image:
            image.load()
            assert image.size == (128, 96)
    return names


@pytest.mark.parametrize("signals", [1, 2], ids=["one SIGTERM", "two SIGTERMs"])
def test_sigterm_stops_after_the_current_frame_keeps_finished_ones_exit_143(tmp_path, signals):
    pattern = _frames(tmp_path)
    out = tmp_path / "out"
    proc = _start(["upscale", pattern, str(out / "o_####.png"), "--device", "cpu", "--tile", "16"], tmp_path)
    lines = _after_first_frame(proc)
    for _ in range(signals):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.01)
    stdout, stderr = proc.communicate(timeout=120)
    lines += stdout.splitlines(keepends=True)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("Stopped by SIGTERM;"), stderr
    written = _check_outputs(out)
    assert 1 <= len(written) < 12
    assert len([line for line in lines if line.startswith("wrote:")]) == len(written)


def test_sigint_still_exits_130(tmp_path):
    pattern = _frames(tmp_path, 6)
    out = tmp_path / "out"
    proc = _start(["upscale", pattern, str(out / "o_####.png"), "--device", "cpu", "--tile", "16"], tmp_path)
    _after_first_frame(proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1].startswith("Stopped by Ctrl+C;")
    _check_outputs(out)


def test_skip_existing_removes_stale_temp_files_of_its_own_outputs_only(tmp_path):
    """A real SIGKILL half-way through writing frame 3 leaves its temporary file; the retry with
    --skip-existing removes it (and only it) and writes what is missing."""
    pattern = _frames(tmp_path, 4)
    out = tmp_path / "out"
    kill_in_write = (
        "import os, signal\n"
        "from lean_image_ai.models import files as _files\n"
        "_install = _files._install\n"
        "def _dying(made, written, target):\n"
        "    if target.name == 'o_0003.png':\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    _install(made, written, target)\n"
        "_files._install = _dying\n"
    )
    args = ["upscale", pattern, str(out / "o_####.png"), "--device", "cpu"]
    killed = _start(args, tmp_path, prelude=kill_in_write)
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL
    left = [p for p in out.iterdir() if p.name.startswith(".o_0003.png.")]
    assert len(left) == 1, sorted(p.name for p in out.iterdir())
    # not ours: another name's temp file, a user's hidden file that looks alike
    foreign = files.temp_path_for(out / "someone_else.png")
    foreign.write_bytes(b"x")
    lookalike = out / ".o_0004.png.notatoken.tmp.png"
    lookalike.write_bytes(b"x")
    past = time.time() - 60
    for path in (left[0], foreign, lookalike):
        os.utime(path, (past, past))
    writer, live = temp_writer.start(out / "o_0003.png")  # another task writing the same output right now
    try:
        os.utime(live, (past, past))  # as old as the killed run's: its writer's lock keeps it
        done = subprocess.run(
            [sys.executable, "-m", "lean_image_ai", *args, "--skip-existing"], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert live.exists()
    finally:
        temp_writer.kill(writer)
    live.unlink()
    assert done.returncode == 0, done.stderr
    assert f"removed a temporary file left by an interrupted run: {left[0]}" in done.stderr
    assert not left[0].exists() and foreign.exists() and lookalike.exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [f"o_{n:04d}.png" for n in range(1, 5)]


def test_a_temp_of_a_writer_killed_just_before_the_final_run_is_gone_when_it_ends(tmp_path):
    """Issue #39 item 13: a writer killed a moment before the final --skip-existing run left a
    temporary file younger than the stale age at the run's start: it stayed. Its lock went with
    the writer, so the run removes it, by its end at the latest. Three rounds, each killed anew."""
    pattern = _frames(tmp_path, 2)
    out = tmp_path / "out"
    out.mkdir()
    args = [sys.executable, "-m", "lean_image_ai", "upscale", pattern, str(out / "o_####.png"), "--device", "cpu", "--skip-existing"]
    assert subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120).returncode == 0
    for _ in range(3):
        (out / "o_0002.png").unlink()
        writer, left = temp_writer.start(out / "o_0002.png")
        temp_writer.kill(writer)
        done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert f"removed a temporary file left by an interrupted run: {left}" in done.stderr
        assert sorted(p.name for p in out.iterdir()) == ["o_0001.png", "o_0002.png"]


def test_a_stop_at_once_while_a_model_runs_in_native_code_exits_143_not_abort(tmp_path):
    """The second SIGTERM lands while the batch's worker thread is inside onnxruntime (held there
    by repeating its run for seconds): the process must still end with 143, not with onnxruntime's
    'terminate called without an active exception' (SIGABRT) from a finalising interpreter."""
    hold_in_native_run = (
        "import os, signal, time, onnxruntime\n"
        "_run = onnxruntime.InferenceSession.run_with_iobinding\n"
        "_calls = [0]\n"
        "def _run_then_stop(self, *a, **k):\n"
        "    _calls[0] += 1\n"
        "    if _calls[0] != 3:\n"
        "        return _run(self, *a, **k)\n"
        "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.05); os.kill(os.getpid(), signal.SIGTERM)\n"
        "    end = time.monotonic() + 3\n"
        "    while time.monotonic() < end:\n"
        "        _run(self, *a, **k)\n"
        "onnxruntime.InferenceSession.run_with_iobinding = _run_then_stop\n"
    )
    out = tmp_path / "out"
    proc = _start(["upscale", _frames(tmp_path, 6), str(out / "o_####.png"), "--device", "cpu", "--tile", "16"],
                  tmp_path, prelude=hold_in_native_run)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "terminate called" not in stderr and stderr.strip().splitlines()[-1].startswith("Stopped by SIGTERM;"), stderr
    if out.exists():
        _check_outputs(out)
