"""One model the add-on can use: a downloadable public export, or the user's own ONNX file."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from .. import families
from .transfer.transfer_limits import is_loopback_http

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
WEIGHT_DTYPES = (None, "float32", "float16")


def _freeze(value: Any) -> Any:
    """Read-only copy of a JSON-like value (dicts become mapping proxies, lists become tuples)."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    """Plain JSON-serialisable copy of a frozen value."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class CatalogEntry:
    """One installable (or user-supplied) ONNX model.

    ``size_bytes`` and ``sha256`` are what the installer verifies; they are set only where the
    real value is known. ``approx_size_bytes`` is a display hint (e.g. "~0.7 GB") and is never
    used for verification. ``path`` is set only for user entries: the user's own file.
    ``settings`` are the constants that differ between exports of one family (normalisation,
    input size...), checked against the family's record: an unknown or ill-typed key is a
    ValueError naming the entry.
    """

    id: str
    family: str
    variant: str
    title: str
    filename: str
    url: str | None
    size_bytes: int | None
    sha256: str | None
    license: str
    source: str
    settings: Mapping[str, Any] = field(default_factory=dict, hash=False)
    notes: str = ""
    approx_size_bytes: int | None = None
    path: str | None = None
    weight_dtype: str | None = None  # "float32" or "float16" where a public source says so, else None

    @property
    def fp16_on_cpu_note(self) -> str:
        """What an fp16-weight file costs on CPU, where there is no fp16 kernel for most ops (ORT
        casts back to float32): measured for BEN2 on its real Swin-B export (issue #20: 1.22x
        slower, peak 0.86 GB higher than its fp32 graph)."""
        if self.weight_dtype != "float16":
            return ""
        return "fp16 weights: on CPU slower and heavier than an fp32 export (BEN2: 1.22x the time, +0.86 GB peak)"

    def __post_init__(self):
        # checked in this order, so the first thing wrong is the one reported
        self._check_names()
        self._check_download()
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"entry {self.id!r}: weight_dtype must be one of {WEIGHT_DTYPES}, got {self.weight_dtype!r}")
        if not isinstance(self.settings or {}, Mapping):
            raise ValueError(f"entry {self.id!r}: settings must be a mapping")
        checked = families.get(self.family).check_settings(self.settings, f"entry {self.id!r}")
        object.__setattr__(self, "settings", _freeze(checked))

    def _check_names(self) -> None:
        """The id, the text fields, the path, the family and the file name."""
        if not self.id or not isinstance(self.id, str):
            raise ValueError("a catalog entry needs a non-empty string id")
        for name in ("variant", "title", "filename", "license", "source", "notes"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"entry {self.id!r}: {name} must be text, got {getattr(self, name)!r}")
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise ValueError(f"entry {self.id!r}: path must be the model file's path as text, got {self.path!r}")
        if not isinstance(self.family, str) or self.family not in families.IDS:
            raise ValueError(f"entry {self.id!r}: family {self.family!r} is not one of {families.IDS}")
        if (
            not self.filename
            or os.path.basename(self.filename) != self.filename
            or self.filename in (".", "..")
            or "/" in self.filename
            or "\\" in self.filename
        ):
            raise ValueError(
                f"entry {self.id!r}: filename {self.filename!r} must be a bare file name (no folder, "
                "not '.' or '..'); fix the entry in the catalog file"
            )

    def _check_download(self) -> None:
        """The address, the sizes and the checksum."""
        if self.url is not None and not (
            isinstance(self.url, str) and (self.url.startswith("https://") or is_loopback_http(self.url))
        ):
            raise ValueError(
                f"entry {self.id!r}: url {self.url!r} must be an https address or None (models are "
                "downloaded over https only)"
            )
        for name in ("size_bytes", "approx_size_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"entry {self.id!r}: {name} must be a positive int or None, got {value!r}")
        if self.sha256 is not None:
            if not isinstance(self.sha256, str) or not _SHA256_RE.match(self.sha256):
                raise ValueError(f"entry {self.id!r}: sha256 must be 64 lower-case hex digits or None")

    @property
    def is_user(self) -> bool:
        """True for a model the user registered by path (nothing to download)."""
        return self.path is not None

    @property
    def downloadable(self) -> bool:
        return self.url is not None

    def adapter_kwargs(self, **option_values) -> dict[str, Any]:
        """The adapter's keyword arguments for this model and the job's option values."""
        return families.get(self.family).adapter_kwargs(_thaw_tuples(self.settings), **option_values)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _thaw(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CatalogEntry:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"entry {data.get('id')!r}: unknown field(s) {', '.join(unknown)}")
        return cls(**data)


def _thaw_tuples(value: Any) -> Any:
    """Settings as adapters take them: plain dicts and tuples."""
    if isinstance(value, Mapping):
        return {k: _thaw_tuples(v) for k, v in value.items()}
    return value
