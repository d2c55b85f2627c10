"""The model library: where models live, which are installed, and which file a job uses (bpy-free).

Blender's preferences, the operators and the command line all ask this module; none of them keeps
model state of its own.

Models folder, first that is set: the front-end's explicit choice (Blender's "Models Folder"
preference, the CLI's ``--models-dir``); ``$LEAN_IMAGE_AI_MODELS_DIR``; one per-user data folder
that Blender and the command line share (runtime/paths.py), outside the extension's own folder so
that uninstalling or updating the add-on keeps the models. A library left in an older default
folder (the extension's user folder) is moved there once (:func:`migrate_models`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...runtime import load_errors, parse_device
from ...runtime.errors import LeanImageError, ModelFileError, user_path
from ...runtime.providers import DEVICE_BY_KIND
from .. import families
from . import install_lock, installer, migrate, models_folder
from .catalog import Catalog, CatalogEntry
from .migrate import MIGRATED_NOTE  # noqa: F401 - the note's name, for the front-ends
from .models_folder import MODELS_DIR_ENV, models_dir, shared_models_dir  # noqa: F401 (re-exported)

USER_MODELS_FILE = "user_models.json"
PREFERENCES_HINT = "Preferences > Add-ons > Lean Image AI"
_named = models_folder.named  # one record of named folders (models_folder.py)


def migrate_models(old: Path, new: Path) -> list[str]:
    """Move what an older default models folder holds into ``new``, whole or not at all
    (models/store/migrate.py); returns the names left behind, each explained in its
    ``MOVED_TO.txt``."""
    left = migrate.migrate_models(old, new)
    _catalogs.pop(str(Path(new) / USER_MODELS_FILE), None)
    return left


# ---- the catalog of one models folder ---------------------------------------------------------

# One Catalog per models folder, reloaded when its user_models.json changes on disk.
_catalogs: dict[str, tuple[Any, Catalog, str | None]] = {}


def _mtime_ns(path: Path):
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def catalog(folder: Path) -> Catalog:
    """The built-in models plus the user's registered ONNX files saved in ``folder``."""
    store = Path(folder) / USER_MODELS_FILE
    stamp = _mtime_ns(store)
    cached = _catalogs.get(str(store))
    if cached is not None and cached[0] == stamp:
        return cached[1]
    loaded, error = Catalog(), None
    try:
        loaded.load_user_models(store)
    except LeanImageError as exc:  # a broken JSON must not hide the built-in models
        error = str(exc)
    _catalogs[str(store)] = (stamp, loaded, error)
    return loaded


def catalog_error(folder: Path) -> str | None:
    """Why the saved user models in ``folder`` could not be read (None when they could)."""
    cached = _catalogs.get(str(Path(folder) / USER_MODELS_FILE))
    return cached[2] if cached is not None else None


@contextlib.contextmanager
def editing_catalog(folder: Path) -> Iterator[Catalog]:
    """The user models of ``folder`` to change, read fresh under the list's lock and saved when the
    block ends: the one way to change ``user_models.json`` (Blender's Register and Remove, the
    CLI's ``models register``/``remove``), so two processes adding at once both keep their entry.
    A list that cannot be read is an error, never overwritten with only this change."""
    store = Path(folder) / USER_MODELS_FILE
    store.parent.mkdir(parents=True, exist_ok=True)
    with install_lock.edit_lock(store, f"the list of your models in {str(folder)!r}"):
        fresh = Catalog()
        fresh.load_user_models(store)
        yield fresh
        save_catalog(fresh, folder)


def save_catalog(saved: Catalog, folder: Path) -> Path:
    """Persist ``saved``'s user models in ``folder``; returns the file written."""
    store = saved.save_user_models(Path(folder) / USER_MODELS_FILE)
    _catalogs[str(store)] = (_mtime_ns(store), saved, None)
    return store


# ---- installed state ----------------------------------------------------------------------------

# USABLE states count as installed for the model menus (an unverified file is checked against its
# sha256 when it is installed or verified).
INSTALLED, UNVERIFIED, MISSING, PARTIAL, WRONG_SIZE, USER_FILE, USER_FILE_MISSING = (
    "installed",
    "unverified",
    "missing",
    "partial",
    "wrong_size",
    "user_file",
    "user_file_missing",
)
USABLE = frozenset({INSTALLED, UNVERIFIED, USER_FILE})


def status(entry: CatalogEntry, folder: Path) -> str:
    """Installed state without hashing anything (menus call this on every redraw)."""
    dest = installer.model_path(entry, folder)
    if entry.is_user:
        return USER_FILE if dest.is_file() else USER_FILE_MISSING
    try:
        st = dest.stat()
    except OSError:
        return PARTIAL if installer.part_path(entry, folder).is_file() else MISSING
    if entry.size_bytes is not None and st.st_size != entry.size_bytes:
        return WRONG_SIZE
    if entry.sha256 is None:
        return INSTALLED
    return INSTALLED if installer.is_verified(entry, folder) else UNVERIFIED


