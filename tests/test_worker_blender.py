"""Blender's process with the model worker (bpy 5.0.1, a fresh process): Upscale and Process
Sequence run through the worker, and while they run the add-on starts no Python thread and
onnxruntime is never imported in Blender's process (Blender does not support Python threads:
its "Gotchas: threading" page)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402
from builders_upscale import compact_model  # noqa: E402

pytest.importorskip("bpy")

SCRIPT = r"""
import json, os, sys, threading

started = []
real_start = threading.Thread.start


def recording_start(self, *args, **kwargs):  # every thread any code starts in this process
    target = getattr(self, "_target", None)
    started.append({"name": self.name, "module": getattr(target, "__module__", None) or ""})
    return real_start(self, *args, **kwargs)


import bpy
import lean_image_ai

lean_image_ai.register()
before = len(started)
threading.Thread.start = recording_start
try:
    upscale = bpy.ops.lean_image_ai.upscale(filepath=SOURCE, model_path=MODEL)
    sequence = bpy.ops.lean_image_ai.process_sequence(family="upscale", source=FRAMES, output=OUTPUT, model_path=MODEL)
finally:
    threading.Thread.start = real_start
from lean_image_ai.models.worker import client
worker = client.shared()
result = {
    "upscale": sorted(upscale), "sequence": sorted(sequence), "threads": started,
    "onnxruntime": sorted(m for m in sys.modules if m.split(".")[0] == "onnxruntime"),
    "worker_pid": worker.pid, "blender_pid": os.getpid(), "spawns": worker.spawns,
    "image": list(bpy.data.images["photo_x4"].size),
}
lean_image_ai.unregister()
result["worker_after_unregister"] = worker.running
print("RESULT " + json.dumps(result))
"""


def test_upscale_and_process_sequence_run_in_the_worker_with_no_thread_and_no_onnxruntime_here(tmp_path):
    from PIL import Image

    model = compact_model(tmp_path / "x4.onnx", num_conv=4, feat=8)
    frames = tmp_path / "frames"
    frames.mkdir()
    rng = np.random.default_rng(0)
    for n in (1, 2, 3):
        Image.fromarray((rng.random((24, 32, 3)) * 255).astype(np.uint8)).save(frames / f"f_{n:04d}.png")
    source = tmp_path / "photo.png"
    Image.fromarray((rng.random((20, 28, 3)) * 255).astype(np.uint8)).save(source)
    names = dict(SOURCE=str(source), MODEL=str(model), FRAMES=str(frames), OUTPUT=str(tmp_path / "out") + "/")
    code = "".join(f"{k} = {v!r}\n" for k, v in names.items()) + SCRIPT
    env = bh.isolated_blender_env(tmp_path / "env", pythonpath=[bh.package_search_dir(tmp_path / "pp")])
    done = bh.run_python(code, env=env, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])

    assert result["upscale"] == ["FINISHED"] and result["sequence"] == ["FINISHED"]
    assert result["image"] == [28 * 4, 20 * 4]
    assert len(list((tmp_path / "out").iterdir())) == 3
    assert result["threads"] == [], "the add-on started a Python thread in Blender's process"
    assert result["onnxruntime"] == [], "onnxruntime was imported in Blender's process"
    assert result["worker_pid"] not in (None, result["blender_pid"]) and result["spawns"] == 1  # one warm worker
    assert result["worker_after_unregister"] is False


def test_the_memory_buttons_reach_the_worker_and_free_now_ends_it(tmp_path):
    """Unload All empties the worker's session cache; Free Memory Now ends the worker and says
    what came back (its RSS just before it ended)."""
    from PIL import Image

    bpy = pytest.importorskip("bpy")
    memory_ops = bh.import_submodule("operators.memory_ops")
    from lean_image_ai.models.worker import client as worker_client

    model = compact_model(tmp_path / "x4.onnx", num_conv=4, feat=8)
    source = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(0).random((20, 28, 3)) * 255).astype(np.uint8)).save(source)
    with bh.registered_addon():
        worker = worker_client.shared()
        worker.free_now()  # an earlier test's warm worker holds its models: start from none
        assert bpy.ops.lean_image_ai.upscale(filepath=str(source), model_path=str(model)) == {"FINISHED"}
        assert worker.running and worker.status["models"] == [model.name]
        assert bpy.ops.lean_image_ai.unload_all() == {"FINISHED"}
        assert worker.running and worker.status["models"] == []
        freed = worker.free_now()
        assert freed["was_running"] and freed["rss_bytes"] > 0 and not worker.running
        assert "MiB RAM came back" in memory_ops.freed_text(freed)
        assert bpy.ops.lean_image_ai.free_memory_now() == {"FINISHED"}  # nothing running: says so
        assert "not running" in memory_ops.freed_text(worker.free_now())
