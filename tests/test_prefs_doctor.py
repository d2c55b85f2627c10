"""The preferences with real bpy: the doctor's report (the command line's, made in a child process
a timer polls), only devices that can run here, one GPU runtime size, and a CUDA fallback warning
that names the button providing the libraries.

This machine has onnxruntime-gpu and no NVIDIA GPU: its CUDA and TensorRT providers are listed by
onnxruntime but cannot run, which is the case these tests are about.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402
import onnx_builders as ob  # noqa: E402
from recording_layout import RecordingLayout  # noqa: E402

bpy = pytest.importorskip("bpy")
P = bh.import_submodule("ui.preferences")
R = bh.import_submodule("operators.prefs")
gpu_ops = bh.import_submodule("operators.gpu_ops")
from lean_image_ai.models.store import library  # noqa: E402
from lean_image_ai.runtime import core, installed_providers, runnable_providers  # noqa: E402
from lean_image_ai.runtime.cuda import gpu_libraries  # noqa: E402
from lean_image_ai.runtime.measure.memory import nvidia_gpu_count  # noqa: E402

NVIDIA = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


@pytest.fixture
def registered():
    with bh.registered_addon() as package:
        yield package


@pytest.fixture
def no_gpu(monkeypatch):
    """What the preferences are offered on a machine whose driver sees no NVIDIA GPU (this one)."""
    if not any(p in installed_providers() for p in NVIDIA):
        pytest.skip("this onnxruntime lists no NVIDIA provider: nothing to leave out")
    monkeypatch.setattr(P, "_offered", [])
    answer = {"onnxruntime_error": None, "installed": installed_providers(),
              "runnable": runnable_providers(gpu_count=lambda: 0)}  # what the child answers here
    monkeypatch.setitem(bh.import_submodule("ui.runtime_probe")._state, "answer", answer)
    monkeypatch.setattr(P, "_device_items", [])


def _draw_preferences(monkeypatch, **values) -> RecordingLayout:
    monkeypatch.setattr(RecordingLayout, "prop", lambda self, data, prop, **kw: self._record("prop", name=prop))
    monkeypatch.setattr(P, "draw_model_catalog", lambda layout, context: None)
    fake = R.DefaultPreferences(**values)
    fake.layout = RecordingLayout()
    P.LeanImageAIPreferences.draw(fake, bpy.context)
    return fake.layout


# ---- only what can run ---------------------------------------------------------------------------


@pytest.mark.parametrize("count, kept", [(0, ["CPUExecutionProvider"]), (1, None), (None, None)])
def test_nvidia_providers_are_runnable_only_where_the_driver_sees_a_gpu(count, kept):
    listed = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert runnable_providers(listed, gpu_count=lambda: count) == (kept or listed)  # None: unknown, let ORT try
    assert runnable_providers(["DmlExecutionProvider", "CPUExecutionProvider"], gpu_count=lambda: 0) == [
        "DmlExecutionProvider", "CPUExecutionProvider",
    ]  # fmt: skip


def test_this_machine_without_a_gpu_offers_no_cuda():
    if nvidia_gpu_count() != 0:
        pytest.skip("an NVIDIA GPU is visible here")
    assert not set(runnable_providers()) & set(NVIDIA)


def test_preferences_without_a_gpu_offer_no_cuda_anywhere(registered, no_gpu, monkeypatch):
    assert [item[0] for item in P.device_items(None, bpy.context)] == ["AUTO", "CPU"]
    layout = _draw_preferences(monkeypatch, device="AUTO")
    drawn = {c.name for c in layout.calls("prop")}
    assert "cuda_device_index" not in drawn and "cudnn_max_workspace" not in drawn
    labels = [c.text for c in layout.calls("label")]
    assert "Can run on: CPU" in labels
    assert not any(t.startswith("Memory on CUDA") for t in labels), labels
    assert any(t.startswith("Memory on CPU") for t in labels), labels
    # what onnxruntime lists but cannot run is named as such, not offered
    assert any(t.startswith("No NVIDIA GPU found, so ") and "CUDA" in t and "cannot run here" in t for t in labels)


# ---- one size ------------------------------------------------------------------------------------


def test_the_box_the_tooltip_and_the_docs_give_one_gpu_runtime_size(registered, tmp_path, monkeypatch):
    requirements = R.gpu_requirements()
    if requirements is None:
        pytest.skip("no GPU runtime for this platform")
    size = library.format_bytes(gpu_libraries.download_size(requirements))
    assert R.gpu_runtime_size_text() == size
    monkeypatch.setenv(gpu_libraries.FOLDER_ENV, str(tmp_path / "gpu_runtime"))  # not installed
    box = RecordingLayout()
    P.draw_gpu_runtime(box, bpy.context)
    assert f"({size} download;" in box.joined_text(), box.joined_text()
    # the docs give each platform's figure as the preferences compute it
    folder = bh.REPO_ROOT / "gpu_requirements"
    linux = library.format_bytes(gpu_libraries.download_size(folder / "linux-x64-cp311.txt"))
    windows = library.format_bytes(gpu_libraries.download_size(folder / "windows-x64-cp311.txt"))
    for doc in ("README.md", "docs/cuda.md"):
        text = (bh.REPO_ROOT / doc).read_text(encoding="utf-8")
        figures = set(re.findall(r"(\d+\.\d GiB) (?:on|for) (Linux|Windows)", text))
        assert figures == {(linux, "Linux"), (windows, "Windows")}, (doc, figures)


# ---- the fallback names the button ----------------------------------------------------------------


def test_a_cuda_fallback_warning_points_to_the_engines_terminal_command(registered, tmp_path, monkeypatch):
    if "CUDAExecutionProvider" not in installed_providers() or R.gpu_requirements() is None:
        pytest.skip("needs onnxruntime-gpu and a GPU runtime for this platform")
    monkeypatch.setenv(gpu_libraries.FOLDER_ENV, str(tmp_path / "gpu_runtime"))  # nothing installed
    model = ob.sr_model(tmp_path / "m.onnx", scale=2)
    runtime = core.Runtime()
    handle = runtime.session(str(model), "cuda")  # real onnxruntime-gpu: no GPU or libraries here
    try:
        warning = handle.fallback_warning
    finally:
        runtime.evict(handle, "test")
    if not warning:
        pytest.skip("CUDA really ran here")
    hinted = R.with_gpu_runtime_hint(warning)
    assert hinted.startswith(warning) and "terminal command" in hinted and "Preferences" in hinted
    assert R.with_gpu_runtime_hint("DirectML was requested for x but ...") == "DirectML was requested for x but ..."


# ---- the doctor ----------------------------------------------------------------------------------

_BLENDER_SIDE = textwrap.dedent(
    """
    import json, sys, threading, time
    import bpy
    import lean_image_ai
    lean_image_ai.register()
    from lean_image_ai.operators import gpu_ops
    before = {"onnxruntime": "onnxruntime" in sys.modules, "threads": threading.active_count()}
    result = sorted(bpy.ops.lean_image_ai.run_doctor())
    busy = sorted(bpy.ops.lean_image_ai.run_doctor()) if gpu_ops.doctor_running() else None
    registered = bpy.app.timers.is_registered(gpu_ops.poll_doctor)
    deadline = time.monotonic() + 240
    while gpu_ops.poll_doctor() is not None and time.monotonic() < deadline:  # what the timer does
        time.sleep(0.1)
    run = gpu_ops.doctor["run"]
    after = {"onnxruntime": "onnxruntime" in sys.modules, "threads": threading.active_count()}
    text = bpy.data.texts[gpu_ops.DOCTOR_TEXT].as_string() if gpu_ops.DOCTOR_TEXT in bpy.data.texts else None
    lean_image_ai.unregister()
    print("RESULT " + json.dumps(dict(result=result, busy=busy, timer=registered, report=run.text, ok=run.ok,
                                      before=before, after=after, text_block=text,
                                      timer_after=bpy.app.timers.is_registered(gpu_ops.poll_doctor))))
    """
)


def _labels(report: str) -> list[str]:
    """Each line's label (what it is about), not its figures."""
    return [line.split(":")[0].strip() for line in report.splitlines() if line.strip()]


