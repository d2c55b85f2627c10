"""`python -m lean_image_ai models ...` and the one models folder Blender and the CLI share
(models/store/library.py, runtime/paths.py): default per OS, overrides, the one-time move."""

from __future__ import annotations

import json

import pytest
from builders_families import ben2_like_model, da3_like_model
from lean_image_ai.models.store import library
from lean_image_ai.models.store.catalog import Catalog
from lean_image_ai.runtime import paths
from lean_image_ai.ui.cli import main as cli
from model_server import loopback_entry
from onnx_builders import sr_model


@pytest.fixture
def folder(tmp_path, monkeypatch):
    path = tmp_path / "models"
    monkeypatch.setenv(library.MODELS_DIR_ENV, str(path))
    return path


def run(capsys, *argv):
    code = cli.main(["models", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_register_list_remove_a_users_model(folder, tmp_path, capsys):
    model = sr_model(tmp_path / "my_x2.onnx", scale=2)
    code, out, err = run(capsys, "register", "upscale", str(model))
    assert code == 0, err
    assert "Registered my_x2 (your model) as a" in out and "Warning" not in out
    saved = json.loads((folder / "user_models.json").read_text())
    (entry,) = saved["user_models"]
    assert entry["path"] == str(model.resolve())

    code, out, _ = run(capsys, "list", "--family", "upscale")
    assert code == 0 and f"models folder: {folder}" in out
    assert entry["id"] in out and "user_file" in out

    code, out, _ = run(capsys, "remove", entry["id"])
    assert code == 0 and "your file" in out and model.is_file()  # the user's file is kept
    assert json.loads((folder / "user_models.json").read_text())["user_models"] == []


def test_register_refuses_a_file_of_another_family_in_one_line(folder, tmp_path, capsys):
    matte = ben2_like_model(tmp_path / "ben2.onnx", size=64)
    code, out, err = run(capsys, "register", "upscale", str(matte))
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "Cannot register ben2.onnx as a" in line
    assert "this looks like a background-removal (matte) model: one channel ('output') ending in a Sigmoid" in line
    assert not (folder / "user_models.json").exists()  # nothing registered
    depth = da3_like_model(tmp_path / "da3.onnx", fixed_hw=(56, 56))
    assert run(capsys, "register", "ben2", str(depth))[0] == 2


def test_install_verify_remove_with_the_shared_installer(folder, server, tmp_path, capsys, monkeypatch):
    data = sr_model(tmp_path / "src.onnx", scale=2).read_bytes()
    server.files["/sr.onnx"] = data
    entry = loopback_entry(server.url("/sr.onnx"), data, id="test-sr", filename="test-sr.onnx")
    catalog = Catalog(builtin=[entry])
    monkeypatch.setattr(library, "catalog", lambda _folder: catalog)

    code, out, err = run(capsys, "install", "test-sr")
    assert code == 0, err
    assert "[100%] downloading" in out and (folder / "test-sr.onnx").read_bytes() == data
    code, out, _ = run(capsys, "verify")
    assert code == 0 and "ok     test-sr" in out and "1 checked, 0 failed" in out

    (folder / "test-sr.onnx").write_bytes(data[:-1] + b"x")  # same size, other bytes
    (folder / "test-sr.onnx.verified.json").unlink()
    code, out, err = run(capsys, "verify")
    assert code == 2 and "FAILED test-sr" in out and "sha256" in out

    code, out, _ = run(capsys, "remove", "test-sr")
    assert code == 0 and not (folder / "test-sr.onnx").exists()
    code, _out, err = run(capsys, "remove", "test-sr")
    assert code == 2 and "is not installed" in err


def test_unknown_id_points_to_models_list(folder, capsys):
    code, _out, err = run(capsys, "install", "no-such-model")
    assert code == 2 and "`python -m lean_image_ai models list` shows the ids" in err


def test_no_model_error_points_to_models_install(folder):
    with pytest.raises(library.ModelFileError, match=r"python -m lean_image_ai models install moge2-"):
        library.resolve("moge2", folder)
    with pytest.raises(library.ModelFileError, match=r"`python -m lean_image_ai models install da3-metric-large`"):
        library.resolve("da3", folder, model_id="da3-metric-large")


@pytest.mark.parametrize(
    "platform, env, expected",
    [
        ("linux", {}, "home/.local/share/lean_image_ai/models"),
        ("linux", {"XDG_DATA_HOME": "XDG"}, "XDG/lean_image_ai/models"),
        ("darwin", {}, "home/Library/Application Support/lean_image_ai/models"),
        ("win32", {"LOCALAPPDATA": "LAD"}, "LAD/lean_image_ai/models"),
    ],
)
def test_shared_models_folder_per_os(monkeypatch, tmp_path, platform, env, expected):
    monkeypatch.delenv(library.MODELS_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setattr(paths.sys, "platform", platform)
    monkeypatch.setattr(paths.Path, "home", classmethod(lambda cls: tmp_path / "home"))
    for key, value in env.items():
        monkeypatch.setenv(key, str(tmp_path / value))
    assert library.models_dir() == tmp_path / expected
    assert library.models_dir(tmp_path / "chosen") == tmp_path / "chosen"  # the preference / --models-dir
    monkeypatch.setenv(library.MODELS_DIR_ENV, str(tmp_path / "env"))
    assert library.models_dir() == tmp_path / "env"


def test_old_default_folder_is_moved_once_never_copied(tmp_path):
    old, new = tmp_path / "ext" / "models", tmp_path / "shared" / "models"
    old.mkdir(parents=True)
    (old / "big.onnx").write_bytes(b"weights")
    (old / "user_models.json").write_text('{"format": 2, "user_models": []}')
    (old / "half.onnx.part").write_bytes(b"wei")
    inode = (old / "big.onnx").stat().st_ino
    assert library.migrate_models(old, new) == []
    assert not old.exists()  # emptied, so removed
    assert (new / "big.onnx").read_bytes() == b"weights" and (new / "big.onnx").stat().st_ino == inode
    assert (new / "half.onnx.part").is_file() and (new / "user_models.json").is_file()
    assert library.migrate_models(old, new) == []  # again: nothing to do

    old.mkdir()
    (old / "big.onnx").write_bytes(b"older")  # a name the new folder already has: left, with a note
    assert library.migrate_models(old, new) == ["big.onnx"]
    assert (new / "big.onnx").read_bytes() == b"weights" and (old / "big.onnx").read_bytes() == b"older"
    assert str(new) in (old / library.MIGRATED_NOTE).read_text()


def test_models_help_names_the_shared_folder(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["models", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for action in ("list", "install", "register", "remove", "verify"):
        assert action in out
    assert str(library.shared_models_dir()) in " ".join(out.split())

