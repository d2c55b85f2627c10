"""Download, verify and install catalog models (stdlib ``urllib`` only: Blender has no requests).

bpy-free and free of global state, so :func:`install` can run in a worker thread. A download
goes to ``<file>.part`` and is resumed with an HTTP Range request next time; it is checked
against the catalog's size and sha256 (where known) and only then renamed into place with
``os.replace``. A small ``<file>.verified.json`` sidecar remembers what was verified, so
:func:`is_installed` does not re-hash a 1 GB file on every run (only when its size, mtime, ctime
or inode changed: models/store/verified_record.py).

Two installs of the same entry into the same folder at the same time (two Blender processes or
farm nodes sharing a models folder) take turns on a cross-process lock (models/store/install_lock.py):
the second waits, then finds the model installed; when the wait runs out it says that another
process is installing it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...runtime.errors import (
    ModelContractError,
    ModelFileError,
    ModelInstallError,
    first_line,
)
from .. import families, files
from . import model_check
from .catalog_entry import CatalogEntry
from .transfer.part_files import discard_part
from .transfer.transfer_limits import TransferLimits, size_floor
from .verified_record import FIRST_USE, read_record, record_vouches, sha256_file, unchanged, write_record

if TYPE_CHECKING:  # download.py and its watch thread load only where a download runs (a child process)
    from .transfer.download import CancelCallback, ProgressCallback
from .install_lock import install_lock

DEFAULT_CHUNK_SIZE = 1 << 20  # 1 MiB
SIDECAR_SUFFIX = ".verified.json"
PART_SUFFIX = ".part"
DEFAULT_LOCK_WAIT = 3600.0  # another process's download of a large model can take that long
USER_RECORDS_DIR = "user-files"  # the verification records of the user's registered files



# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------


def model_path(entry: CatalogEntry, models_dir: str | os.PathLike) -> Path:
    """Where the entry's file lives: the user's own path, or ``models_dir / entry.filename``."""
    if entry.path is not None:
        return Path(entry.path)
    return Path(models_dir) / entry.filename


def _record_base(entry: CatalogEntry, models_dir: str | os.PathLike) -> Path:
    """What the add-on's own files about ``entry`` are named after. A downloaded model's lie beside
    it; a user's file is never touched beside its own path (that folder is the user's): its
    records go to ``models_dir/user-files``, keyed by the file's absolute path."""
    if entry.path is None:
        return model_path(entry, models_dir)
    where = os.path.abspath(os.path.expanduser(entry.path))
    key = hashlib.sha256(os.fsencode(where)).hexdigest()[:16]
    return Path(models_dir) / USER_RECORDS_DIR / f"{Path(where).name}-{key}"


def part_path(entry: CatalogEntry, models_dir: str | os.PathLike) -> Path:
    base = _record_base(entry, models_dir)
    return base.with_name(base.name + PART_SUFFIX)


def sidecar_path(entry: CatalogEntry, models_dir: str | os.PathLike) -> Path:
    base = _record_base(entry, models_dir)
    return base.with_name(base.name + SIDECAR_SUFFIX)


# --------------------------------------------------------------------------------------------
# Installed-state queries
# --------------------------------------------------------------------------------------------


