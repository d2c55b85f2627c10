"""A broken list of the user's models, or a models folder that is not one, is a one-line error
naming the file or folder and the problem (exit 2), never a silent fallback to another model
(issue #21: the CLI used the embedded bicubic model, exit 0). Real CLI processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from lean_image_ai.models.store import library
from lean_image_ai.models.store.catalog import Catalog
from PIL import Image

GOOD_ENTRY = {
    "family": "upscale",
    "variant": "user",
    "title": "mine",
    "filename": "mine.onnx",
    "url": None,
    "size_bytes": None,
    "sha256": None,
    "license": "mine",
    "source": "user file",
    "settings": {},
    "notes": "",
    "approx_size_bytes": None,
    "path": "/nowhere/mine.onnx",
    "id": "user-upscale-mine-00000000",
}


def _store(**changes) -> str:
    entry = {**GOOD_ENTRY, **changes}
    return json.dumps({"format": 2, "user_models": [entry]})


# name -> (text of user_models.json, what the message must say)
BROKEN_LISTS = {
    "truncated": (_store()[:70], "Expecting"),
    "not-json": ("this is not JSON\n", "Expecting value"),
    "a-list": ("[]", "found a list"),
    "future-format": (json.dumps({"format": 3, "user_models": []}), "format 3, written by a newer version"),
    "wrong-type-title": (_store(title=5), "title must be text"),
    "wrong-type-list": (json.dumps({"format": 2, "user_models": "mine.onnx"}), "'user_models' must be a list"),
    "wrong-type-size": (_store(size_bytes="big"), "size_bytes must be a positive int"),
    "unknown-field": (_store(colour="red"), "unknown field(s) colour"),
    "unknown-top-field": (json.dumps({"format": 2, "user_models": [], "extra": 1}), "unknown field(s) 'extra'"),
    "deep-nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "not-utf8": (b"\xff\xfe{".decode("latin-1"), "not UTF-8"),
    "duplicate-id": (json.dumps({"format": 2, "user_models": [GOOD_ENTRY, GOOD_ENTRY]}), "is there twice"),
}


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("input") / "in.png"
    Image.fromarray(np.full((12, 16, 3), 90, np.uint8)).save(path)
    return path


def _upscale(folder: Path, image: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, library.MODELS_DIR_ENV: str(folder)}
    command = [sys.executable, "-m", "lean_image_ai", "upscale", "--input", str(image), "--output", str(out)]
    return subprocess.run(command + ["--device", "cpu"], capture_output=True, text=True, timeout=120, env=env)


def _one_line_error(done: subprocess.CompletedProcess, out: Path, *names: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert done.stdout == ""  # nothing ran: no model was picked in its place
    for name in names:
        assert name in lines[0]
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize("case", sorted(BROKEN_LISTS))
def test_a_broken_user_models_file_is_an_error_naming_it(tmp_path, image, case):
    text, problem = BROKEN_LISTS[case]
    folder = tmp_path / "models"
    folder.mkdir()
    store = folder / library.USER_MODELS_FILE
    store.write_bytes(text.encode("latin-1") if case == "not-utf8" else text.encode("utf-8"))
    before = store.read_bytes()
    line = _one_line_error(_upscale(folder, image, tmp_path / "out.png"), tmp_path / "out.png", str(store), problem)
    assert len(line) < 1000
    assert store.read_bytes() == before  # the user's file is left as it was


def _models_folder_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    a_file = tmp_path / "models.txt"
    a_file.write_text("not a folder")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    return {
        "a-file": (a_file, "is not a folder"),
        "missing": (tmp_path / "no such folder", "does not exist"),
        "under-a-file": (a_file / "models", "is not a folder"),
        "link-loop": (loop, "(a link loop)"),
    }


@pytest.mark.parametrize("case", ["a-file", "missing", "under-a-file", "link-loop"])
def test_a_models_dir_that_is_no_folder_is_an_error_naming_it(tmp_path, image, case):
    folder, problem = _models_folder_cases(tmp_path)[case]
    out = tmp_path / "out.png"
    _one_line_error(_upscale(folder, image, out), out, str(folder), problem)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_a_models_folder_this_user_cannot_open_is_an_error(image):
    """A real EACCES from the OS: the folder is its owner's only, and the CLI runs as another
    user (as root, the child drops to 'nobody' once its modules are imported: root itself reads
    any folder)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="lean_image_ai_perm_"))
    try:
        base.chmod(0o777)
        folder = base / "models"
        folder.mkdir()
        (folder / library.USER_MODELS_FILE).write_text(_store())
        shutil.copy(image, base / "in.png")
        (base / "in.png").chmod(0o644)
        folder.chmod(0o700 if os.geteuid() == 0 else 0)
        drop = "os.setgroups([]); os.setgid(65534); os.setuid(65534)" if os.geteuid() == 0 else ""
        out = base / "out.png"
        args = ["upscale", "--input", str(base / "in.png"), "--output", str(out), "--device", "cpu"]
        code = (
            "import os, sys\nimport lean_image_ai.ui.cli.main as cli, onnxruntime, PIL.Image, numpy\n"
            f"{drop}\nsys.exit(cli.main({args!r}))"
        )
        env = {**os.environ, library.MODELS_DIR_ENV: str(folder)}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        _one_line_error(done, out, "Permission denied", str(folder))
    finally:
        (base / "models").chmod(0o755)
        shutil.rmtree(base)


def test_a_folder_that_cannot_be_traversed_is_a_clear_error_in_process(tmp_path, monkeypatch):
    """The same path through Catalog.load_user_models with the OS's own PermissionError (root
    bypasses permission bits, so the folder's error is provoked with a path the OS refuses)."""
    blocked = tmp_path / "blocked"
    blocked.symlink_to(blocked)  # ELOOP from every lookup under it, for root too
    with pytest.raises(library.LeanImageError, match="a link loop") as info:
        Catalog().load_user_models(blocked / library.USER_MODELS_FILE)
    assert str(blocked) in str(info.value)


def test_a_models_folder_that_is_not_made_yet_loads_no_user_models(tmp_path):
    assert Catalog().load_user_models(tmp_path / "new" / library.USER_MODELS_FILE) == []
