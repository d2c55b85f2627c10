"""The one way the add-on writes a file: all or nothing.

Every file the add-on writes (the user-model list, a verified download, an installer sidecar, a
CLI result, an image Blender saves) goes through :func:`atomic_path`: the content is written to a
temporary file in the target's own folder (so the final rename never crosses file systems),
flushed to disk, given the permission bits the target should have, and renamed over the target.
A failure at any step removes the temporary file and leaves an existing target untouched.

While a writer has its temporary file, it holds an OS lock on it (``flock`` on POSIX; the OS
drops it when the process ends, SIGKILL included): a cleaner that can take the lock knows no live
process is writing it, whatever its age (:func:`remove_stale_temps`). Where no such lock can be
taken (Windows, a file system without ``flock``) the cleaner goes by age, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import stat
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

if os.name != "nt":
    import fcntl

_umask_lock = threading.Lock()


def _process_umask() -> int:
    # The only portable way to read the umask is to set it and put it back; the lock keeps two
    # threads of this module from seeing each other's temporary value.
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def _target_mode(target: Path) -> int:
    """An existing file keeps its permission bits; a new one (or a symbolic link, which the
    result replaces) gets what ``open()`` would give it."""
    try:
        existing = os.lstat(target)
    except OSError:
        existing = None
    if existing is not None and stat.S_ISREG(existing.st_mode):
        return stat.S_IMODE(existing.st_mode)
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
# The longest file name most file systems take (ext4, APFS, NTFS: 255 bytes or UTF-16 units).
NAME_MAX = 255
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # Windows has no symbolic links to follow here
_BINARY = getattr(os, "O_BINARY", 0)


def hidden_key(name: str, tail: str) -> str:
    """What stands for ``name`` in a hidden helper name ``.<key><tail>`` beside it: the name
    itself, or a hash of it when the helper would pass :data:`NAME_MAX` (a legal 250-byte output
    name must not fail after the model ran because its temporary name cannot exist)."""
    if 1 + len(os.fsencode(name)) + len(os.fsencode(tail)) <= NAME_MAX:
        return name
    return "~" + hashlib.sha256(os.fsencode(name)).hexdigest()[:24]


def hidden_beside(target: Path, tail: str) -> Path:
    target = Path(target)
    return target.with_name(f".{hidden_key(target.name, tail)}{tail}")


def _temp_tail(suffix: str, token: str) -> str:
    return f".{token}.tmp{suffix}"


def temp_path_for(target: Path) -> Path:
    """A hidden, unique name beside ``target`` that keeps its suffix (writers pick formats by it)."""
    target = Path(target)
    return hidden_beside(target, _temp_tail(target.suffix, secrets.token_hex(_TEMP_TOKEN_BYTES)))


def _temp_key(target: Path) -> str:
    return hidden_key(target.name, _temp_tail(target.suffix, "0" * 2 * _TEMP_TOKEN_BYTES))


def leftover_temps(target: str | os.PathLike) -> list[Path]:
    """The temporary files of :func:`temp_path_for` beside ``target``: what a writer killed
    outright (SIGKILL, power loss) leaves, since its ``finally`` never ran. Only a caller that
    knows no writer of ``target`` is still alive may delete them (the farm runner, after the
    worker that held the frame died)."""
    target = Path(target)
    name = re.compile(
        re.escape(f".{_temp_key(target)}.") + f"[0-9a-f]{{{2 * _TEMP_TOKEN_BYTES}}}" + re.escape(f".tmp{target.suffix}")
    )
    try:
        return sorted(p for p in target.parent.iterdir() if name.fullmatch(p.name))
    except OSError:  # the folder is gone or unreadable: nothing of ours to find there
        return []


_ANY_TEMP = re.compile(rf"\.(?P<name>.+)\.[0-9a-f]{{{2 * _TEMP_TOKEN_BYTES}}}\.tmp(?P<suffix>.*)")


def _writer_alive(fd: int) -> bool | None:
    """Does a live process hold the writer's lock on this temporary file? None: this file system
    cannot tell (no ``flock``), nor can Windows (where a live writer's file cannot be deleted)."""
    if os.name == "nt":
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until fd is closed
    except BlockingIOError:
        return True
    except OSError:
        return None
    return False


def _remove_unowned(path: str, older_than: float) -> bool:
    """Delete the temporary file at ``path`` when no live process writes it: its writer's lock is
    free, or, where that cannot be told, it last changed before ``older_than``. Never through a
    symbolic link, never anything but a plain file."""
    try:
        fd = os.open(path, os.O_RDWR | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | _BINARY)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        alive = _writer_alive(fd) if stat.S_ISREG(info.st_mode) else True
        if alive or (alive is None and info.st_mtime >= older_than) or not _still_ours(info, Path(path)):
            return False
        if os.name == "nt":  # Windows deletes no file that is open, ours included
            os.close(fd)
            fd = -1
        os.unlink(path)
        return True
    except OSError:  # gone already (another task cleaned it), or not ours to remove
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def remove_stale_temps(targets, older_than: float) -> list[Path]:
    """Delete the temporary files of :func:`temp_path_for` for ``targets`` that no live process
    writes: what an earlier writer of these very outputs left when it was killed. A writer's lock
    tells (:func:`_remove_unowned`); where the file system cannot, only a file last changed before
    ``older_than`` (a time before this run began, as ``time.time()``) is taken for a dead writer's.
    Only those names are touched; each folder is listed once."""
    by_folder: dict[Path, dict[str, str]] = {}  # folder -> {temp key: target suffix}
    for target in targets:
        target = Path(target)
        by_folder.setdefault(target.parent, {})[_temp_key(target)] = target.suffix
    removed = []
    for folder, names in by_folder.items():
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            match = _ANY_TEMP.fullmatch(entry.name)
            if match and names.get(match["name"]) == match["suffix"] and _remove_unowned(entry.path, older_than):
                removed.append(Path(entry.path))
    return removed


def replace_into(written: Path, target: Path) -> None:
    """Move a completely written file over ``target`` durably, with ``target``'s permission bits."""
    mode = _target_mode(target)
    fsync_file(written)
    os.chmod(written, mode)
    os.replace(written, target)
    _fsync_folder(target.parent)


class SwappedTemporaryFile(OSError):
    """The temporary file's name no longer names the file this writer made (another user of a
    shared folder replaced it, with a symbolic link for instance): nothing is installed."""


def _still_ours(made: os.stat_result, path: Path) -> bool:
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(now.st_mode) and (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino)


def _swapped(tmp: Path, target: Path) -> SwappedTemporaryFile:
    return SwappedTemporaryFile(
        f"the temporary file '{tmp}' was replaced by something else while '{target.name}' was being "
        f"written (another user of the folder '{target.parent}'?); '{target.name}' was not written"
    )


def _seal(fd: int, made: os.stat_result, tmp: Path, target: Path) -> None:
    """Give the file behind ``fd`` its final bits and flush it: through ``fd``, never through the
    name, which someone else may have swapped (a chmod by name follows a planted link)."""
    if not _still_ours(made, tmp):
        raise _swapped(tmp, target)
    if os.fstat(fd).st_size == 0:
        raise OSError(f"nothing was written for '{target}'")
    mode = _target_mode(target)
    if hasattr(os, "fchmod"):
        os.fchmod(fd, mode)
    else:  # pragma: no cover - Windows: no fchmod, and no symbolic link in the way of chmod
        os.chmod(tmp, mode)
    os.fsync(fd)


def _install(made: os.stat_result, tmp: Path, target: Path) -> None:
    """Rename the sealed file over ``target``; the name is checked to be that file before the
    rename."""
    if not _still_ours(made, tmp):
        raise _swapped(tmp, target)
    os.replace(tmp, target)
    # a link swapped in between the check and the rename is taken out again (only the kind of
    # entry is checked here: some network file systems renumber a file when it is renamed)
    try:
        installed = stat.S_ISREG(os.lstat(target).st_mode)
    except OSError:
        installed = False
    if not installed:
        with contextlib.suppress(OSError):
            os.unlink(target)
        raise _swapped(tmp, target)
    _fsync_folder(target.parent)


def _lock_for_writer(fd: int) -> bool:
    """Take the writer's lock ("a live process writes this": see the module); False when a
    cleaner holds it (it took the file for a dead writer's). True where no lock can be taken:
    cleaners go by age there."""
    if os.name == "nt":
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def _new_locked_temp(target: Path) -> tuple[Path, int, os.stat_result]:
    """A new temporary file beside ``target``, made (``O_EXCL``) and locked. A cleaner that came
    in the instant between, while no lock was on it yet, has it or has removed it: then another
    name, so no age has to guard that instant."""
    for _ in range(8):
        tmp = temp_path_for(target)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY, 0o600)
        made = os.fstat(fd)
        if _lock_for_writer(fd) and _still_ours(made, tmp):
            return tmp, fd, made
        os.close(fd)  # the cleaner removes it, or has
    raise OSError(f"every temporary file made beside '{target}' was removed at once (another process cleaning the folder?)")