def verify_installed(
    entry: CatalogEntry,
    models_dir: str | os.PathLike,
    *,
    cancel: CancelCallback | None = None,
) -> Path:
    """Return the model's path if it is present and matches the catalog, else raise ModelFileError.

    Size is checked every time (a ``stat``). The sha256 (when the catalog knows it) is taken from
    the ``.verified.json`` sidecar as long as the file's size, mtime, ctime and inode still match
    it, and is re-computed only when one changed or the sidecar is missing.
    """
    dest = model_path(entry, models_dir)
    try:
        st = dest.stat()
    except FileNotFoundError:
        raise ModelFileError(
            f"{entry.title} is not installed: no file at {str(dest)!r}. "
            + (
                "Install it from the add-on preferences, or download it yourself and save it there."
                if entry.url
                else "Download or export it yourself and save it there, or register your own file by path."
            )
        ) from None
    except OSError as exc:
        raise ModelFileError(f"{entry.title}: cannot read {str(dest)!r}: {exc}") from exc
    if not dest.is_file():
        raise ModelFileError(f"{entry.title}: {str(dest)!r} is not a file.")
    if entry.size_bytes is not None and st.st_size != entry.size_bytes:
        raise ModelFileError(
            f"{entry.title}: {str(dest)!r} has {st.st_size} bytes, expected {entry.size_bytes}. "
            "The file is incomplete or a different version; remove it and install again."
        )
    sidecar = sidecar_path(entry, models_dir)
    if entry.sha256 is None:
        return _verify_against_first_install(entry, dest, st, sidecar, cancel)
    if record_vouches(entry, st, sidecar):
        return dest
    got = sha256_file(dest, cancel=cancel)
    if got != entry.sha256:
        raise ModelFileError(
            f"{entry.title}: {str(dest)!r} has sha256 {got}, expected {entry.sha256}. "
            "The file is damaged or a different version; remove it and install again."
        )
    write_record(entry, dest, sidecar, got, hashed=st)
    return dest


def _verify_against_first_install(
    entry: CatalogEntry, dest: Path, st: os.stat_result, sidecar: Path, cancel: CancelCallback | None
) -> Path:
    """No catalog checksum: a file that changed since it was installed must still have the sha256
    recorded then (a file dropped in by hand, with no record, is taken as it is)."""
    recorded = read_record(sidecar)
    if recorded is None or not recorded.get("sha256"):
        return dest
    if unchanged(recorded, st):
        return dest
    got = sha256_file(dest, cancel=cancel)
    if got != recorded["sha256"]:
        raise ModelFileError(
            f"{entry.title}: {str(dest)!r} changed since it was installed (sha256 {got}, "
            f"recorded at install {recorded['sha256']}). The catalog has no checksum for this "
            "model, so the change cannot be checked: remove it and install again, or register "
            "your own file by path if you replaced it on purpose."
        )
    write_record(entry, dest, sidecar, got, hashed=st)
    return dest


def hash_due(entry: CatalogEntry, models_dir: str | os.PathLike) -> bool:
    """Whether :func:`verify_installed` would hash the file (no hashing, no writing here): it
    changed since its sha256 was last recorded, or it never was against the catalog's."""
    try:
        st = model_path(entry, models_dir).stat()
    except OSError:
        return False
    sidecar = sidecar_path(entry, models_dir)
    if entry.sha256 is not None:
        return not record_vouches(entry, st, sidecar)
    recorded = read_record(sidecar)
    if recorded is None or not recorded.get("sha256"):
        return False
    return recorded.get("size") != st.st_size or recorded.get("mtime_ns") != st.st_mtime_ns


def is_verified(entry: CatalogEntry, models_dir: str | os.PathLike) -> bool:
    """The file was hashed and matched since it last changed (no hashing here)."""
    try:
        st = model_path(entry, models_dir).stat()
    except OSError:
        return False
    sidecar = sidecar_path(entry, models_dir)
    return record_vouches(entry, st, sidecar)


def is_installed(entry: CatalogEntry, models_dir: str | os.PathLike) -> bool:
    """True if the model file is present and verified (cheap: no re-hash while unchanged)."""
    try:
        verify_installed(entry, models_dir)
    except ModelFileError:
        return False
    return True


def remove(entry: CatalogEntry, models_dir: str | os.PathLike) -> bool:
    """Delete an installed model, its sidecar and any partial download. True if anything went.

    For a user-registered model only the add-on's record of it (in the models folder) goes:
    nothing beside the user's file is touched (unregister it in the catalog instead).
    """
    if entry.is_user:
        return files.remove_if_present(sidecar_path(entry, models_dir))
    removed = files.remove_if_present(model_path(entry, models_dir))
    removed |= files.remove_if_present(sidecar_path(entry, models_dir))
    removed |= discard_part(part_path(entry, models_dir))
    return removed


