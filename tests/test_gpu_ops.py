"""operators/gpu_ops.py and the preferences' GPU engine box with real bpy; the engine is installed
the way the user does it, by the box's command run in a terminal (real pip, in a subprocess).

pip is configured the way a user would, through the PIP_* environment variables pip itself reads
(PIP_NO_INDEX, PIP_FIND_LINKS: a local folder of tiny real wheels laid out like NVIDIA's), and the
install folder by LEAN_IMAGE_AI_GPU_RUNTIME_DIR; no network. The box is drawn with the recording
stand-in layout (tests/recording_layout.py): background Blender has no UI regions.
"""

from __future__ import annotations

import ast
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402
from fake_wheels import build_wheel, write_requirements  # noqa: E402
from recording_layout import RecordingLayout  # noqa: E402

bpy = pytest.importorskip("bpy")
GO = bh.import_submodule("operators.gpu_ops")
R = bh.import_submodule("operators.prefs")
P = bh.import_submodule("ui.preferences")
jobs = bh.import_submodule("operators.jobs")
from lean_image_ai.runtime.cuda import gpu_libraries as G  # noqa: E402
from lean_image_ai.runtime.cuda import gpu_loading as L  # noqa: E402


@pytest.fixture
def registered():
    with bh.registered_addon() as package:
        yield package


@pytest.fixture
def setup(tmp_path, monkeypatch, registered):
    index = tmp_path / "index"
    wheels = [
        build_wheel(index, "nvidia-cuda-runtime", "13.5.37", {"nvidia/cu13/lib/libfake.so.13": b"cudart" * 100}),
        build_wheel(index, "nvidia-cudnn-cu13", "9.28.1.4", {"nvidia/cudnn/lib/libfakednn.so.9": b"dnn" * 100}),
    ]
    folder = tmp_path / "user" / "gpu_runtime"
    monkeypatch.setenv(G.FOLDER_ENV, str(folder))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setattr(L, "_active", None)
    system = bpy.context.preferences.system
    online = system.use_online_access
    system.use_online_access = True  # bpy as a module starts offline, like `blender --offline-mode`
    jobs.downloads.current = jobs.downloads.last = None
    yield {"folder": folder, "wheels": wheels, "req": write_requirements(tmp_path / "req.txt", wheels), "tmp": tmp_path}
    system.use_online_access = online
    jobs.downloads.cancel_all()


def _box(context=None) -> RecordingLayout:
    layout = RecordingLayout()
    P.draw_gpu_runtime(layout, context or bpy.context)
    return layout


def _run_in_terminal(command: str) -> subprocess.CompletedProcess:
    """What the user does with the box's command: a shell runs it (this test's PIP_* and folder)."""
    return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300)


def _install_with(setup, requirements: Path) -> subprocess.CompletedProcess:
    command = GO.install_command() + f" --requirements {requirements}"
    return _run_in_terminal(command)


def test_the_box_shows_the_command_for_this_machine_and_copies_it(setup):
    folder = setup["folder"]
    assert R.gpu_runtime_folder() == folder
    box = _box()
    text = box.joined_text()
    assert "Not installed" in text
    shipped = R.gpu_requirements()  # this checkout's file for this platform and Python
    assert shipped is not None and shipped.name.startswith(G.platform_name())
    assert f"{library_size_text(shipped)} download" in text  # the download size, before installing
    command = GO.install_command()
    # Blender's Python, the add-on folder, the folder the add-on loads the engine from
    assert command.startswith(f"{sys.executable} ") and f"gpu install --target {folder}" in command
    assert command.replace(" ", "") in text.replace(" ", "")  # wrapped over labels, whole
    assert box.operators("lean_image_ai.copy_engine_command")
    assert not box.operators("lean_image_ai.remove_gpu_runtime")
    assert bpy.ops.lean_image_ai.copy_engine_command() == {"FINISHED"}
    # background Blender has no system clipboard (it reads back ""): the operator's own execute is
    # given a window manager that keeps what it is handed, as Blender's would
    from types import SimpleNamespace

    context = SimpleNamespace(window_manager=SimpleNamespace(clipboard=""))
    reports = []
    operator = SimpleNamespace(report=lambda kind, text: reports.append(text))
    assert GO.LEAN_IMAGE_AI_OT_copy_engine_command.execute(operator, context) == {"FINISHED"}
    assert context.window_manager.clipboard == command