def installed_entries(family: str, folder: Path) -> list[CatalogEntry]:
    """Entries of ``family`` whose file is there (catalog order: built-ins, then the user's)."""
    return [e for e in catalog(folder).entries(family) if status(e, folder) in USABLE]


def fetch(entry: CatalogEntry, folder: Path, *, progress=None, cancel=None, chunk_size=None) -> Path:
    """Download ``entry`` (resuming), or only verify a file already in place when it cannot be
    downloaded; returns the installed file."""
    if status(entry, folder) == UNVERIFIED and entry.url is None:
        return installer.verify_installed(entry, folder, cancel=cancel)
    kwargs = {} if chunk_size is None else {"chunk_size": chunk_size}
    return installer.install(entry, folder, progress=progress, cancel=cancel, **kwargs)


# ---- which model a job uses ---------------------------------------------------------------------


@dataclass
class ModelChoice:
    path: str
    title: str
    entry: CatalogEntry | None
    settings: dict[str, Any] = field(default_factory=dict)
    note: str = ""  # how the installed file is vouched for, when the catalog has no checksum
    # the models folder of an entry whose sha256 is still to be checked: resolving only reads, the
    # job's first run hashes (and records the hash beside the file) through :meth:`verify`
    unverified_in: str = ""

    def describe(self) -> str:
        return f"{self.path} ({self.note})" if self.note else self.path

    def adapter_kwargs(self, family: str, **option_values) -> dict[str, Any]:
        return families.get(family).adapter_kwargs(self.settings, **option_values)

    def verify(self) -> None:
        """Hash the file once if it was chosen unverified (seconds for a multi-GB model: call it on
        a worker, never on Blender's main thread); raises ModelFileError when it does not match."""
        if self.unverified_in and self.entry is not None:
            installer.verify_installed(self.entry, self.unverified_in)
            self.note = installer.trust_note(self.entry, self.unverified_in) or self.note
            self.unverified_in = ""


def names_a_file(model: str, known: Catalog) -> bool:
    """The one rule for "is this model a file or a catalog id?" (``--model``, the leak check,
    Blender's Model field): an id the catalog knows is that model; anything else that looks like a
    path (a folder separator, an ``.onnx`` suffix, or something at that path) is a file; the rest is
    an id the catalog does not know (an error naming it)."""
    if model in known:
        return False
    return os.sep in model or "/" in model or model.lower().endswith(".onnx") or os.path.lexists(model)


def resolve(family: str, folder: Path, model_id: str = "", model_path: str = "", *, device: str = "auto") -> ModelChoice:
    """``model_path``, else ``model_id`` (a catalog id, or a file by :func:`names_a_file`), else
    the family default: the first installed entry of the family (the user's registered models
    included; off CUDA an fp32 export before an fp16 one, see `prefer_for_device`), else the
    family's embedded fallback model. Raises ModelFileError saying what to install, and where.
    A read: nothing is written. A file not hashed since it last changed is taken on its size
    alone and hashed by :meth:`ModelChoice.verify` when the job first runs it (a worker)."""
    record = families.get(family)
    known = catalog(folder)
    error = catalog_error(folder)
    if error:  # another model than the one the user's list names would be a silent substitute
        source = _named.get(str(folder))
        raise ModelFileError(f"{error} (That folder is named by {source}.)" if source else error)
    if model_id and not model_path and names_a_file(model_id, known):
        model_id, model_path = "", model_id
    if not model_path:
        _check_named_folder(Path(folder))
    if model_path:
        return _by_path(record, known, folder, model_path)
    if model_id:
        return _by_id(record, known, folder, model_id)
    return _default(record, known, folder, device)


def _by_path(record, known: Catalog, folder: Path, model_path: str) -> ModelChoice:
    """A model file the user named: the registered entry of that file when there is one."""
    path = user_path(model_path)
    if not os.path.lexists(path):
        raise ModelFileError(
            f"Model file not found: '{path}'. Check model_path, or leave it empty to use the "
            f"installed {record.title} model."
        )
    load_errors.model_identity(path)  # a folder, pipe, device, link loop or no permission: said so
    entry = next((e for e in known.entries(record.id) if e.path and _same_file(e.path, path)), None)
    if entry is not None:
        return _choice(str(path), entry, folder)
    return ModelChoice(str(path), path.name, None, dict(record.user_defaults))


def _by_id(record, known: Catalog, folder: Path, model_id: str) -> ModelChoice:
    try:
        entry = known.get(model_id)
    except KeyError:
        raise ModelFileError(
            f"Unknown model '{model_id}': it is neither a built-in model nor one of your "
            f"registered models. See the model list in {PREFERENCES_HINT}."
        ) from None
    if entry.family != record.id:
        other = families.get(entry.family).title
        raise ModelFileError(
            f"'{entry.title}' is a {other} model, not a {record.title} model. "
            f"Pick a {record.title} model."
        )
    if not _installed(entry, folder):
        raise ModelFileError(_not_installed(entry, folder))
    return _choice(str(installer.model_path(entry, folder)), entry, folder)


