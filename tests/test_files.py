"""models/files.py, the one writer every saved file goes through: all or nothing, with the
permission bits a user expects."""

from __future__ import annotations

import os
import stat
import sys
import time

import pytest
import temp_writer
from lean_image_ai.models import files

posix_only = pytest.mark.skipif(sys.platform.startswith("win"), reason="POSIX permission bits")


def listing(folder):
    return sorted(p.name for p in folder.iterdir())


@posix_only
def test_new_file_gets_the_umask_mode(tmp_path):
    old = os.umask(0o027)
    try:
        files.write_bytes(tmp_path / "new.bin", b"data")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.bin").stat().st_mode) == 0o640  # 0o666 & ~0o027
    assert listing(tmp_path) == ["new.bin"]


@posix_only
def test_replacing_keeps_the_existing_permission_bits(tmp_path):
    target = tmp_path / "shared.json"
    target.write_text("old")
    target.chmod(0o664)
    files.write_text(target, "new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o664


def test_failure_inside_the_block_keeps_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "result.png"
    target.write_bytes(b"original")
    with pytest.raises(RuntimeError, match="writer broke"):
        with files.atomic_path(target) as temp:
            assert temp.parent == tmp_path and temp.suffix == ".png"  # writers pick formats by suffix
            temp.write_bytes(b"half")
            raise RuntimeError("writer broke")
    assert target.read_bytes() == b"original"
    assert listing(tmp_path) == ["result.png"]


def test_a_writer_that_writes_nothing_is_an_error(tmp_path):
    target = tmp_path / "empty.txt"
    with pytest.raises(OSError, match="nothing was written"):
        with files.atomic_path(target):
            pass
    with pytest.raises(OSError):
        files.write_bytes(target, b"")
    assert listing(tmp_path) == []


def test_failed_rename_removes_the_temp(tmp_path, monkeypatch):
    target = tmp_path / "keep.txt"
    target.write_text("original")

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        files.write_text(target, "new")
    assert target.read_text() == "original"
    assert listing(tmp_path) == ["keep.txt"]


def test_leftover_temps_finds_only_temps_of_that_target(tmp_path):
    target = tmp_path / "out_0001.png"
    # what a writer killed inside the block leaves: the temp name atomic_path really uses
    killed = files.temp_path_for(target)
    killed.write_bytes(b"half")
    other = files.temp_path_for(tmp_path / "out_0002.png")
    other.write_bytes(b"half")
    (tmp_path / ".out_0001.png.notes.tmp.png").write_bytes(b"not ours")
    target.write_bytes(b"whole")
    assert files.leftover_temps(target) == [killed]
    assert files.leftover_temps(tmp_path / "missing" / "x.png") == []


def test_a_temp_a_live_process_writes_is_kept_whatever_its_age_and_removed_once_it_dies(tmp_path):
    """Issue #39 item 13: age alone judged a temporary file, so a killed writer's young one stayed
    after the run (and an old one of a live, slow writer would have gone). The writer's lock tells."""
    target = tmp_path / "o_0001.png"
    writer, tmp = temp_writer.start(target)
    try:
        past = time.time() - 3600
        os.utime(tmp, (past, past))  # by age, a killed writer's
        assert files.remove_stale_temps([target], older_than=time.time()) == []
        assert tmp.exists()
    finally:
        temp_writer.kill(writer)
    young = time.time() + 60
    os.utime(tmp, (young, young))  # younger than any run's start: by age, a live writer's
    assert files.remove_stale_temps([target], older_than=time.time() - 60) == [tmp]
    assert listing(tmp_path) == []


def test_a_cleaner_in_the_instant_before_the_writer_locks_its_file_costs_the_writer_nothing(tmp_path, monkeypatch):
    # the one interleaving where a live writer's file has no lock yet: made, not locked. The
    # cleaner takes it for a dead writer's; the writer sees that and makes another.
    target = tmp_path / "o_0001.png"
    real_lock, removed = files._lock_for_writer, []

    def cleaner_comes_first(fd):
        if not removed:
            removed.extend(files.remove_stale_temps([target], older_than=0.0))
        return real_lock(fd)

    monkeypatch.setattr(files, "_lock_for_writer", cleaner_comes_first)
    files.write_bytes(target, b"the frame")
    assert len(removed) == 1 and target.read_bytes() == b"the frame"
    assert listing(tmp_path) == ["o_0001.png"]
