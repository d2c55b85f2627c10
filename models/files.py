"""The one way the add-on writes a file: all or nothing.

Every file the add-on writes (the user-model list, a verified download, an installer sidecar, a
CLI result, an image Blender saves) goes through :func:`atomic_path`: the content is written to a
temporary file in the target's own folder (so the final rename never crosses file systems),
flushed to disk, given the permission bits the target should have, and renamed over the target.
A failure at any step removes the temporary file and leaves an existing target untouched.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

_umask_lock = threading.Lock()


def _process_umask() -> int:
    # The only portable way to read the umask is to set it and put it back; the lock keeps two
    # threads of this module from seeing each other's temporary value.
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def _target_mode(target: Path) -> int:
    """An existing file keeps its permission bits; a new one gets what ``open()`` would give it."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        return 0o666 & ~_process_umask()


def fsync_file(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def _fsync_folder(folder: Path) -> None:
    # Makes the rename itself durable on POSIX; Windows cannot open a folder this way.
    if os.name == "nt":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_TEMP_TOKEN_BYTES = 6


def temp_path_for(target: Path) -> Path:
    """A hidden, unique name beside ``target`` that keeps its suffix (writers pick formats by it)."""
    return target.with_name(f".{target.name}.{secrets.token_hex(_TEMP_TOKEN_BYTES)}.tmp{target.suffix}")


def leftover_temps(target: str | os.PathLike) -> list[Path]:
    """The temporary files of :func:`temp_path_for` beside ``target``: what a writer killed
    outright (SIGKILL, power loss) leaves, since its ``finally`` never ran. Only a caller that
    knows no writer of ``target`` is still alive may delete them (the farm runner, after the
    worker that held the frame died)."""
    target = Path(target)
    name = re.compile(
        re.escape(f".{target.name}.") + f"[0-9a-f]{{{2 * _TEMP_TOKEN_BYTES}}}" + re.escape(f".tmp{target.suffix}")
    )
    try:
        return sorted(p for p in target.parent.iterdir() if name.fullmatch(p.name))
    except OSError:  # the folder is gone or unreadable: nothing of ours to find there
        return []


_ANY_TEMP = re.compile(rf"\.(?P<name>.+)\.[0-9a-f]{{{2 * _TEMP_TOKEN_BYTES}}}\.tmp(?P<suffix>.*)")


def remove_stale_temps(targets, older_than: float) -> list[Path]:
    """Delete the temporary files of :func:`temp_path_for` for ``targets`` last changed before
    ``older_than`` (a run's start, as ``time.time()``): what an earlier writer of these very
    outputs left when it was killed. Only those names are touched; each folder is listed once."""
    by_folder: dict[Path, set[str]] = {}
    for target in targets:
        target = Path(target)
        by_folder.setdefault(target.parent, set()).add(target.name)
    removed = []
    for folder, names in by_folder.items():
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            match = _ANY_TEMP.fullmatch(entry.name)
            if not match or match["name"] not in names or match["suffix"] != Path(match["name"]).suffix:
                continue
            try:
                if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < older_than:
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
            except OSError:  # gone already (another task cleaned it), or not ours to remove
                continue
    return removed


def replace_into(written: Path, target: Path) -> None:
    """Move a completely written file over ``target`` durably, with ``target``'s permission bits."""
    mode = _target_mode(target)
    fsync_file(written)
    os.chmod(written, mode)
    os.replace(written, target)
    _fsync_folder(target.parent)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write ``target``'s new content to; commit it when the block ends.

    The block must create the file at the yielded path. An exception inside the block, or a
    missing or empty file, leaves ``target`` as it was and removes the temporary file.
    """
    target = Path(target)
    tmp = temp_path_for(target)
    try:
        yield tmp
        if not tmp.is_file() or tmp.stat().st_size == 0:
            raise OSError(f"nothing was written for '{target}'")
        replace_into(tmp, target)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_bytes(target: str | os.PathLike, data: bytes) -> Path:
    target = Path(target)
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return target


def write_text(target: str | os.PathLike, text: str) -> Path:
    return write_bytes(target, text.encode("utf-8"))


def remove_if_present(path: Path) -> bool:
    """Delete ``path``; False when there was nothing to delete."""
    try:
        Path(path).unlink()
        return True
    except FileNotFoundError:
        return False
