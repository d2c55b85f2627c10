"""Every operator of the add-on in one bpy process of its own, with every Python thread started
recorded and onnxruntime looked for in ``sys.modules`` after each (issue #30 item 2; the test is
tests/test_blender_threads.py).

    python thread_watch_job.py CONFIG.json   writes CONFIG's "out" (one record per case, in order)

``threading.Thread.start`` is wrapped before anything else is imported, so a thread of any module
(``threading.Timer``, a ThreadPoolExecutor's worker and a ``queue`` reader included) is seen. The
loopback model server and the fake pip index live in the test's process, not here. The cases run
in the order of CONFIG's "cases": ones that import onnxruntime (model jobs) come last, as a
module once imported stays in ``sys.modules``.
"""

import json
import sys
import threading
import time
import traceback
from pathlib import Path

STARTED: list[str] = []
_start = threading.Thread.start


def _recording_start(self, *args, **kwargs):
    STARTED.append(f"{self.name} ({type(self).__module__}.{type(self).__qualname__})")
    return _start(self, *args, **kwargs)


threading.Thread.start = _recording_start

import bpy  # noqa: E402

CONFIG = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
sys.path.insert(0, CONFIG["tests"])

import lean_image_ai  # noqa: E402
from recording_layout import RecordingLayout  # noqa: E402

OPS = None  # bpy.ops.lean_image_ai once registered


def _ok(result) -> None:
    assert result == {"FINISHED"}, result


def register():
    global OPS
    bpy.context.preferences.system.use_online_access = True  # bpy as a module starts offline
    lean_image_ai.register()
    OPS = bpy.ops.lean_image_ai


def preferences():
    from lean_image_ai.operators import prefs
    from lean_image_ai.ui import panels, preferences

    RecordingLayout.prop = lambda self, data, prop, **kw: self._record("prop", name=prop)
    fake = prefs.DefaultPreferences()
    fake.layout = RecordingLayout()
    preferences.LeanImageAIPreferences.draw(fake, bpy.context)  # the device menu, "Can run on", the model list
    assert "Can run on" in fake.layout.joined_text(), fake.layout.joined_text()
    assert [item[0] for item in preferences.device_items()][:2] == ["AUTO", "CPU"]
    panels.draw_main(RecordingLayout(), bpy.context)  # the N-panel's import check


def install_model():
    _ok(OPS.install_model(model_id=CONFIG["model_id"]))
    assert Path(CONFIG["models_dir"], CONFIG["model_file"]).is_file()


def remove_model():
    _ok(OPS.remove_model(model_id=CONFIG["model_id"]))


def register_user_model():
    _ok(OPS.register_user_model(family="ben2", filepath=CONFIG["user_model"]))


def remove_user_model():
    from lean_image_ai.models.store import library

    (entry,) = library.catalog(Path(CONFIG["models_dir"])).user_entries()
    _ok(OPS.remove_model(model_id=entry.id))


def install_gpu_runtime():
    """The engine installed the user's way (the box's command, run by a shell: pip in processes of
    its own), then the box's Copy button."""
    import subprocess

    from lean_image_ai.operators import gpu_ops

    command = f"{gpu_ops.install_command()} --requirements {CONFIG['gpu_requirements']}"
    assert subprocess.run(command, shell=True).returncode == 0, command
    _ok(OPS.copy_engine_command())


def remove_gpu_runtime():
    _ok(OPS.remove_gpu_runtime())


def run_doctor():
    from lean_image_ai.operators import gpu_ops

    _ok(OPS.run_doctor())
    deadline = time.monotonic() + 120
    while gpu_ops.poll_doctor() is not None:  # what its bpy.app.timers timer does (none run in background)
        assert time.monotonic() < deadline, "the doctor did not answer"
        time.sleep(0.1)
    assert "onnxruntime" in bpy.data.texts[gpu_ops.DOCTOR_TEXT].as_string()


def cancel_buttons():
    assert not OPS.cancel_download.poll()  # nothing is downloading
    assert OPS.cancel_job() == {"CANCELLED"}  # nothing is running


def _image_file(name: str) -> str:
    return str(Path(CONFIG["images"], name))


def upscale():
    _ok(OPS.upscale(filepath=_image_file("photo.png")))


def remove_background():
    _ok(OPS.remove_background(filepath=_image_file("photo.png"), model_path=CONFIG["models"]["ben2"]))


def estimate_depth():
    _ok(OPS.estimate_depth(filepath=_image_file("photo.png"), model_path=CONFIG["models"]["da3"]))


def reconstruct_geometry():
    _ok(OPS.reconstruct_geometry(filepath=_image_file("photo.png"), model_path=CONFIG["models"]["moge2"]))


def process_sequence():
    _ok(OPS.process_sequence(family="upscale", source=CONFIG["frames"], output=CONFIG["sequence_out"]))


def reconstruct_shot():
    _ok(OPS.reconstruct_shot(source=CONFIG["frames"], model_path=CONFIG["models"]["moge2"], shot_camera="shot"))


def release_memory():
    _ok(OPS.release_memory())


def unload_all():
    _ok(OPS.unload_all())


def leak_check():
    _ok(OPS.leak_check(runs=CONFIG["leak_runs"]))


def show_memory_plot():
    _ok(OPS.show_memory_plot())


def unregister():
    lean_image_ai.unregister()


def _package_modules() -> dict[str, str]:
    """The add-on's modules loaded so far in this process, each with its source file."""
    prefix = lean_image_ai.__name__
    return {
        name: getattr(module, "__file__", None) or ""
        for name, module in sorted(sys.modules.items())
        if module is not None and (name == prefix or name.startswith(prefix + "."))
    }


def main() -> None:
    records = []
    for name in CONFIG["cases"]:
        mark = len(STARTED)
        error = None
        try:
            globals()[name]()
        except Exception as exc:  # noqa: BLE001 - the test shows it with the case
            error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        records.append({
            "case": name,
            "threads": STARTED[mark:],
            "onnxruntime": "onnxruntime" in sys.modules,
            "modules": _package_modules(),
            "error": error,
        })  # fmt: skip
        Path(CONFIG["out"]).write_text(json.dumps(records, indent=1), encoding="utf-8")


main()