# --------------------------------------------------------------------------------------------
# Download
# --------------------------------------------------------------------------------------------


def install(
    entry: CatalogEntry,
    models_dir: str | os.PathLike,
    *,
    progress: ProgressCallback | None = None,
    cancel: CancelCallback | None = None,
    timeout: float = 30,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    lock_wait: float = DEFAULT_LOCK_WAIT,
    waiting: Callable[[str], None] | None = None,
    limits: TransferLimits | None = None,
) -> Path:
    """Download ``entry`` into ``models_dir`` (resuming a partial download) and return its path.

    ``progress(done_bytes, total_bytes_or_None)`` is called as bytes arrive (``done_bytes``
    counts resumed bytes too). ``cancel()`` is polled ten times a second (also from another
    thread, which then closes the connection); when it returns True, :class:`OperationCancelled`
    is raised within a second and the ``.part`` file is kept for a later resume. ``limits``: when
    a stalled or endless transfer is given up (models/store/transfer/http_watch.py). Only https is fetched.
    Without a catalog size, the transfer is bounded by a ceiling over the entry's approximate
    size; without a catalog sha256, the file is installed only once it loads in onnxruntime and
    fits its family, and its size and sha256 are recorded as the reference (trust on first use).
    Network and HTTP failures raise :class:`ModelInstallError` naming the URL, what went wrong
    and the exact file path where the model can be saved by hand. A size or checksum mismatch
    deletes the partial file. An already installed, verified model returns at once.

    While another process installs the same file, this one waits up to ``lock_wait`` seconds
    (``waiting(holder)`` is called once when that happens) and then returns the model it
    installed, or raises :class:`ModelInstallError` saying who is installing it.
    """
    if chunk_size <= 0:
        raise ValueError("chunk_size must be positive")
    dest = model_path(entry, models_dir)

    if entry.is_user:
        # A user model is the user's own file: nothing to download.
        return verify_installed(entry, models_dir)
    if entry.url is None:
        raise ModelInstallError(
            f"{entry.title} has no download address in the catalog: no public ONNX file of it "
            f"could be confirmed. Export or download an ONNX version yourself, then either register "
            f"it by path (it can lie anywhere) or save it as {dest.name!r} in the folder "
            f"{str(dest.parent)!r}."
        )

    if is_installed(entry, models_dir):
        size = dest.stat().st_size
        if progress is not None:
            progress(size, size)
        return dest

    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelInstallError(
            f"Cannot create the models folder {str(dest.parent)!r} for {entry.title}: {exc}. "
            "Choose another models folder in the add-on preferences."
        ) from exc

    with install_lock(dest, entry.title, wait=lock_wait, cancel=cancel, waiting=waiting):
        if is_installed(entry, models_dir):  # another process installed it while we waited
            size = dest.stat().st_size
            if progress is not None:
                progress(size, size)
            return dest
        return _download_and_install(entry, models_dir, dest, progress, cancel, timeout, chunk_size, limits)


def _download_and_install(entry, models_dir, dest, progress, cancel, timeout, chunk_size, limits) -> Path:
    from .transfer.download import download_to_part

    part = part_path(entry, models_dir)
    download_to_part(entry, dest, part, progress, cancel, timeout, chunk_size, limits)
    digest = _verify_part(entry, dest, part, cancel)

    # Drop any stale sidecar before the file changes underneath it (keeping what the first
    # install got, so a server that later serves another file shows up in the record).
    first_sha256 = (read_record(sidecar_path(entry, models_dir)) or {}).get("first_sha256")
    files.remove_if_present(sidecar_path(entry, models_dir))
    try:
        files.replace_into(part, dest)
    except OSError as exc:
        raise ModelInstallError(
            f"{entry.title} was downloaded and verified, but moving {str(part)!r} to {str(dest)!r} "
            f"failed: {exc}. If Blender is using the old file, restart it and install again."
        ) from exc
    discard_part(part)  # only its validator record is left
    write_record(entry, dest, sidecar_path(entry, models_dir), digest, first_sha256=first_sha256)
    size = dest.stat().st_size
    if progress is not None:
        progress(size, size)
    return dest


