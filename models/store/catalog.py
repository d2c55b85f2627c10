"""The model catalog: the built-in models plus the user's own ONNX files, registered by path.

bpy-free. The user entries are saved to and loaded from a JSON file (``user_models.json`` in the
models folder; see models/store/library.py) so Blender and the command line see the same list.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ...runtime.errors import LeanImageError, ModelFileError, user_path
from .. import families, files
from .builtin_models import BUILTIN_ENTRIES
from .catalog_entry import CatalogEntry

USER_MODELS_FORMAT = 2

# Format 1 saved every family default under "preprocess", including keys no code ever read; they
# are dropped when such a file is loaded, so models registered before still load.
_RETIRED_SETTINGS = frozenset(
    {
        "channels",
        "rescale",
        "resample",
        "output",
        "postprocess",
        "input_dtype",
        "fixed_input",
        "outputs",
        "focal_reference_px",
        "sky_threshold",
        "principal_point",
        "scale",
        "tile",
        "pad_mode",
    }
)


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:40] or "model"


def register_user_model(
    family: str,
    path: str | os.PathLike,
    *,
    title: str | None = None,
    settings: Mapping[str, Any] | None = None,
) -> CatalogEntry:
    """Make a catalog entry for the user's own ONNX file (any 4x SR model, another BEN2 export...).

    The file must exist now. Nothing is copied: the entry points at the file where it lies.
    ``settings`` override the family's defaults for user models (checked like any entry's).
    """
    record = families.get(family)
    p = user_path(path)
    try:
        p = p.resolve()
    except OSError:
        p = p.absolute()
    if not p.is_file():
        raise ModelFileError(
            f"Cannot register {str(p)!r} as a {record.title} model: there is no file at that path. "
            "Pick the .onnx file itself (not its folder)."
        )
    digest = hashlib.sha1(str(p).encode("utf-8")).hexdigest()[:8]
    return CatalogEntry(
        id=f"user-{family}-{_slug(p.stem)}-{digest}",
        family=family,
        variant="user",
        title=title or f"{p.stem} (your model)",
        filename=p.name,
        url=None,
        size_bytes=None,
        sha256=None,
        license="user-supplied (check the model's own terms)",
        source=f"user file {p}",
        settings={**record.user_defaults, **(settings or {})},
        notes="Registered by path; not downloaded or checksummed by the add-on.",
        path=str(p),
    )


def _upgrade_format_1(item: Mapping[str, Any]) -> dict[str, Any]:
    item = dict(item)
    old = item.pop("preprocess", None) or {}
    item["settings"] = {k: v for k, v in old.items() if k not in _RETIRED_SETTINGS}
    return item


def downloadable() -> tuple[CatalogEntry, ...]:
    """The built-in table's entries, then those of every registered family's own record (a family
    from outside the add-on brings its downloads in its ``Family.downloads``)."""
    own = (CatalogEntry.from_dict({**fields, "family": family.id}) for family in families.ALL for fields in family.downloads)
    return BUILTIN_ENTRIES + tuple(own)


class Catalog:
    """Built-in entries (:func:`downloadable`) plus the user's registered models. Safe to share
    between threads."""

    def __init__(self, builtin: Iterable[CatalogEntry] | None = None, user: Iterable[CatalogEntry] = ()):
        self._lock = threading.RLock()
        self._builtin: dict[str, CatalogEntry] = {}
        for entry in downloadable() if builtin is None else builtin:
            if entry.id in self._builtin:
                raise ValueError(f"duplicate built-in catalog id {entry.id!r}")
            self._builtin[entry.id] = entry
        self._user: dict[str, CatalogEntry] = {}
        for entry in user:
            self._put_user(entry)

    def _put_user(self, entry: CatalogEntry) -> None:
        if entry.id in self._builtin:
            raise ValueError(f"user model id {entry.id!r} clashes with a built-in entry")
        if not entry.is_user:
            raise ValueError(f"entry {entry.id!r} has no path; only path-registered models can be user models")
        self._user[entry.id] = entry

    def get(self, id: str) -> CatalogEntry:
        with self._lock:
            entry = self._builtin.get(id) or self._user.get(id)
        if entry is None:
            raise KeyError(f"no model with id {id!r} in the catalog")
        return entry

    def __contains__(self, id: object) -> bool:
        with self._lock:
            return id in self._builtin or id in self._user

    def entries(self, family: str | None = None) -> list[CatalogEntry]:
        if family is not None:
            families.get(family)  # an unknown family is an error, not an empty list
        with self._lock:
            everything = [*self._builtin.values(), *self._user.values()]
        return [e for e in everything if family is None or e.family == family]

    def user_entries(self) -> list[CatalogEntry]:
        with self._lock:
            return list(self._user.values())

    def add_user_model(
        self,
        family: str,
        path: str | os.PathLike,
        *,
        title: str | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> CatalogEntry:
        entry = register_user_model(family, path, title=title, settings=settings)
        with self._lock:
            self._put_user(entry)
        return entry

    def remove_user_model(self, id: str) -> CatalogEntry:
        """Forget a user model (the file itself is left alone)."""
        with self._lock:
            if id in self._builtin:
                raise ValueError(f"{id!r} is a built-in model; only user models can be removed")
            try:
                return self._user.pop(id)
            except KeyError:
                raise KeyError(f"no user model with id {id!r}") from None

    # -- persistence of user entries ------------------------------------------------------

    def user_models_json(self) -> str:
        with self._lock:
            payload = {"format": USER_MODELS_FORMAT, "user_models": [e.to_dict() for e in self._user.values()]}
        return json.dumps(payload, indent=2, sort_keys=True)

    def save_user_models(self, path: str | os.PathLike) -> Path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        return files.write_text(target, self.user_models_json())

    def load_user_models(self, path: str | os.PathLike, *, replace: bool = True) -> list[CatalogEntry]:
        """Read user entries saved by :meth:`save_user_models`. A missing file loads nothing.

        Entries whose file has since disappeared are still loaded (the UI shows them as
        missing). Anything else that is wrong with the file (not JSON, another shape, a newer
        format, an unknown or ill-typed field or setting, a duplicate id), or a folder that cannot
        be read, is a LeanImageError that names the file and the problem: never an empty list.
        With ``replace`` the current user entries are dropped first.
        """
        source = Path(path)
        text = _read_store(source)
        if text is None:
            if replace:
                with self._lock:
                    self._user.clear()
            return []
        try:
            loaded = _parse_store(text)
            staged = Catalog(builtin=self._builtin.values(), user=loaded)  # clashes, before any change
        except _NewerFormat as newer:
            raise LeanImageError(
                f"The saved user models in {str(source)!r} are format {newer.version}, written by a newer "
                f"version of the add-on (this one reads formats 1 and {USER_MODELS_FORMAT}). Update the "
                "add-on, or point it at another models folder; the file was left as it is."
            ) from None
        except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
            problem = "nested too deeply to be a list of models" if isinstance(exc, RecursionError) else exc
            raise LeanImageError(
                f"Could not read the saved user models from {str(source)!r}: {problem}. "
                "Fix or delete that file, then register your models again."
            ) from None
        with self._lock:
            if replace:
                self._user.clear()
            for entry in staged.user_entries():
                self._put_user(entry)
        return loaded


def _read_store(source: Path) -> str | None:
    """The saved list's text; None when there is none. The folder's own problems (not a folder,
    not traversable, a link loop) are errors naming it, not "no saved models"."""
    try:
        data = source.read_bytes()
    except FileNotFoundError:
        if source.parent.is_dir():
            return None
        if not os.path.lexists(source.parent) and not _under_a_file(source.parent):
            return None  # a models folder that is not made yet holds nothing
        raise _not_a_folder(source.parent) from None
    except NotADirectoryError:
        raise _not_a_folder(source.parent) from None
    except IsADirectoryError:
        raise LeanImageError(
            f"{str(source)!r} is a folder, but the add-on keeps its list of your models in a file of "
            "that name: move that folder away."
        ) from None
    except PermissionError:
        raise LeanImageError(
            f"Permission denied reading {str(source)!r}: this user may not open the models folder "
            f"{str(source.parent)!r} or the file in it. Give your user read access to them, or "
            "choose another models folder."
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LeanImageError(
                f"Cannot read the saved user models from {str(source)!r}: the models folder is a "
                "symbolic link that leads back to itself (a link loop). Point the link at a real "
                "folder, or choose another models folder."
            ) from None
        raise LeanImageError(
            f"Cannot read the saved user models from {str(source)!r}: {exc.strerror or exc}. Check "
            "the models folder, or choose another one."
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LeanImageError(
            f"Could not read the saved user models from {str(source)!r}: it is not UTF-8 text ({exc.reason} "
            f"at byte {exc.start}). Fix or delete that file, then register your models again."
        ) from None


def _not_a_folder(folder: Path) -> LeanImageError:
    return LeanImageError(
        f"The models folder {str(folder)!r} is not a folder (a file, or a path through one): choose a "
        "folder for your models."
    )


def _under_a_file(folder: Path) -> bool:
    for parent in folder.parents:
        if os.path.lexists(parent):
            return not parent.is_dir()
    return False


def _store_format(version) -> int:
    """The file's format number: one this version reads, or _NewerFormat / ValueError."""
    if isinstance(version, int) and not isinstance(version, bool) and version > USER_MODELS_FORMAT:
        raise _NewerFormat(version)
    if version not in (1, USER_MODELS_FORMAT) or isinstance(version, bool):
        raise ValueError(f"expected format {USER_MODELS_FORMAT}, got {version!r}")
    return version