def test_installed_from_a_terminal_the_box_sees_it_without_a_restart_then_remove(setup):
    folder = setup["folder"]
    probe = bh.import_submodule("ui.runtime_probe")
    assert "Not installed" in _box().joined_text()
    assert probe._engine_args() == []
    # the device list as the child answered it before the install (CPU only)
    probe._state["answer"] = {"onnxruntime_error": None, "installed": ["CPUExecutionProvider"], "runnable": ["CPUExecutionProvider"]}
    done = _install_with(setup, setup["req"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert (folder / "nvidia/cu13/lib/libfake.so.13").read_bytes() == b"cudart" * 100
    assert sorted(p.name for p in folder.parent.iterdir()) == ["gpu_runtime"]  # no staging left
    assert L.active() is None  # loaded by the process that runs the models, never Blender's
    after = _box()  # the next redraw, same Blender session
    assert "Installed: CUDA 13.5.37, cuDNN 9.28.1.4" in after.joined_text()
    # the device list is asked again, by a child that loads the engine first as the worker does
    assert probe._state["answer"] is None
    assert probe._engine_args() == ["--gpu-runtime", str(folder)]
    assert after.operators("lean_image_ai.remove_gpu_runtime")
    # installed from another file than the shipped one: the box gives the command that updates it
    assert after.operators("lean_image_ai.copy_engine_command")

    assert bpy.ops.lean_image_ai.remove_gpu_runtime() == {"FINISHED"}
    assert not folder.exists()
    assert bpy.ops.lean_image_ai.remove_gpu_runtime() == {"CANCELLED"}  # nothing left to remove


def library_size_text(requirements: Path) -> str:
    from lean_image_ai.models.store import library

    return library.format_bytes(G.download_size(requirements))


def test_a_wrong_hash_is_refused_by_the_terminal_command_and_nothing_is_left(setup):
    bad = write_requirements(setup["tmp"] / "bad.txt", setup["wheels"], digests={"nvidia-cudnn-cu13": "ef" * 32})
    done = _install_with(setup, bad)
    assert done.returncode != 0 and "checksum" in done.stdout + done.stderr
    assert not setup["folder"].exists()
    assert list(setup["folder"].parent.iterdir()) == []


def test_a_folder_the_add_on_did_not_make_is_neither_replaced_nor_removed(setup):
    folder = setup["folder"]
    folder.mkdir(parents=True)
    (folder / "shared.blend").write_bytes(b"a studio's file")
    done = _install_with(setup, setup["req"])
    assert done.returncode != 0 and "not made by this add-on" in done.stdout + done.stderr
    with pytest.raises(RuntimeError, match="not made by this add-on") as info:
        bpy.ops.lean_image_ai.remove_gpu_runtime()
    assert str(folder) in str(info.value)
    assert [p.name for p in folder.iterdir()] == ["shared.blend"]
    assert (folder / "shared.blend").read_bytes() == b"a studio's file"


# ---- the add-on never runs pip (extensions.blender.org: "Be Self Contained") ---------------------------

GPU_INSTALL_WORDS = ({"gpu", "install"}, {"gpu-runtime", "install"})  # the terminal command's own words


def _starts_pip(argv) -> bool:
    words = [os.path.basename(str(w)) for w in (argv if isinstance(argv, (list, tuple)) else str(argv).split())]
    return "pip" in words or any(pair <= set(words) for pair in GPU_INSTALL_WORDS) or any(
        w.startswith("pip") and w[3:].replace(".", "").isdigit() for w in words
    )


def test_no_operator_of_the_add_on_starts_pip_or_changes_sys_path(setup, monkeypatch):
    """Every operator of the package, run with every way of starting a program recorded (and
    refused, so nothing really starts): none runs pip, directly or through the terminal command."""
    started: list = []

    def refuse(argv, *args, **kwargs):
        started.append(argv)
        raise OSError("recorded by the test")

    monkeypatch.setattr(subprocess, "Popen", lambda argv, *a, **k: refuse(argv))
    for name in ("system", "execv", "execve", "execvp", "execvpe", "execl", "execlp", "spawnv", "spawnve", "posix_spawn"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, lambda path, *args, **kwargs: refuse([path, *(args[0] if args and isinstance(args[0], (list, tuple)) else args)]))
    monkeypatch.setattr(runpy, "run_module", lambda name, *a, **k: refuse([name]))
    monkeypatch.setattr(runpy, "run_path", lambda path, *a, **k: refuse([path]))
    path_before = list(sys.path)
    names = sorted(n for n in dir(bpy.ops.lean_image_ai) if not n.startswith("_"))
    assert "copy_engine_command" in names and len(names) > 10
    for name in names:
        try:
            getattr(bpy.ops.lean_image_ai, name)()
        except (RuntimeError, TypeError, OSError):
            pass  # refused without inputs, or a start we refused: what was started is recorded
        started_pip = [argv for argv in started if _starts_pip(argv)]
        assert not started_pip, (name, started_pip)
    assert sys.path == path_before  # Blender's own search path is never changed (the engine loads in the worker)


def _code_words(path: Path) -> list[str]:
    """The names and string constants of a module's code (docstrings left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
        and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words += node.value.replace("-", " ").split()
        elif isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, ast.alias):
            words += node.name.split(".")
    return words


def test_no_operator_or_panel_source_names_pip():
    """operators/ and ui/ (the command line, ui/cli/, is the user's own program) never name pip."""
    found = {}
    for folder in ("operators", "ui"):
        for path in sorted((bh.REPO_ROOT / folder).rglob("*.py")):
            if "cli" in path.relative_to(bh.REPO_ROOT).parts:
                continue
            hits = [w for w in _code_words(path) if w.strip("'\"(),:;.").lower() in ("pip", "pip3", "ensurepip")]
            if hits:
                found[str(path.relative_to(bh.REPO_ROOT))] = hits
    assert not found


def test_only_the_model_worker_activates_an_installed_folder(setup, registered):
    """Blender's process never loads the GPU runtime (not at register, not before a job): the
    model worker is started with it (models/worker/__main__.py activates it before onnxruntime)."""
    done = _install_with(setup, setup["req"])
    assert done.returncode == 0, done.stderr
    L._active = None
    registered.unregister()
    registered.register()  # what enabling the add-on at Blender's start does
    assert L.active() is None  # register loads nothing (and imports no onnxruntime for it)
    R.configure_runtime(bpy.context)  # what a model job does before it starts
    assert L.active() is None  # still nothing in Blender's process
    model_job = bh.import_submodule("operators.model_job")
    worker = model_job.model_worker()
    argv = worker._argv()
    assert argv[argv.index("--gpu-runtime") + 1] == str(setup["folder"])


def test_providers_line_becomes_the_import_error_with_what_to_do(registered, monkeypatch):
    text = (
        "onnxruntime cannot be imported (ImportError: libfoo) by Python 3.11; install the Lean Image AI"
        " zip built for this platform and Blender version"
    )
    probe = bh.import_submodule("ui.runtime_probe")
    monkeypatch.setitem(probe._state, "answer", {"onnxruntime_error": text, "installed": [], "runnable": []})
    # DefaultPreferences has no RNA to check property names against: record them as given
    monkeypatch.setattr(RecordingLayout, "prop", lambda self, data, prop, **kw: self._record("prop", name=prop))
    fake = R.DefaultPreferences()
    fake.layout = RecordingLayout()
    monkeypatch.setattr(P, "draw_model_catalog", lambda layout, context: None)
    monkeypatch.setattr(P, "draw_doctor", lambda layout: None)  # its heading names onnxruntime too
    P.LeanImageAIPreferences.draw(fake, bpy.context)
    labels = fake.layout.calls("label")
    assert not any(c.text.startswith("Can run on") for c in labels)
    assert all(c.alert for c in labels if "onnxruntime" in c.text or "zip built" in c.text)
    assert text in fake.layout.joined_text()


def test_the_worker_python_from_the_environment_runs_the_worker_and_a_bad_one_is_refused(registered, monkeypatch,
                                                                                        tmp_path):
    """Headless render nodes: LEAN_IMAGE_AI_WORKER_PYTHON names the engine's Python; a model job
    checks it before the worker starts and refuses one that cannot run it, in one line."""
    from engine_pythons import engine_venv, pyenv_python
    from lean_image_ai.models.worker.engine_python import ENV_VAR, EnginePythonError

    model_job = bh.import_submodule("operators.model_job")
    good = engine_venv("3.13")
    engine = tmp_path / "gpu_runtime"
    engine.mkdir()  # an engine folder for Blender's Python: not for another Python's worker
    monkeypatch.setenv(G.FOLDER_ENV, str(engine))
    assert "--gpu-runtime" in model_job.model_worker()._argv()
    monkeypatch.setenv(ENV_VAR, good)
    try:
        argv = model_job.model_worker()._argv()
        assert argv[0] == good and "--gpu-runtime" not in argv
        monkeypatch.setenv(ENV_VAR, pyenv_python("3.10"))
        with pytest.raises(EnginePythonError, match=r"is Python 3\.10\.\d+; the worker needs Python 3\.11"):
            model_job.model_worker()
        assert "is Python 3.10" in GO.worker_python_check["text"]  # what the preferences show
    finally:
        monkeypatch.delenv(ENV_VAR)
        monkeypatch.delenv(G.FOLDER_ENV)
        assert model_job.model_worker()._argv()[0] == sys.executable  # the shared client as it was