def test_the_doctor_button_shows_the_command_lines_report(tmp_path):
    search = bh.package_search_dir(tmp_path / "search")
    env = dict(os.environ, PYTHONPATH=str(search))
    env.pop("LEAN_IMAGE_AI_GPU_RUNTIME_DIR", None)
    done = bh.run_python(_BLENDER_SIDE, env=env, cwd=tmp_path, timeout=300)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    assert got["result"] == ["FINISHED"] and got["timer"] is True
    assert got["busy"] in (None, ["CANCELLED"])  # one run at a time
    # Blender's process imported no onnxruntime for it and started no thread
    assert got["before"]["onnxruntime"] is False and got["after"]["onnxruntime"] is False
    assert got["after"]["threads"] == got["before"]["threads"]
    cli = subprocess.run(
        [sys.executable, "-m", "lean_image_ai", "doctor"], capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=300,
    )  # fmt: skip
    assert got["report"].strip() and _labels(got["report"]) == _labels(cli.stdout), (got["report"], cli.stdout)
    assert got["ok"] is (cli.returncode == 0)
    assert got["text_block"].strip() == got["report"].strip()  # kept in the Text Editor too
    assert got["timer_after"] is False  # unregister leaves no timer Blender would hold


def test_the_preferences_draw_the_doctors_report(registered, monkeypatch):
    class Done:
        running = False
        ok = True
        text = "Python: 3.x\nonnxruntime: onnxruntime-gpu 1.31.1 from /somewhere\nProviders offered: CPUExecutionProvider"

    monkeypatch.setitem(gpu_ops.doctor, "run", Done())
    layout = RecordingLayout()
    P.draw_doctor(layout)
    text = layout.joined_text()
    assert "Providers offered: CPUExecutionProvider" in text and "onnxruntime-gpu 1.31.1 from /somewhere" in text
    assert layout.operators("lean_image_ai.run_doctor")
