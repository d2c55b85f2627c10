"""A shared output folder with another user in it, and names at the file system's limits (#33
items 3, 4, 5, 10, 16, 17): the writer works on the file it made, claims and outputs never follow a
link planted at their name, long legal names work, a read-only folder with nothing to write is
fine, and a killed run's claims go with the next run of any mode. Real files, real processes."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from lean_image_ai.models import files
from lean_image_ai.models.batch.frame_claims import FrameClaims, claim_path
from lean_image_ai.runtime.errors import LeanImageError
from PIL import Image
from test_cli import cli, summary

posix_only = pytest.mark.skipif(os.name != "posix", reason="symbolic links and permission bits as POSIX has them")


def frames(folder: Path, count: int = 2) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    for n in range(1, count + 1):
        Image.fromarray(rng.integers(0, 255, (12, 16, 3), np.uint8)).save(folder / f"s_{n:04d}.png")
    return folder / "s_####.png"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ---- item 4: the writer's temporary file swapped by another user --------------------------------


@posix_only
@pytest.mark.parametrize("swap", ["symlink", "other file"])
def test_a_swapped_temporary_file_fails_and_changes_nothing_else(tmp_path, swap):
    private = tmp_path / "private.key"
    private.write_text("the job user's secret")
    private.chmod(0o600)
    target = tmp_path / "o_0001.png"
    with pytest.raises(files.SwappedTemporaryFile, match="was replaced by something else"):
        with files.atomic_path(target) as tmp:
            tmp.write_bytes(b"the result")
            tmp.unlink()  # what another user of a world-writable folder without sticky bit can do
            if swap == "symlink":
                tmp.symlink_to(private)
            else:
                tmp.write_bytes(b"someone else's content")
    assert mode(private) == 0o600  # never chmod-ed through the link
    assert private.read_text() == "the job user's secret"
    assert not os.path.lexists(target)  # neither the link nor the other file installed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["private.key"]


@posix_only
def test_the_temporary_file_is_made_new_and_private_until_complete(tmp_path):
    target = tmp_path / "o.png"
    with files.atomic_path(target) as tmp:
        assert tmp.is_file() and not tmp.is_symlink() and mode(tmp) == 0o600  # made here, O_EXCL
        tmp.write_bytes(b"x")
    old = os.umask(0o022)
    os.umask(old)
    assert mode(target) == 0o666 & ~old and target.read_bytes() == b"x"


# ---- item 3: a link or a non-file planted at a claim's name ---------------------------------------


@posix_only
def test_a_symlink_at_a_claim_name_is_refused_and_creates_nothing(tmp_path):
    elsewhere = tmp_path / "victim"
    elsewhere.mkdir()
    target = tmp_path / "o_0001.png"
    claim_path(target).symlink_to(elsewhere / "created_by_the_job")
    with pytest.raises(LeanImageError, match="is a symbolic link, where this frame's claim file goes"):
        FrameClaims().take(target)
    assert list(elsewhere.iterdir()) == []
    existing = elsewhere / "data"
    existing.write_bytes(b"keep me")
    claim_path(target).unlink()
    claim_path(target).symlink_to(existing)
    with pytest.raises(LeanImageError, match="symbolic link"):
        FrameClaims().take(target)
    assert existing.read_bytes() == b"keep me"


@posix_only
def test_a_fifo_folder_or_hard_link_at_a_claim_name_is_refused(tmp_path):
    target = tmp_path / "o_0001.png"
    os.mkfifo(claim_path(target))  # opened as it was, reading it for the marker would block forever
    with pytest.raises(LeanImageError, match="not a plain file"):
        FrameClaims().take(target)
    claim_path(target).unlink()
    claim_path(target).mkdir()
    with pytest.raises(LeanImageError, match="a folder"):
        FrameClaims().take(target)
    claim_path(target).rmdir()
    other = tmp_path / "someone_elses"
    other.write_bytes(b"")
    os.link(other, claim_path(target))
    with pytest.raises(LeanImageError, match="hard link"):
        FrameClaims().take(target)
    assert other.read_bytes() == b""


@posix_only
def test_a_skip_existing_job_fails_only_the_frame_whose_claim_is_a_link(tmp_path):
    pattern = frames(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    claim_path(out / "o_0001.png").symlink_to(elsewhere / "planted")
    done = cli("upscale", str(pattern), str(out / "o_####.png"), "--device", "cpu", "--skip-existing", cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    report = summary(done)
    assert report["written"] == 1 and len(report["failed"]) == 1, report
    assert "symbolic link" in report["failed"][0]["error"]
    assert list(elsewhere.iterdir()) == []
    assert (out / "o_0002.png").is_file() and not os.path.lexists(out / "o_0001.png")


# ---- item 5: a link at an output name is an existing output --------------------------------------


@posix_only
@pytest.mark.parametrize("flag", [[], ["--skip-existing"], ["--overwrite"]])
def test_a_dangling_symlink_at_an_output_name_never_redirects_the_result(tmp_path, flag):
    pattern = frames(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "o_0001.png").symlink_to(elsewhere / "redirected.png")
    done = cli("upscale", str(pattern), str(out / "o_####.png"), "--device", "cpu", *flag, cwd=tmp_path)
    assert list(elsewhere.iterdir()) == [], done.stdout  # nothing written through the link
    if not flag:
        assert done.returncode == 2 and "o_0001.png exists" in done.stderr
        assert not (out / "o_0002.png").exists()  # refused before any model ran
    elif flag == ["--skip-existing"]:
        assert done.returncode == 0, done.stderr
        assert (summary(done)["written"], summary(done)["skipped"]) == (1, 1)
        assert (out / "o_0001.png").is_symlink()
    else:
        assert done.returncode == 0, done.stderr
        assert not (out / "o_0001.png").is_symlink() and (out / "o_0001.png").is_file()  # the link was replaced


# ---- item 10: long legal output names -------------------------------------------------------------


@pytest.mark.parametrize("flag", [[], ["--skip-existing"]])
def test_a_250_byte_output_name_is_written(tmp_path, flag):
    pattern = frames(tmp_path / "in", 1)
    name = "n" * 246 + ".png"
    assert len(name.encode()) == 250
    out = tmp_path / "out"
    out.mkdir()
    done = cli("upscale", str(pattern).replace("####", "0001"), str(out / name), "--device", "cpu", *flag, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in out.iterdir()] == [name]  # no temporary or claim file left
    with Image.open(out / name) as written:
        assert written.size == (32, 24)


def test_hidden_names_beside_a_255_byte_name_fit_and_stay_distinct(tmp_path):
    a, b = tmp_path / ("a" * 251 + ".exr"), tmp_path / ("b" * 251 + ".exr")
    for target in (a, b):
        for hidden in (files.temp_path_for(target), claim_path(target)):
            assert len(hidden.name.encode()) <= files.NAME_MAX
    assert claim_path(a) != claim_path(b)
    assert files.temp_path_for(a).suffix == ".exr"  # writers still pick the format by it
    files.write_bytes(a, b"data")
    left = files.temp_path_for(b)  # what a killed writer of b leaves: found and cleaned by its hashed name
    left.write_bytes(b"half")
    assert files.leftover_temps(b) == [left] and files.leftover_temps(a) == []
    past = left.stat().st_mtime - 60  # the killed writer's, a minute ago (a younger one may be a writer about to lock it)
    os.utime(left, (past, past))
    assert files.remove_stale_temps([a, b], older_than=past + 1) == [left]
    files.write_bytes(b, b"y")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([a.name, b.name])


# ---- item 16: a read-only folder with nothing to write ----------------------------------------------


@posix_only
def test_skip_existing_in_a_read_only_folder_with_every_frame_present_succeeds():
    """A real read-only folder: as root (which writes anywhere) the CLI drops to 'nobody' once its
    modules are imported."""
    base = Path(tempfile.mkdtemp(prefix="lean_image_ai_ro_"))
    try:
        base.chmod(0o755)
        pattern = frames(base / "in")
        out = base / "out"
        done = cli("upscale", str(pattern), str(out / "o_####.png"), "--device", "cpu", cwd=base)
        assert done.returncode == 0, done.stderr
        logs = base / "logs"
        logs.mkdir(mode=0o777)
        logs.chmod(0o777)
        out.chmod(0o555)
        drop = "os.setgroups([]); os.setgid(65534); os.setuid(65534)" if os.geteuid() == 0 else ""
        args = ["upscale", str(pattern), str(out / "o_####.png"), "--device", "cpu", "--skip-existing"]
        code = (
            "import os, sys\nimport lean_image_ai.ui.cli.main as cli, onnxruntime, PIL.Image, numpy\n"
            f"{drop}\nsys.exit(cli.main({args!r}))"
        )
        env = {**os.environ, "LEAN_IMAGE_AI_LOG_DIR": str(logs), "HOME": str(logs)}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=base)
        assert done.returncode == 0, done.stderr
        assert (summary(done)["written"], summary(done)["skipped"]) == (0, 2)
        # with something to write, the folder is still refused before any model runs
        args[-1] = "--overwrite"
        code = code.replace("'--skip-existing'", "'--overwrite'")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=base)
        assert done.returncode == 2 and "is not writable" in done.stderr, (done.stdout, done.stderr)
    finally:
        (base / "out").chmod(0o755)
        shutil.rmtree(base)


# ---- item 17: a killed run's claims go with the next run of any mode --------------------------------

HOLD = (
    "import sys, time\n"
    "from lean_image_ai.models.batch.frame_claims import FrameClaims\n"
    "claims = FrameClaims()\n"
    "print(all([claims.take(p) for p in sys.argv[1:]]), flush=True)\n"
    "time.sleep(120)\n"
)


def _hold(*targets: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, *map(str, targets)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "True"
    return proc


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
@pytest.mark.parametrize("flag", [["--overwrite"], [], ["--skip-existing"]])
def test_a_killed_runs_claims_are_removed_by_the_next_run_of_any_mode(tmp_path, flag):
    pattern = frames(tmp_path / "in", 3)
    out = tmp_path / "out"
    out.mkdir()
    killed = _hold(out / "o_0001.png", out / "o_0002.png")
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    live = _hold(out / "o_0003.png")  # a run computing frame 3 right now
    try:
        assert claim_path(out / "o_0001.png").exists() and claim_path(out / "o_0002.png").exists()
        done = cli("upscale", str(pattern), str(out / "o_####.png"), "--device", "cpu", *flag, cwd=tmp_path)
        assert "Traceback" not in done.stderr
        assert not claim_path(out / "o_0001.png").exists() and not claim_path(out / "o_0002.png").exists()
        assert claim_path(out / "o_0003.png").exists()  # held by a live process: left to it
        assert "removed a frame claim left by an interrupted run" in done.stderr
    finally:
        live.kill()
        live.wait(timeout=30)
