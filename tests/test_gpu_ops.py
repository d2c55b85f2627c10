"""operators/gpu_ops.py and the preferences' GPU runtime box with real bpy and the real pip.

pip is configured the way a user would, through the PIP_* environment variables pip itself reads
(PIP_NO_INDEX, PIP_FIND_LINKS: a local folder of tiny real wheels laid out like NVIDIA's), and the
install folder by LEAN_IMAGE_AI_GPU_RUNTIME_DIR; no network. The box is drawn with the recording
stand-in layout (tests/recording_layout.py): background Blender has no UI regions.
"""

from __future__ import annotations

import sys
import threading
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
from lean_image_ai.runtime.cuda import gpu_install as GI  # noqa: E402
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


def test_install_through_the_operator_then_remove(setup):
    folder, req = setup["folder"], setup["req"]
    assert R.gpu_runtime_folder() == folder
    before = _box()
    assert "Not installed" in before.joined_text()
    shipped = R.gpu_requirements()  # this checkout's file for this platform and Python
    assert shipped is not None and shipped.name.startswith(G.platform_name())
    assert library_size_text(shipped) in before.joined_text()  # the download size, before installing
    assert before.operators("lean_image_ai.install_gpu_runtime")
    assert not before.operators("lean_image_ai.remove_gpu_runtime")

    assert bpy.ops.lean_image_ai.install_gpu_runtime(requirements=str(req)) == {"FINISHED"}
    assert (folder / "nvidia/cu13/lib/libfake.so.13").read_bytes() == b"cudart" * 100
    assert sorted(p.name for p in folder.parent.iterdir()) == ["gpu_runtime"]  # no staging left
    assert L.active() is None  # loaded by the process that runs the models, not into Blender's on install
    after = _box()
    assert "Installed: CUDA 13.5.37, cuDNN 9.28.1.4" in after.joined_text()
    assert after.operators("lean_image_ai.remove_gpu_runtime")
    # installed from another file than the shipped one: offered as an update
    assert [c.text for c in after.operators("lean_image_ai.install_gpu_runtime")] == ["Update"]

    assert bpy.ops.lean_image_ai.remove_gpu_runtime() == {"FINISHED"}
    assert not folder.exists()
    assert bpy.ops.lean_image_ai.remove_gpu_runtime() == {"CANCELLED"}  # nothing left to remove


def library_size_text(requirements: Path) -> str:
    from lean_image_ai.models.store import library

    return library.format_bytes(G.download_size(requirements))


def test_wrong_hash_is_refused_through_the_operator(setup):
    bad = write_requirements(setup["tmp"] / "bad.txt", setup["wheels"], digests={"nvidia-cudnn-cu13": "ef" * 32})
    with pytest.raises(RuntimeError, match="checksum"):
        bpy.ops.lean_image_ai.install_gpu_runtime(requirements=str(bad))
    assert not setup["folder"].exists()
    assert list(setup["folder"].parent.iterdir()) == []
    box = _box()
    assert any(c.alert and "checksum" in c.text for c in box.calls("label"))  # the last failure stays visible


def test_a_folder_the_add_on_did_not_make_is_neither_replaced_nor_removed(setup):
    folder = setup["folder"]
    folder.mkdir(parents=True)
    (folder / "shared.blend").write_bytes(b"a studio's file")
    with pytest.raises(RuntimeError, match="not made by this add-on") as info:
        bpy.ops.lean_image_ai.install_gpu_runtime(requirements=str(setup["req"]))
    assert str(folder) in str(info.value)
    with pytest.raises(RuntimeError, match="not made by this add-on") as info:
        bpy.ops.lean_image_ai.remove_gpu_runtime()
    assert str(folder) in str(info.value)
    assert [p.name for p in folder.iterdir()] == ["shared.blend"]
    assert (folder / "shared.blend").read_bytes() == b"a studio's file"


def test_install_refused_offline(setup):
    bpy.context.preferences.system.use_online_access = False
    with pytest.raises(RuntimeError, match="Online access is disabled"):
        bpy.ops.lean_image_ai.install_gpu_runtime(requirements=str(setup["req"]))
    assert not setup["folder"].exists()


def test_progress_bar_and_cancel_while_pip_runs(setup):
    """The install's own cancel (what the child process of the operator runs, on the download
    lane's job): the box draws its progress, and its Cancel button (an operator) stops pip; nothing
    is left. The test holds pip's output on a thread of its own, not the add-on's."""
    job = jobs.downloads.begin("Install GPU runtime", GO.JOB_KEY)
    started = threading.Event()

    def progress(fraction, stage):
        job.report(fraction, stage)
        if stage.startswith("downloading"):
            started.set()
            job.cancel_event.wait(10)  # hold pip's output here until the test has clicked Cancel

    def work(job):
        return GI.install(setup["folder"], setup["req"], progress=progress, cancel=job.cancel_event.is_set)

    thread = threading.Thread(target=jobs.run_job, args=(job, work))
    thread.start()
    try:
        assert started.wait(60)
        box = _box()
        (bar,) = box.calls("progress")
        assert bar.text.startswith("downloading nvidia-cuda-runtime")
        assert box.operators("lean_image_ai.cancel_download")
        assert not box.operators("lean_image_ai.install_gpu_runtime")
        with pytest.raises(RuntimeError, match="still running"):  # one download at a time
            bpy.ops.lean_image_ai.install_gpu_runtime(requirements=str(setup["req"]))
        with pytest.raises(RuntimeError, match="cancel that first"):
            bpy.ops.lean_image_ai.remove_gpu_runtime()
        assert bpy.ops.lean_image_ai.cancel_download() == {"FINISHED"}
    finally:
        thread.join(30)
        jobs.downloads.end(job)
    assert job.state == "cancelled"
    assert list(setup["folder"].parent.iterdir()) == []


def test_only_the_model_worker_activates_an_installed_folder(setup, registered):
    """Blender's process never loads the GPU runtime (not at register, not before a job): the
    model worker is started with it (models/worker/__main__.py activates it before onnxruntime)."""
    assert bpy.ops.lean_image_ai.install_gpu_runtime(requirements=str(setup["req"])) == {"FINISHED"}
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