def _verify_part(entry: CatalogEntry, dest: Path, part: Path, cancel: CancelCallback | None) -> str:
    from .transfer.download import install_error, looks_like_text_not_model, manual_hint

    """Check the finished .part against the catalog; delete it on mismatch. Returns its sha256."""
    size = part.stat().st_size
    if entry.size_bytes is not None and size != entry.size_bytes:
        discard_part(part)
        raise ModelInstallError(
            f"Download of {entry.title} from {entry.url} has the wrong size: expected "
            f"{entry.size_bytes} bytes, got {size}. The partial file was deleted. "
            + manual_hint(dest)
        )
    if size == 0:
        discard_part(part)
        raise install_error(entry, dest, "the server sent an empty file")
    with open(part, "rb") as fh:
        head = fh.read(256)
    if looks_like_text_not_model(head):
        discard_part(part)
        raise install_error(entry, dest, "the server sent a web page or a Git LFS pointer, not the model file")
    if entry.size_bytes is None and size < size_floor(entry.approx_size_bytes):
        # the server announced (or sent) far less than this model is: a cut-off, kept to resume
        raise install_error(
            entry,
            dest,
            f"only {size} bytes arrived for a model of about {entry.approx_size_bytes} bytes, so the "
            f"transfer was cut off; the bytes are kept in {str(part)!r} and installing again resumes",
        )
    digest = sha256_file(part, cancel=cancel)
    if entry.sha256 is not None and digest != entry.sha256:
        discard_part(part)
        raise ModelInstallError(
            f"Download of {entry.title} from {entry.url} failed the checksum: expected sha256 "
            f"{entry.sha256}, got {digest}. The partial file was deleted. " + manual_hint(dest)
        )
    if entry.sha256 is None:
        _check_loads(entry, dest, part, size)
    return digest


def _check_loads(entry: CatalogEntry, dest: Path, part: Path, size: int) -> None:
    from .transfer.download import install_error

    """Nothing vouches for these bytes but what they are: they must load in onnxruntime and fit
    the family's contract, or they are deleted and never installed."""
    try:
        model_check.check_family_contract(part, entry.family)
    except (ModelFileError, ModelContractError) as exc:
        discard_part(part)
        title = families.get(entry.family).title
        why = first_line(exc) if isinstance(exc, ModelContractError) else "onnxruntime cannot load it"
        raise install_error(
            entry,
            dest,
            f"the {size} bytes that arrived are not a {title} model ({why}), and the catalog has no "
            "checksum to say otherwise; nothing was kept",
        ) from exc


def trust_note(entry: CatalogEntry, models_dir: str | os.PathLike) -> str | None:
    """For an installed model the catalog has no checksum for: what was recorded at its first
    install ("trust on first use, sha256 ..., N bytes"); None otherwise."""
    if entry.sha256 is not None or entry.is_user:
        return None
    recorded = read_record(sidecar_path(entry, models_dir))
    if not recorded or not recorded.get("first_sha256"):
        return None
    return f"{FIRST_USE}: sha256 {recorded['first_sha256'][:16]}..., {recorded.get('size')} bytes, recorded at install"


__all__ = [
    "install",
    "trust_note",
    "is_installed",
    "model_path",
    "part_path",
    "remove",
    "sha256_file",
    "sidecar_path",
    "verify_installed",
]
