"""Moving a library left in an older default models folder (the extension's user folder, which
Blender deletes on update or uninstall) into the shared one, without ever losing a model (bpy-free).

On one file system each file or folder is renamed: nothing is copied. Across file systems (the
shared folder on another disk) each is copied under a hidden name, the copy is read back and
compared with the original (size and sha256), and only then renamed into place and the original
removed: a copy cut short (a full disk, a quota) never shows up as an installed model, and its
partial file is removed. What could not be moved stays in the old folder with a note
(``MOVED_TO.txt``) saying where the rest went and, for each, why; the next start tries again.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
from pathlib import Path

from .. import files

MIGRATED_NOTE = "MOVED_TO.txt"
ALREADY_THERE = "a different file of that name was already there"
_CHUNK = 1 << 20


def migrate_models(old: Path, new: Path) -> list[str]:
    """Move what ``old`` holds into ``new`` (see module doc); the old folder is removed once
    empty. Returns the names left behind (empty when everything moved)."""
    old, new = Path(old), Path(new)
    try:
        if not old.is_dir() or old.resolve() == new.resolve():
            return []
        names = sorted(p.name for p in old.iterdir() if p.name != MIGRATED_NOTE)
    except OSError:
        return []
    if not names:
        return []
    new.mkdir(parents=True, exist_ok=True)
    left = {name: why for name in names if (why := move_one(old / name, new / name))}
    _leave_note(old, new, left)
    return list(left)


def move_one(source: Path, target: Path) -> str | None:
    """Move ``source`` to ``target`` whole or not at all; None when moved, else why not."""
    if os.path.lexists(target):
        if _same_file_content(source, target):  # an earlier move's verified copy: only the original was left
            _remove(source)
            return None
        return ALREADY_THERE
    try:
        os.rename(source, target)
        return None
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            return f"it could not be moved ({exc.strerror or exc})"
    try:
        _copy_verified(source, target)
    except OSError as exc:
        return f"copying it to {target.parent} failed ({exc.strerror or exc}); the original was kept here and the partial copy removed"
    with contextlib.suppress(OSError):  # the verified copy is in place: a leftover original is retried
        _remove(source)
    return None


def _leave_note(old: Path, new: Path, left: dict[str, str]) -> None:
    note = old / MIGRATED_NOTE
    if not left:
        with contextlib.suppress(OSError):
            note.unlink(missing_ok=True)
            old.rmdir()
        return
    lines = [f"Lean Image AI's models folder is now {new}. These stayed here:"]
    lines += [f"  {name}: {why}" for name, why in left.items()]
    if any(why != ALREADY_THERE for why in left.values()):
        lines.append("Moving them is tried again the next time the add-on starts (free some space there first).")
    with contextlib.suppress(OSError):
        files.write_text(note, "\n".join(lines) + "\n")


def _copy_verified(source: Path, target: Path) -> None:
    temp = files.hidden_beside(target, ".moving")
    _remove(temp, missing_ok=True)  # what an attempt killed outright left
    try:
        _copy_any(source, temp)
        os.rename(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            _remove(temp, missing_ok=True)
        raise


def _copy_any(source: Path, dest: Path) -> None:
    if source.is_symlink():
        os.symlink(os.readlink(source), dest)
    elif source.is_dir():
        os.mkdir(dest)
        for entry in sorted(os.listdir(source)):
            _copy_any(source / entry, dest / entry)
        shutil.copystat(source, dest)
    else:
        _copy_file(source, dest)


def _copy_file(source: Path, dest: Path) -> None:
    """Copy, flush, then read the copy back: a write the disk only pretended to take (or a short
    one) is caught by the size and sha256, not by the next model load."""
    digest, size = hashlib.sha256(), 0
    with open(source, "rb") as src, open(dest, "xb") as out:
        while block := src.read(_CHUNK):
            out.write(block)
            digest.update(block)
            size += len(block)
        out.flush()
        os.fsync(out.fileno())
    copied_size, copied = _size_and_sha256(dest)
    if (copied_size, copied) != (size, digest.hexdigest()):
        raise OSError(f"the copy of {source.name} does not match the original ({copied_size} of {size} bytes)")
    shutil.copystat(source, dest)  # the mtime too, so the file's verified record still vouches for it


def _size_and_sha256(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def _same_file_content(a: Path, b: Path) -> bool:
    try:
        if not (a.is_file() and b.is_file()) or a.is_symlink() or b.is_symlink():
            return False
        return a.stat().st_size == b.stat().st_size and _size_and_sha256(a) == _size_and_sha256(b)
    except OSError:
        return False


def _remove(path: Path, missing_ok: bool = False) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif not missing_ok or os.path.lexists(path):
        os.unlink(path)
