"""The model catalog: the built-in models plus the user's own ONNX files, registered by path.

bpy-free. The user entries are saved to and loaded from a JSON file (``user_models.json`` in the
models folder; see models/library.py) so Blender and the command line see the same list.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..runtime.errors import LeanImageError, ModelFileError
from . import families, files
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
    p = Path(path).expanduser()
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


class Catalog:
    """Built-in entries plus the user's registered models. Safe to share between threads."""

    def __init__(self, builtin: Iterable[CatalogEntry] = BUILTIN_ENTRIES, user: Iterable[CatalogEntry] = ()):
        self._lock = threading.RLock()
        self._builtin: dict[str, CatalogEntry] = {}
        for entry in builtin:
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
        missing). An entry with an unknown or ill-typed field or setting makes the whole file
        an error that names it. With ``replace`` the current user entries are dropped first.
        """
        source = Path(path)
        if not source.exists():
            if replace:
                with self._lock:
                    self._user.clear()
            return []
        try:
            payload = json.loads(source.read_text(encoding="utf-8"))
            if not isinstance(payload, dict) or payload.get("format") not in (1, USER_MODELS_FORMAT):
                found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
                raise ValueError(f"expected format {USER_MODELS_FORMAT}, got {found!r}")
            items = payload.get("user_models", [])
            if payload["format"] == 1:
                items = [_upgrade_format_1(item) for item in items]
            loaded = [CatalogEntry.from_dict(item) for item in items]
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise LeanImageError(
                f"Could not read the saved user models from {str(source)!r}: {exc}. "
                "Fix or delete that file, then register your models again."
            ) from exc
        with self._lock:
            if replace:
                self._user.clear()
            for entry in loaded:
                self._put_user(entry)
        return loaded


__all__ = ["BUILTIN_ENTRIES", "USER_MODELS_FORMAT", "Catalog", "CatalogEntry", "register_user_model"]
