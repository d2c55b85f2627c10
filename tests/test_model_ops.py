"""operators/model_ops.py and the preferences' model list with real bpy, a real loopback HTTP
server (127.0.0.1) and real tiny ONNX models: install, cancel/resume, 404, remove, register
your own ONNX (persisted to user_models.json), clear sessions. Install and register run in a real
child process (runtime/child_process.py), which sees the test's catalog through
tests/child_catalog.py.

The model list is drawn with the recording stand-in layout (tests/recording_layout.py):
background Blender has no UI regions, so no real UILayout exists.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402
import onnx_builders as ob  # noqa: E402
from child_catalog import ChildCatalog  # noqa: E402
from model_server import loopback_entry  # noqa: E402
from recording_layout import RecordingLayout  # noqa: E402

bpy = pytest.importorskip("bpy")
M = bh.import_submodule("operators.model_ops")
P = bh.import_submodule("ui.preferences")
S = bh.import_submodule("ui.settings")
jobs = bh.import_submodule("operators.jobs")
from lean_image_ai.models.store import installer, library  # noqa: E402
from lean_image_ai.models.store.catalog import Catalog, CatalogEntry  # noqa: E402
from lean_image_ai.models.worker.remote_batch import IN_PROCESS_ENV  # noqa: E402
from lean_image_ai.runtime import get_runtime  # noqa: E402

CHUNK = 16 * 1024


# -- a loopback server (same idea as tests/test_installer.py) ------------------------------------


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture
def registered():
    with bh.registered_addon() as package:
        yield package


@pytest.fixture
def models_dir(tmp_path, monkeypatch, registered):
    path = tmp_path / "models"
    monkeypatch.setenv(library.MODELS_DIR_ENV, str(path))
    system = bpy.context.preferences.system
    online = system.use_online_access
    system.use_online_access = True  # bpy as a module starts offline, like `blender --offline-mode`
    M.downloads.current = M.downloads.last = None
    yield path
    system.use_online_access = online
    M.downloads.cancel_all()
    M.downloads.current = M.downloads.last = None


def tiny_onnx(path: Path) -> Path:
    return ob.sr_model(path, scale=2, mid_channels=2)


def entry_for(url: str | None, data: bytes | None, **overrides) -> CatalogEntry:
    fields = dict(id="test-sr", title="Test SR x2", filename="test-sr.onnx", settings={}, notes="")
    return loopback_entry(url, data, **{**fields, **overrides})


@pytest.fixture
def catalog(monkeypatch, tmp_path):
    """Inject a test catalog everywhere the add-on asks for one, the child processes included
    (small chunks there: a cancel lands mid-download)."""
    cat = Catalog(builtin=[])
    monkeypatch.setattr(library, "catalog", lambda folder: cat)
    cat.child = ChildCatalog(tmp_path / "child_site", monkeypatch, CHUNK)
    return cat


def use_entries(catalog_, *entries) -> Catalog:
    for entry in entries:
        catalog_._builtin[entry.id] = entry
    catalog_.child.write(catalog_._builtin.values())
    return catalog_


# -- install / remove -------------------------------------------------------------------------------


def test_install_downloads_verifies_and_remove_deletes(server, models_dir, catalog, tmp_path, monkeypatch):
    data = tiny_onnx(tmp_path / "src.onnx").read_bytes()
    server.files["/sr.onnx"] = data
    entry = entry_for(server.url("/sr.onnx"), data)
    use_entries(catalog, entry)
    assert library.status(entry, models_dir) == library.MISSING

    assert bpy.ops.lean_image_ai.install_model(model_id="test-sr") == {"FINISHED"}
    dest = models_dir / "test-sr.onnx"
    assert dest.read_bytes() == data
    assert library.status(entry, models_dir) == library.INSTALLED  # sha256 recorded in the sidecar
    assert M.downloads.current is None and M.downloads.last.state == "finished"
    assert M.downloads.last.progress == 1.0 and library.format_bytes(len(data)) in M.downloads.last.stage
    # the panel's upscale menu now offers it first
    assert [i[0] for i in S.compute_model_items("upscale")] == ["test-sr", S.EMBEDDED_ID]

    # a cached session of the file goes with it (one of this process's: jobs run here, LEAN_IMAGE_AI_IN_PROCESS;
    # the worker is asked to unload its own)
    monkeypatch.setenv(IN_PROCESS_ENV, "1")
    handle = get_runtime().session(dest, "cpu")
    assert bpy.ops.lean_image_ai.remove_model(model_id="test-sr") == {"FINISHED"}
    assert not dest.exists() and not installer.sidecar_path(entry, models_dir).exists()
    assert handle.evicted
    assert library.status(entry, models_dir) == library.MISSING
    assert bpy.ops.lean_image_ai.remove_model(model_id="test-sr") == {"CANCELLED"}  # nothing left


def test_a_model_without_catalog_checksum_is_shown_as_trust_on_first_use(server, models_dir, catalog, tmp_path):
    data = tiny_onnx(tmp_path / "src.onnx").read_bytes()
    server.files["/sr.onnx"] = data
    entry = entry_for(server.url("/sr.onnx"), None)  # no size, no sha256: like DA3's entry
    use_entries(catalog, entry)
    layout = RecordingLayout()
    P.draw_model_catalog(layout, bpy.context)
    assert "trust on first use" not in layout.joined_text()  # nothing installed yet
    assert bpy.ops.lean_image_ai.install_model(model_id="test-sr") == {"FINISHED"}
    layout = RecordingLayout()
    P.draw_model_catalog(layout, bpy.context)
    digest = installer.sha256_file(models_dir / "test-sr.onnx")
    text = layout.joined_text()
    assert "No catalog checksum: trust on first use" in text and digest[:16] in text and str(len(data)) in text
    choice = library.resolve("upscale", models_dir, "test-sr")  # what the command line prints
    assert choice.describe() == f"{models_dir / 'test-sr.onnx'} ({installer.trust_note(entry, models_dir)})"


def test_install_404_names_url_and_folder(server, models_dir, catalog):
    url = server.url("/gone.onnx")
    use_entries(catalog, entry_for(url, b"whatever"))
    with pytest.raises(RuntimeError) as err:  # bpy.ops raises on an ERROR report ({'CANCELLED'})
        bpy.ops.lean_image_ai.install_model(model_id="test-sr")
    message = str(err.value)
    assert "404" in message and url in message and str(models_dir) in message and "test-sr.onnx" in message
    assert M.downloads.last.state == "failed" and url in M.downloads.last.error_text
    assert not (models_dir / "test-sr.onnx").exists()


def test_checksum_mismatch_is_reported_and_nothing_installed(server, models_dir, catalog):
    server.files["/sr.onnx"] = b"x" * 1000
    use_entries(catalog, entry_for(server.url("/sr.onnx"), b"y" * 1000))
    with pytest.raises(RuntimeError, match="checksum"):
        bpy.ops.lean_image_ai.install_model(model_id="test-sr")
    assert not any(models_dir.iterdir())


def test_install_refused_while_offline_and_unknown_id(server, models_dir, catalog):
    server.files["/sr.onnx"] = b"x" * 100
    use_entries(catalog, entry_for(server.url("/sr.onnx"), b"x" * 100))
    bpy.context.preferences.system.use_online_access = False
    with pytest.raises(RuntimeError, match="Online access is disabled"):
        bpy.ops.lean_image_ai.install_model(model_id="test-sr")
    assert server.requests == []
    bpy.context.preferences.system.use_online_access = True
    with pytest.raises(RuntimeError, match="No model with id 'nope'"):
        bpy.ops.lean_image_ai.install_model(model_id="nope")


def test_cancel_keeps_part_and_install_resumes(server, models_dir, catalog):
    data = bytes(range(256)) * 1200  # 300 KiB, ~19 chunks
    server.files["/big.onnx"] = data
    server.throttle = 0.1  # about two seconds: the child reports progress while it downloads
    entry = entry_for(server.url("/big.onnx"), data)
    use_entries(catalog, entry)

    def cancel_when_started():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            current = M.downloads.current
            if current is not None and current.progress > 0:
                current.cancel()
                return
            time.sleep(0.005)

    canceller = threading.Thread(target=cancel_when_started)
    canceller.start()
    assert bpy.ops.lean_image_ai.install_model(model_id="test-sr") == {"CANCELLED"}  # a WARNING
    canceller.join()
    part = installer.part_path(entry, models_dir)
    assert M.downloads.last.state == "cancelled" and str(part) in M.downloads.last.error_text
    kept = part.stat().st_size
    assert 0 < kept < len(data)
    assert library.status(entry, models_dir) == library.PARTIAL

    server.throttle = 0.0
    assert bpy.ops.lean_image_ai.install_model(model_id="test-sr") == {"FINISHED"}
    assert server.requests[-1]["range"] == f"bytes={kept}-"  # resumed, not restarted
    assert (models_dir / "test-sr.onnx").read_bytes() == data


def test_child_download_shows_progress_in_preferences_and_cancel_button(server, models_dir, catalog):
    # The interactive path: the download in its child process, pumped as the modal timer does
    # (no thread), the list draws its progress, and the list's Cancel button (an operator) stops it.
    data = bytes(range(256)) * 1200
    server.files["/big.onnx"] = data
    server.throttle = 0.1  # about two seconds: the child reports progress while it downloads
    entry = entry_for(server.url("/big.onnx"), data)
    use_entries(catalog, entry)
    download = M.downloads.begin(f"Install {entry.title}", entry.id)
    download.task = M.child_job_task(download, ["models", "install", entry.id, "--models-dir", str(models_dir)], "stopped")
    try:
        deadline = time.monotonic() + 30
        while download.progress == 0 and time.monotonic() < deadline:
            assert not download.task.pump(0.01)  # what the modal timer does, in either engine
        layout = RecordingLayout()
        P.draw_model_catalog(layout, bpy.context)
        (bar,) = layout.calls("progress")
        assert 0 < bar.factor < 1 and f"/ {library.format_bytes(len(data))}" in bar.text
        assert layout.operators("lean_image_ai.cancel_download")
        assert not layout.operators("lean_image_ai.install_model")
        with pytest.raises(RuntimeError, match="'Install Test SR x2' is still running"):  # one at a time
            bpy.ops.lean_image_ai.install_model(model_id="test-sr")
        assert bpy.ops.lean_image_ai.cancel_download() == {"FINISHED"}
        deadline = time.monotonic() + 30
        while not download.task.pump(0.05):
            assert time.monotonic() < deadline
    finally:
        jobs.stop(download)
        M.downloads.end(download)
    assert download.state == "cancelled"
    assert installer.part_path(entry, models_dir).stat().st_size < len(data)
    assert bpy.ops.lean_image_ai.cancel_download.poll() is False


def test_file_copied_by_hand_is_verified_offline(server, models_dir, catalog):
    data = b"hand-copied model" * 10
    good = entry_for(server.url("/h.onnx"), data)
    bad = entry_for(None, data, id="bad", filename="bad.onnx")
    use_entries(catalog, good, bad)
    models_dir.mkdir(parents=True)
    (models_dir / "test-sr.onnx").write_bytes(data)
    (models_dir / "bad.onnx").write_bytes(data[::-1])  # right size, wrong content
    bpy.context.preferences.system.use_online_access = False
    assert library.status(good, models_dir) == library.UNVERIFIED
    assert bpy.ops.lean_image_ai.install_model(model_id="test-sr") == {"FINISHED"}
    assert library.status(good, models_dir) == library.INSTALLED and server.requests == []
    with pytest.raises(RuntimeError, match="expected " + bad.sha256):
        bpy.ops.lean_image_ai.install_model(model_id="bad")
    assert library.status(bad, models_dir) == library.UNVERIFIED


# -- the model list in the preferences --------------------------------------------------------------


def test_model_list_shows_every_entry_with_its_actions(models_dir, catalog, tmp_path):
    installed = entry_for(
        "https://example.invalid/a.onnx", None, id="inst", title="Installed one", filename="inst.onnx"
    )
    downloadable = entry_for(
        "https://example.invalid/b.onnx",
        None,
        id="dl",
        family="ben2",
        title="Downloadable one",
        filename="dl.onnx",
        approx_size_bytes=219_000_000,
    )
    manual = entry_for(None, None, id="manual", family="da3", title="Manual one", filename="manual.onnx")
    use_entries(catalog, installed, downloadable, manual)
    mine = catalog.add_user_model("moge2", tiny_onnx(tmp_path / "mine.onnx"))
    models_dir.mkdir(parents=True)
    (models_dir / "inst.onnx").write_bytes(b"abc")

    layout = RecordingLayout()
    P.draw_model_catalog(layout, bpy.context)
    text = layout.joined_text()
    for entry in (installed, downloadable, manual, mine):
        assert entry.title in layout.texts()
    assert "upscale  |  size unknown  |  license: MIT" in text
    assert "remove-background  |  ~208.9 MiB  |  license: MIT" in text
    assert f"download it yourself into {models_dir} as manual.onnx, or register your own ONNX" in text
    assert [c.props["model_id"] for c in layout.operators("lean_image_ai.install_model")] == ["dl"]
    removes = {c.props["model_id"]: c.text for c in layout.operators("lean_image_ai.remove_model")}
    assert removes == {"inst": "Remove", mine.id: "Remove (keeps your file)"}
    (register,) = layout.calls("operator_menu_enum")
    assert register.name == "lean_image_ai.register_user_model" and register.props == {"property": "family"}
    assert "Register your own ONNX model" in register.text

    # a failed download's message stays under its entry
    failed = jobs.BlenderJob("Install Downloadable one", "dl", state="failed", error_text="HTTP 404 Not Found at b.onnx")
    M.downloads.end(failed)
    layout = RecordingLayout()
    P.draw_model_catalog(layout, bpy.context)
    assert any(c.alert and "HTTP 404" in c.text for c in layout.calls("label"))


def test_model_status_without_hashing(models_dir, tmp_path):
    data = b"0123456789"
    entry = entry_for("https://example.invalid/x.onnx", data)
    models_dir.mkdir(parents=True)
    assert library.status(entry, models_dir) == library.MISSING
    installer.part_path(entry, models_dir).write_bytes(data[:4])
    assert library.status(entry, models_dir) == library.PARTIAL
    (models_dir / "test-sr.onnx").write_bytes(data[:9])
    assert library.status(entry, models_dir) == library.WRONG_SIZE
    (models_dir / "test-sr.onnx").write_bytes(data)
    assert library.status(entry, models_dir) == library.UNVERIFIED  # present, sha256 never checked
    installer.verify_installed(entry, models_dir)  # hashes once, writes the sidecar
    assert library.status(entry, models_dir) == library.INSTALLED
    user = Catalog(builtin=[]).add_user_model("upscale", tiny_onnx(tmp_path / "u.onnx"))
    assert library.status(user, models_dir) == library.USER_FILE
    (tmp_path / "u.onnx").unlink()
    assert library.status(user, models_dir) == library.USER_FILE_MISSING


# -- register your own ONNX -------------------------------------------------------------------------


def test_register_user_model_persists_to_json_and_unregister_keeps_file(models_dir, tmp_path):
    model = tiny_onnx(tmp_path / "my upscaler.onnx")
    runtime = get_runtime()
    sessions_before = len(runtime.cached_sessions())

    assert bpy.ops.lean_image_ai.register_user_model(family="upscale", filepath=str(model)) == {"FINISHED"}
    store = models_dir / "user_models.json"
    saved = json.loads(store.read_text())["user_models"]
    assert [(e["family"], e["path"]) for e in saved] == [("upscale", str(model.resolve()))]
    assert len(runtime.cached_sessions()) == sessions_before  # the check's session was evicted

    fresh = Catalog()  # as after a Blender restart: only what was saved
    (entry,) = fresh.load_user_models(store)
    assert entry.id == saved[0]["id"] and len(fresh.entries()) == len(Catalog().entries()) + 1
    assert library.catalog(models_dir).get(entry.id) == entry
    assert entry.id in [i[0] for i in S.compute_model_items("upscale")]

    assert bpy.ops.lean_image_ai.remove_model(model_id=entry.id) == {"FINISHED"}
    assert model.is_file()  # the user's own file is never deleted
    assert json.loads(store.read_text())["user_models"] == []
    assert library.catalog(models_dir).user_entries() == []


def test_register_rejects_missing_and_non_onnx_files(models_dir, tmp_path):
    not_onnx = tmp_path / "notes.onnx"
    not_onnx.write_text("this is not a model\n" * 10)
    with pytest.raises(RuntimeError) as err:
        bpy.ops.lean_image_ai.register_user_model(family="ben2", filepath=str(not_onnx))
    assert "Cannot register notes.onnx as a BEN2 background removal model" in str(err.value)
    assert "onnxruntime cannot load it as an ONNX model" in str(err.value)
    with pytest.raises(RuntimeError, match="there is no file at that path"):
        bpy.ops.lean_image_ai.register_user_model(family="ben2", filepath=str(tmp_path / "missing.onnx"))
    with pytest.raises(RuntimeError, match="Choose the .onnx file"):
        bpy.ops.lean_image_ai.register_user_model(family="ben2", filepath="")
    assert not (models_dir / "user_models.json").exists()
    assert library.catalog(models_dir).user_entries() == []
