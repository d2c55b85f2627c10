"""Issue 33 item 8: `models install` stops on the first Ctrl+C or SIGTERM (exit 130 / 143), its
partial download kept for the next install to resume. A real CLI process downloads from the
loopback model server (tests/model_server.py), which serves slowly enough for the signal to land
mid-transfer."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from model_server import onnx_payload

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

TESTS = Path(__file__).resolve().parent
SIZE = 2 << 20  # 128 chunks of 16 KB


def _start(url: str, data: bytes, folder: Path) -> subprocess.Popen:
    """`models install test-slow` in its own process, its catalog one loopback entry."""
    prelude = (
        "import contextlib, sys\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "from lean_image_ai.models.store import library\n"
        "from lean_image_ai.models.store.catalog import Catalog\n"
        "from model_server import loopback_entry, loopback_http\n"
        f"entry = loopback_entry({url!r}, None, size_bytes={len(data)}, "
        f"sha256={hashlib.sha256(data).hexdigest()!r}, id='test-slow', filename='test-slow.onnx')\n"
        "library.catalog = lambda _folder: Catalog(builtin=[entry])\n"
        "_allowed = contextlib.ExitStack()  # kept: the allowance lasts the whole process\n"
        "_allowed.enter_context(loopback_http())\n"
        "from lean_image_ai.ui.cli.main import main\n"
        f"sys.exit(main(['models', 'install', 'test-slow', '--models-dir', {str(folder)!r}]))\n"
    )
    env = {**os.environ, "LEAN_IMAGE_AI_LOG_DIR": str(folder.parent / "logs")}
    return subprocess.Popen([sys.executable, "-c", prelude], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _when_downloading(proc: subprocess.Popen) -> None:
    for line in proc.stdout:
        if "downloading:" in line and "[  0%]" not in line:  # bytes have arrived
            return
    raise AssertionError("the install ended before downloading: " + proc.stderr.read())


@pytest.mark.parametrize("signum, code, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl+C")])
def test_the_first_signal_stops_the_install_and_keeps_the_partial_file(server, tmp_path, signum, code, name):
    data = onnx_payload(SIZE)
    server.files["/slow.onnx"] = data
    server.throttle = 0.1  # about 13 s for the whole file: the signal lands mid-transfer
    folder = tmp_path / "models"
    proc = _start(server.url("/slow.onnx"), data, folder)
    _when_downloading(proc)
    proc.send_signal(signum)
    signalled = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    stopped_after = time.monotonic() - signalled
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr
    assert f"{name}: cancelling the download now" in stderr  # not "after the current model run"
    assert stderr.strip().splitlines()[-1].startswith(f"Stopped by {name}; the partial download is kept"), stderr
    part = folder / "test-slow.onnx.part"
    assert not (folder / "test-slow.onnx").exists()  # not installed anyway
    assert 0 < part.stat().st_size < len(data)
    # stopped mid-transfer, not after it: well under the time the rest of the file takes
    assert stopped_after < 0.5 * (len(data) - part.stat().st_size) / (16 * 1024) * server.throttle

    server.throttle = 0.0
    resumed = _start(server.url("/slow.onnx"), data, folder)
    _, stderr = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, stderr
    assert (folder / "test-slow.onnx").read_bytes() == data
    assert server.requests[-1]["range"] is not None  # resumed from the kept bytes
