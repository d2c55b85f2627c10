"""The verification record of a model file (bpy-free): its sha256, and the ``.verified.json``
sidecar that vouches for it so that a 1 GB file is not re-hashed on every run.

What tells that a file is still the one a record was made of, without reading it: size and
mtime alone cannot tell a file rewritten in place whose size stayed and whose mtime was set back
(``os.utime``, ``touch -r``): its ctime still moved (the OS sets it on every write and no user call
sets it back), and a file replaced by another (a copy over it, a rename onto it) has a new inode.
Any of them changed, and the file is hashed again. models/store/installer.py decides when to
hash and what a mismatch means; this module keeps the record.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ...runtime.errors import LeanImageError, OperationCancelled
from .. import files
from .catalog_entry import CatalogEntry
from .install_lock import edit_lock

if TYPE_CHECKING:
    from .download import CancelCallback

HASH_CHUNK_SIZE = 1 << 20
FIRST_USE = "trust on first use"


def file_key(st: os.stat_result) -> dict:
    """The fields a record keeps of ``st`` (JSON-ready)."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino, "device": st.st_dev}


def unchanged(recorded: dict, st: os.stat_result) -> bool:
    """``recorded`` (holding :func:`file_key`'s fields) was made of this very file, unchanged. A
    record made before the ctime and inode were kept lacks them: one re-hash renews it."""
    return all(recorded.get(name) == value for name, value in file_key(st).items())


def sha256_file(path: str | os.PathLike, cancel: CancelCallback | None = None) -> str:
    """Hex sha256 of a file, read in chunks (``cancel`` is checked between chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            if cancel is not None and cancel():
                raise OperationCancelled(f"Checking {os.fspath(path)!r} was cancelled.")
            block = fh.read(HASH_CHUNK_SIZE)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def read_record(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_record(
    entry: CatalogEntry,
    dest: Path,
    sidecar: Path,
    sha256: str,
    *,
    first_sha256: str | None = None,
    hashed: os.stat_result | None = None,
) -> None:
    """Record that ``dest`` has ``sha256``. Under the record's lock (verifications in other
    processes rewrite it too), and only while ``dest`` is still the file that was ``hashed``: one
    replaced during the hash must not be vouched for with the old file's sha256."""
    try:
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        with edit_lock(sidecar, f"the verified record of {entry.title}"):
            st = dest.stat()
            if hashed is not None and file_key(st) != file_key(hashed):
                return
            first = first_sha256 or (read_record(sidecar) or {}).get("first_sha256") or sha256
            files.write_text(sidecar, json.dumps(_record_payload(entry, dest, st, sha256, first), indent=2, sort_keys=True))
    except (OSError, LeanImageError):
        pass  # the sidecar is only a cache: failing to write it costs a re-hash next time


def _record_payload(entry: CatalogEntry, dest: Path, st: os.stat_result, sha256: str, first_sha256: str) -> dict:
    return {
        "first_sha256": first_sha256,  # no catalog checksum: what any later copy is compared with
        "entry_id": entry.id,
        "filename": dest.name,
        **file_key(st),
        "sha256": sha256,
        "expected_sha256": entry.sha256,
        "expected_size": entry.size_bytes,
        "url": entry.url,
        # no catalog checksum: this file is trusted because it loaded and fit the family when it
        # was first installed, and later copies are held to its sha256
        "trust": FIRST_USE if entry.sha256 is None else "catalog sha256",
    }


def record_vouches(entry: CatalogEntry, st: os.stat_result, sidecar: Path) -> bool:
    """The sidecar recorded this very file (file_key) with the catalog's sha256."""
    recorded = read_record(sidecar)
    return recorded is not None and unchanged(recorded, st) and recorded.get("sha256") == entry.sha256