def _default(record, known: Catalog, folder: Path, device: str) -> ModelChoice:
    """The family's first installed entry, else its embedded fallback; else what to install."""
    entries = known.entries(record.id)
    for entry in prefer_for_device(entries, device):
        if _installed(entry, folder):
            return _choice(str(installer.model_path(entry, folder)), entry, folder)
    if record.fallback_model is not None:
        return ModelChoice(str(record.fallback_model), record.fallback_model.name, None, {})
    suggestion = next((e for e in entries if e.downloadable), entries[0] if entries else None)
    raise ModelFileError(
        f"No {record.title} model is installed. Install one in {PREFERENCES_HINT}"
        + (f" (for example '{suggestion.title}')" if suggestion else "")
        + f" or with `python -m lean_image_ai models install {suggestion.id if suggestion else 'ID'}`"
        + f" (`models list` shows them; `models register {record.command or record.id} FILE` adds your own ONNX file),"
        + f" or give the model file (model_path; command line: --model). Models folder: {folder}."
    )


def prefer_for_device(entries, device: str = "auto") -> list[CatalogEntry]:
    """`entries` in the order a default is picked for `device`: on CPU (anything but CUDA, "auto"
    included: without a GPU it runs on CPU) fp16-weight files last, since ORT's CPU provider has
    no fp16 kernel for most ops and casts back (BEN2 fp16: 1.22x slower, +0.86 GB peak); on CUDA
    the catalog's order. Stable otherwise."""
    row = DEVICE_BY_KIND.get(parse_device(device).kind)  # the runtime's rule: " CUDA:1 " and a DeviceRequest too
    if row is not None and row.prefers_fp16:
        return list(entries)
    return sorted(entries, key=lambda entry: entry.weight_dtype == "float16")


def _installed(entry: CatalogEntry, folder: Path) -> bool:
    return status(entry, folder) in USABLE  # a stat: the hash is the job's (ModelChoice.verify)


def _check_named_folder(folder: Path) -> None:
    source = _named.get(str(folder))
    if source is None or folder.is_dir():
        return
    what = "does not exist" if not os.path.lexists(folder) else "is not a folder"
    raise ModelFileError(
        f"The models folder {str(folder)!r} ({source}) {what}, so no model can be found there. "
        f"Create it (models are installed into it), or name the folder that holds your models."
    )


def _choice(path: str, entry: CatalogEntry, folder: Path) -> ModelChoice:
    settings = json.loads(json.dumps(dict(entry.settings)))
    unverified = str(folder) if not entry.is_user and installer.hash_due(entry, folder) else ""
    return ModelChoice(path, entry.title, entry, settings, installer.trust_note(entry, folder) or "", unverified)


def _not_installed(entry: CatalogEntry, folder: Path) -> str:
    if entry.is_user:
        return (
            f"Model '{entry.title}' ({entry.id}) is registered but its file '{entry.path}' is missing. "
            f"Put the file back, or register it again in {PREFERENCES_HINT}."
        )
    return (
        f"Model '{entry.title}' ({entry.id}) is not installed. Install it in {PREFERENCES_HINT} "
        f"or with `python -m lean_image_ai models install {entry.id}` (it goes to '{installer.model_path(entry, folder)}')."
    )


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


# ---- registering and removing ---------------------------------------------------------------


def tensor_summary(infos) -> str:
    """``name 1x3x?x? float, ...``: a model's inputs or outputs in one line."""
    def dims(shape):
        return "x".join("?" if d is None or isinstance(d, str) else str(d) for d in shape)

    return ", ".join(f"{t.name} {dims(t.shape)} {t.type.removeprefix('tensor(').rstrip(')')}" for t in infos)


def remove(entry: CatalogEntry, folder: Path, runtime=None) -> bool:
    """Delete an installed model's file; ``runtime``'s open sessions of it are dropped first, since
    an open session keeps the file busy on Windows (the command line's runtime; Blender has none:
    its operator asks the model worker to unload first). False when there was nothing to delete."""
    dest = installer.model_path(entry, folder)
    for handle in runtime.cached_sessions() if runtime is not None else ():
        if handle.model_path == dest.resolve():
            runtime.evict(handle, reason="model removed")
    return installer.remove(entry, folder)


def format_bytes(count) -> str:
    if count is None:
        return "?"
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= factor:
            return f"{count / factor:.1f} {unit}"
    return f"{count} B"


def format_size(entry: CatalogEntry) -> str:
    """The file's size, and its weights' dtype where the catalog knows it (the panel's line)."""
    if entry.size_bytes is not None:
        size = format_bytes(entry.size_bytes)
    elif entry.approx_size_bytes is not None:
        size = "~" + format_bytes(entry.approx_size_bytes)
    else:
        size = "size unknown"
    dtype = {"float16": "fp16 weights (slower on CPU)", "float32": "fp32 weights"}.get(entry.weight_dtype or "")
    return f"{size}, {dtype}" if dtype else size


__all__ = ["MODELS_DIR_ENV", "ModelChoice", "catalog", "migrate_models", "models_dir", "resolve", "status"]
