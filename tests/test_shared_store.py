"""A models folder shared by several processes, and moved onto a disk that fills up (#33 items 1
and 2): every read-modify-write of a shared file holds a lock, and a move never leaves a truncated
model in place of the only good copy. Real processes, real files, a real write limit."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from lean_image_ai.models.store import installer, library, migrate, user_models
from model_server import loopback_entry
from onnx_builders import sr_model

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the barrier and the write limit are POSIX")

WRITERS = 8

# every process waits at a barrier (a folder of ready marks) so the eight read-modify-writes of
# user_models.json happen at the same moment; each one's check (the model load) is done before it
REGISTER = (
    "import os, sys, time\n"
    "from pathlib import Path\n"
    "from lean_image_ai.models.store import user_models\n"
    "family, file, folder, gate, count = sys.argv[1:6]\n"
    "checked = user_models.check(family, file)\n"
    "(Path(gate) / str(os.getpid())).touch()\n"
    "while len(os.listdir(gate)) < int(count):\n"
    "    time.sleep(0.001)\n"
    "print(user_models.save(family, file, Path(folder), *checked).summary(), flush=True)\n"
)


def test_eight_processes_registering_at_once_keep_all_eight_entries(tmp_path):
    models = [sr_model(tmp_path / f"mine_{i}.onnx", scale=2) for i in range(WRITERS)]
    folder, gate = tmp_path / "models", tmp_path / "gate"
    gate.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REGISTER, "upscale", str(model), str(folder), str(gate), str(WRITERS)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for model in models
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0 and "Registered" in out, err
    saved = json.loads((folder / library.USER_MODELS_FILE).read_text())["user_models"]
    assert sorted(Path(e["path"]).name for e in saved) == sorted(m.name for m in models)
    assert sorted(p.name for p in folder.iterdir()) == [library.USER_MODELS_FILE]  # no lock or temp file left


def test_unregister_keeps_what_another_process_added_meanwhile(tmp_path):
    folder = tmp_path / "models"
    first, second = sr_model(tmp_path / "a.onnx", scale=2), sr_model(tmp_path / "b.onnx", scale=2)
    gone = user_models.register("upscale", first, folder).entry
    shown = library.catalog(folder)  # what Blender's panel or `models list` showed
    code = "import sys\nfrom lean_image_ai.models.store import user_models\nuser_models.register(*sys.argv[1:])"
    subprocess.run([sys.executable, "-c", code, "upscale", str(second), str(folder)], check=True, timeout=120)
    assert gone.id in shown  # another process registered b.onnx since then
    user_models.unregister(gone.id, folder)
    assert [Path(e.path).name for e in library.catalog(folder).user_entries()] == ["b.onnx"]


def test_a_list_that_cannot_be_read_is_never_overwritten_by_a_register(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    broken = '{"format": 2, "user_models": [ {"id": "half-written'
    (folder / library.USER_MODELS_FILE).write_text(broken)
    with pytest.raises(library.LeanImageError, match="Could not read the saved user models"):
        user_models.register("upscale", sr_model(tmp_path / "a.onnx", scale=2), folder)
    assert (folder / library.USER_MODELS_FILE).read_text() == broken


def test_a_file_replaced_while_it_is_hashed_is_not_recorded_as_verified(tmp_path):
    """verify_installed hashes the file, then rewrites its record: a file another process
    replaced meanwhile (same size, other bytes) must not inherit the old file's good sha256."""
    good = b"good weights" * 4096
    entry = loopback_entry(None, good)
    dest = installer.model_path(entry, tmp_path)
    dest.write_bytes(good)
    polls = []

    def replace_once():  # polled between the hash's chunks: another process installs other bytes
        if not polls:
            swap = dest.with_name("swap")
            swap.write_bytes(b"evil weights" * 4096)
            os.replace(swap, dest)
        polls.append(1)
        return False

    installer.verify_installed(entry, tmp_path, cancel=replace_once)
    assert not installer.is_verified(entry, tmp_path)
    with pytest.raises(library.ModelFileError, match="has sha256"):
        installer.verify_installed(entry, tmp_path)  # hashed again, and caught
    dest.write_bytes(good)
    installer.verify_installed(entry, tmp_path)
    assert installer.is_verified(entry, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([dest.name, installer.sidecar_path(entry, tmp_path).name])


# ---- item 2: moving the old library onto a disk that fills up ----------------------------------------

MOVE = (
    "import errno, json, os, resource, signal, sys\n"
    "from pathlib import Path\n"
    "old, new, limit, cross = sys.argv[1:5]\n"
    "if cross == 'stand-in':  # no second file system here: rename across the folders fails as it would\n"
    "    real = os.rename\n"
    "    def rename(a, b, *rest, **kw):\n"
    "        if Path(a).parent == Path(old) and Path(b).parent == Path(new):\n"
    "            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))\n"
    "        return real(a, b, *rest, **kw)\n"
    "    os.rename = rename\n"
    "from lean_image_ai.models.store import library\n"
    "if int(limit):  # a real write limit: writing past it fails with EFBIG, as a full disk does with ENOSPC\n"
    "    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
    "print(json.dumps(library.migrate_models(Path(old), Path(new))))\n"
)


def _other_file_system(tmp_path: Path) -> Path | None:
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != tmp_path.stat().st_dev:
            return Path(tempfile.mkdtemp(prefix="lean_image_ai_move_", dir=shm))
    except OSError:
        pass
    return None


def _move(old: Path, new: Path, limit: int, cross: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", MOVE, str(old), str(new), str(limit), cross], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_move_onto_a_disk_that_fills_up_keeps_the_original_and_says_why(tmp_path):
    other = _other_file_system(tmp_path)
    base, cross = (other, "real") if other is not None else (tmp_path / "other", "stand-in")
    try:
        old, new = tmp_path / "ext" / "models", base / "shared" / "models"
        old.mkdir(parents=True)
        weights = os.urandom(2_500_000)
        (old / "big.onnx").write_bytes(weights)
        (old / "big.onnx.verified.json").write_text(json.dumps({"sha256": hashlib.sha256(weights).hexdigest()}))
        (old / library.USER_MODELS_FILE).write_text('{"format": 2, "user_models": []}')
        os.utime(old / "big.onnx", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))

        assert _move(old, new, 1_000_000, cross) == ["big.onnx"]
        assert (old / "big.onnx").read_bytes() == weights  # the only good copy, untouched
        assert sorted(p.name for p in new.iterdir()) == ["big.onnx.verified.json", library.USER_MODELS_FILE]
        note = (old / library.MIGRATED_NOTE).read_text()
        assert str(new) in note and "big.onnx: copying it to" in note and os.strerror(errno.EFBIG) in note
        assert "already there" not in note and "tried again" in note

        assert _move(old, new, 0, cross) == []  # the next start, with room: moved, verified, and the old folder gone
        assert not old.exists()
        assert (new / "big.onnx").read_bytes() == weights
        assert (new / "big.onnx").stat().st_mtime_ns == 1_600_000_000_000_000_000  # its verified record still holds
    finally:
        if other is not None:
            shutil.rmtree(other)


def test_a_copy_that_does_not_read_back_the_same_is_removed(tmp_path, monkeypatch):
    """The read-back check itself: a disk that takes a write and returns other bytes."""
    source, target = tmp_path / "a.onnx", tmp_path / "new" / "a.onnx"
    target.parent.mkdir()
    source.write_bytes(b"weights" * 1000)
    real = migrate._size_and_sha256
    monkeypatch.setattr(migrate, "_size_and_sha256", lambda path: (real(path)[0] - 1, real(path)[1]))
    with pytest.raises(OSError, match="does not match the original"):
        migrate._copy_verified(source, target)
    assert list(target.parent.iterdir()) == [] and source.read_bytes() == b"weights" * 1000


def test_a_name_already_in_the_new_folder_is_said_so_and_an_identical_copy_completes_the_move(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    (old / "a.onnx").write_bytes(b"older")
    (new / "a.onnx").write_bytes(b"newer")
    (old / "b.onnx").write_bytes(b"same")
    (new / "b.onnx").write_bytes(b"same")  # an earlier move's copy, its original left behind
    assert library.migrate_models(old, new) == ["a.onnx"]
    assert sorted(p.name for p in old.iterdir()) == ["MOVED_TO.txt", "a.onnx"]
    assert f"a.onnx: {migrate.ALREADY_THERE}" in (old / "MOVED_TO.txt").read_text()