def _parse_store(text: str) -> list[CatalogEntry]:
    payload = json.loads(text)
    if not isinstance(payload, dict):
        raise ValueError(f"expected a JSON object with 'format' and 'user_models', found a {type(payload).__name__}")
    version = _store_format(payload.get("format"))
    unknown = sorted(set(payload) - {"format", "user_models"})
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(map(repr, unknown))} beside 'format' and 'user_models'")
    items = payload.get("user_models", [])
    if not isinstance(items, list):
        raise ValueError(f"'user_models' must be a list, found a {type(items).__name__}")
    for number, item in enumerate(items, 1):
        if not isinstance(item, dict):
            raise ValueError(f"model {number} must be a JSON object, found a {type(item).__name__}")
    if version == 1:
        items = [_upgrade_format_1(item) for item in items]
    entries = [CatalogEntry.from_dict(item) for item in items]
    seen: set[str] = set()
    for entry in entries:
        if entry.id in seen:
            raise ValueError(f"the id {entry.id!r} is there twice")
        seen.add(entry.id)
    return entries


class _NewerFormat(ValueError):
    def __init__(self, version: int):
        super().__init__(version)
        self.version = version


__all__ = ["BUILTIN_ENTRIES", "USER_MODELS_FORMAT", "Catalog", "CatalogEntry", "register_user_model"]