class StagedFile:
    """``target``'s new content written over many calls (a result's file a band per timer call of
    Blender's main thread, where one whole write took 0.2-0.5 s for 186 MB) through :attr:`handle`,
    into a temporary file beside it made and locked as :func:`atomic_path` makes its own;
    :meth:`commit` flushes it to disk and renames it over ``target``. Until then ``target`` is as
    it was, and :meth:`discard`, or the object's end (whatever dropped it: a cancel, an error),
    removes the temporary file."""

    def __init__(self, target: str | os.PathLike):
        self.target = Path(target)
        self.tmp, fd, self._made = _new_locked_temp(self.target)
        self.handle = os.fdopen(fd, "r+b")  # the lock is held until this closes
        self._discard = weakref.finalize(self, _remove_temp, self.handle, self.tmp)

    def commit(self) -> None:
        try:
            self.handle.flush()
            _seal(self.handle.fileno(), self._made, self.tmp, self.target)
            if os.name == "nt":  # Windows renames no open file; elsewhere the lock is held to the rename
                self.handle.close()
            _install(self._made, self.tmp, self.target)
        finally:
            self.discard()

    def discard(self) -> None:
        self._discard()


def _remove_temp(handle, tmp: Path) -> None:
    with contextlib.suppress(OSError):
        handle.close()
    with contextlib.suppress(OSError):
        tmp.unlink()


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write ``target``'s new content to; commit it when the block ends.

    The temporary file is made here, new (``O_EXCL``, never through a symbolic link), private
    until it is complete, and the block writes into it by its name. An exception inside the
    block, an empty file, or a temporary name that no longer names that file leaves ``target``
    as it was and removes the temporary file.
    """
    staged = StagedFile(target)
    try:
        yield staged.tmp
        staged.commit()
    finally:
        staged.discard()


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
