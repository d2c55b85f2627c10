"""The device menu's question and the Run Doctor button ask the worker's Python (issue 40): with
LEAN_IMAGE_AI_WORKER_PYTHON naming a Python 3.13 venv (numpy 2, the CPU onnxruntime and the
WebGPU plugin EP), real Blender (the bpy wheel, Python 3.11 with onnxruntime-gpu) gets that
interpreter's answer, not its own."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402
from engine_pythons import engine_venv  # noqa: E402

pytest.importorskip("bpy")

_BLENDER_SIDE = textwrap.dedent(
    """
    import json, sys, time
    import bpy
    import lean_image_ai
    lean_image_ai.register()
    from lean_image_ai.operators import gpu_ops
    from lean_image_ai.ui import runtime_probe
    answer = runtime_probe.answer()  # background mode: the first question waits for the child
    bpy.ops.lean_image_ai.run_doctor()
    deadline = time.monotonic() + 240
    while gpu_ops.poll_doctor() is not None and time.monotonic() < deadline:  # what the timer does
        time.sleep(0.1)
    run = gpu_ops.doctor["run"]
    lean_image_ai.unregister()
    print("RESULT " + json.dumps(dict(answer=answer, report=run.text, ok=run.ok,
                                      onnxruntime_here="onnxruntime" in sys.modules)))
    """
)


def test_the_device_list_and_the_doctor_are_the_worker_pythons(tmp_path):
    python = engine_venv("3.13")
    search = bh.package_search_dir(tmp_path / "search")
    env = dict(os.environ, PYTHONPATH=str(search), LEAN_IMAGE_AI_WORKER_PYTHON=python)
    env.pop("LEAN_IMAGE_AI_GPU_RUNTIME_DIR", None)
    done = bh.run_python(_BLENDER_SIDE, env=env, cwd=tmp_path, timeout=400)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    answer = got["answer"]
    # the venv's CPU onnxruntime, not the host's onnxruntime-gpu: no CUDA or TensorRT row offered
    assert "CPUExecutionProvider" in answer["runnable"]
    assert not {"CUDAExecutionProvider", "TensorrtExecutionProvider"} & set(answer["installed"])
    assert answer["onnxruntime_error"] is None and answer["python"] == python
    report = got["report"]
    assert got["ok"] and "Python: 3.13." in report, report
    assert "engine-py313" in report and "onnxruntime-ep-webgpu: cannot run: " in report, report
    assert got["onnxruntime_here"] is False  # Blender's process imported none for it


def test_another_worker_python_asks_the_device_list_again(monkeypatch):
    """The preference changed (or the variable): the menu's answer was the old Python's."""
    engine_box = bh.import_submodule("ui.engine_box")
    runtime_probe = bh.import_submodule("ui.runtime_probe")
    from recording_layout import RecordingLayout

    # the preferences' own properties exist only on the registered add-on: drawn by name here
    monkeypatch.setattr(RecordingLayout, "prop", lambda self, data, prop, **kw: self._record("prop", name=prop))
    monkeypatch.delenv("LEAN_IMAGE_AI_WORKER_PYTHON", raising=False)

    class Prefs:
        worker_python = ""

    try:
        engine_box.draw_worker_python(RecordingLayout(), Prefs())
        runtime_probe._state["answer"] = {"onnxruntime_error": None, "installed": ["CPUExecutionProvider"],
                                          "runnable": ["CPUExecutionProvider"]}  # fmt: skip
        engine_box.draw_worker_python(RecordingLayout(), Prefs())  # the same Python: kept
        assert runtime_probe._state["answer"] is not None
        Prefs.worker_python = sys.executable + "-elsewhere"
        engine_box.draw_worker_python(RecordingLayout(), Prefs())
        assert runtime_probe._state["answer"] is None
    finally:
        runtime_probe.forget()
        engine_box._seen.clear()


def test_a_changed_worker_python_restarts_an_idle_worker(monkeypatch):
    """The preference is read at each job: an idle worker under the old Python is ended, so the
    next job runs under the new one (not only after Blender restarts)."""
    from lean_image_ai.models.worker import client as worker_client

    python = engine_venv("3.13")
    monkeypatch.delenv("LEAN_IMAGE_AI_WORKER_PYTHON", raising=False)
    client = worker_client.WorkerClient()
    try:
        assert client.ensure() is True
        first = client.process
        assert client.ensure() is False  # the same Python: the warm worker is kept
        client.python = python
        assert client.ensure() is True
        assert client.process.args[0] == python and first.poll() is not None
    finally:
        client.stop()
