"""runtime/child_process.py: a command line run in a real child process as a host's task, pumped
without a thread (what Blender's download lane does): its progress lines, its result, its one-line
error, and a cancel that stops a download mid-transfer and keeps what arrived."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from child_catalog import ChildCatalog  # noqa: E402
from lean_image_ai.models.store import installer  # noqa: E402
from lean_image_ai.runtime.child_process import ChildTask  # noqa: E402
from lean_image_ai.runtime.errors import LeanImageError, OperationCancelled  # noqa: E402
from model_server import loopback_entry, onnx_payload  # noqa: E402

CHUNK = 16 * 1024


@pytest.fixture
def served(server, tmp_path, monkeypatch):
    """A model on the loopback server that the child's catalog knows (tests/child_catalog.py)."""
    data = onnx_payload(24 * CHUNK)
    server.files["/m.onnx"] = data
    entry = loopback_entry(server.url("/m.onnx"), data, id="test-child", filename="test-child.onnx")
    ChildCatalog(tmp_path / "site", monkeypatch, CHUNK).write([entry])
    return server, entry, data, tmp_path / "models"


def _install(entry, folder, **keywords) -> ChildTask:
    return ChildTask(["models", "install", entry.id, "--models-dir", str(folder), "--json-progress"], **keywords)


def _pump(task: ChildTask, limit: float = 120.0) -> int:
    """Pump as a host's timer does; returns how many pumps it took."""
    deadline, pumps = time.monotonic() + limit, 0
    while not task.pump(0.01):
        pumps += 1
        assert time.monotonic() < deadline, "the child did not end"
    return pumps


def test_progress_then_the_result(served):
    _server, entry, data, folder = served
    seen = []
    task = _install(entry, folder, report=lambda fraction, stage: seen.append((fraction, stage)))
    _pump(task)
    result = task.result()
    assert Path(result["path"]).read_bytes() == data
    assert seen and seen[-1][0] == 1.0 and all(0.0 <= f <= 1.0 for f, _ in seen)
    assert [f for f, _ in seen] == sorted(f for f, _ in seen)
    assert not task.folder.exists()  # the child's files are gone with it


def test_the_error_is_the_commands_one_line(served):
    _server, _entry, _data, folder = served
    task = ChildTask(["models", "install", "nope", "--models-dir", str(folder), "--json-progress"])
    _pump(task)
    with pytest.raises(LeanImageError, match=r"^No model with id 'nope'\. `python -m lean_image_ai models list` shows the ids\.$"):
        task.result()


def test_cancel_mid_download_keeps_what_arrived_and_a_second_install_resumes(served):
    server, entry, data, folder = served
    server.throttle = 0.2  # about five seconds for the whole file: the cancel lands mid-transfer
    started = []
    task = _install(entry, folder, report=lambda fraction, stage: started.append(fraction),
                    cancel_text="cancelled by the test")  # fmt: skip
    while not started or started[-1] == 0.0:
        assert not task.pump(0.01)
    task.cancel()
    _pump(task)
    with pytest.raises(OperationCancelled, match="cancelled by the test"):
        task.result()
    part = installer.part_path(entry, folder)
    kept = part.stat().st_size
    assert 0 < kept < len(data)
    assert not (folder / entry.filename).exists()

    server.throttle = 0.0
    _pump(_install(entry, folder))
    assert (folder / entry.filename).read_bytes() == data
    assert server.requests[-1]["range"] == f"bytes={kept}-"  # resumed, not restarted


def test_a_child_that_ignores_the_cancel_is_killed_after_the_grace_time(served, tmp_path):
    _server, entry, _data, folder = served
    site = tmp_path / "site"
    ready = tmp_path / "ignoring"
    # the child ignores SIGTERM, as a hung one would (added to the test's sitecustomize)
    (site / "sitecustomize.py").write_text(
        (site / "sitecustomize.py").read_text() + "\nimport signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"open({str(ready)!r}, 'w').close()\nimport time\ntime.sleep(600)\n"
    )
    task = _install(entry, folder, grace_s=0.5, cancel_text="stopped")
    while not ready.exists():
        assert not task.pump(0.05)
    task.cancel()
    _pump(task, limit=30)
    assert task.process.returncode == -9
    with pytest.raises(OperationCancelled, match="stopped"):
        task.result()


def _silent_python(tmp_path) -> str:
    """An interpreter that starts and then says nothing (a child hung on a wedged driver)."""
    script = tmp_path / "silent_python"
    script.write_text("#!/bin/sh\nexec sleep 600\n")
    script.chmod(0o755)
    return str(script)


def test_wait_stops_a_child_that_says_nothing_in_one_line(tmp_path):
    task = ChildTask(["doctor", "--providers"], python=_silent_python(tmp_path))
    started = time.monotonic()
    with pytest.raises(LeanImageError) as raised:
        task.wait(poll_s=0.05, silent_s=0.5)
    assert time.monotonic() - started < 30
    message = str(raised.value)
    assert "\n" not in message and message.startswith("`doctor --providers` said nothing for 0 s and was stopped")
    assert message.endswith("-m lean_image_ai doctor --providers")
    assert task.process.returncode == -9 and task.done


def test_the_doctors_stop_has_a_deadline_for_a_child_that_outlives_its_kill(tmp_path, monkeypatch):
    """A process in an uninterruptible sleep outlives SIGKILL; that cannot be made here, so the
    real child's kill() is swallowed and stop() must still return within its deadline."""
    from lean_image_ai.runtime.log import doctor_process

    monkeypatch.setattr(doctor_process, "KILL_WAIT_S", 0.3)
    run = doctor_process.start(python=_silent_python(tmp_path))
    real_kill, kills = run.process.kill, []
    run.process.kill = lambda: kills.append(run.process.pid)
    started = time.monotonic()
    try:
        doctor_process.stop(run)
        assert time.monotonic() - started < 10 and kills == [run.process.pid]
        assert run.text == f"The doctor was stopped. It did not end when killed (process {run.process.pid}, left running)."
        assert not run.folder.exists()
    finally:
        real_kill()
        run.process.wait(10)


def test_a_venv_of_the_hosts_own_base_python_is_another_interpreter(tmp_path, monkeypatch):
    """Its bin/python resolves to the host's binary, yet its packages are its own: it gets only
    the add-on's folder, not the host's sys.path (which would shadow its numpy and onnxruntime)."""
    import subprocess

    from lean_image_ai.runtime import child_process

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    other = str(tmp_path / "venv" / "bin" / "python")
    assert child_process.is_host_python(sys.executable) and child_process.is_host_python(None)
    assert not child_process.is_host_python(other)
    monkeypatch.setenv("PYTHONHOME", "/blender/python")  # a host's: it would load the host's standard library
    env = child_process.environment(other, tmp_path)
    root = Path(child_process.ADDON_ROOT)
    assert env["PYTHONPATH"] == str(root.parent if root.name == child_process.PACKAGE else tmp_path)
    assert "PYTHONHOME" not in env
    (tmp_path / "host").mkdir()
    assert child_process.environment(sys.executable, tmp_path / "host")["PYTHONHOME"] == "/blender/python"
