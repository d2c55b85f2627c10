"""Where a model's measured reach is kept: one small JSON file per model *content* (its SHA-256),
in the models folder's own cache folder (models/store/models_folder.py), never beside a user's
file. A record is trusted only when it reads as one: a regular file (not a link, a FIFO or a
device), at most MAX_RECORD_BYTES, shallow JSON, the same content hash and measuring rules, and a
reach in a sane range. Anything else is ignored, said once, and the reach measured again.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from ..files import write_text
from ..store.models_folder import cache_dir

MAX_RECORD_BYTES = 4096
MAX_BRACKETS = 4  # a record is one flat object: deep nesting is not a record (and json would recurse)
RECORD_SUFFIX = ".reach.json"
_remembered: dict[str, int | None] = {}  # content hash -> reach, for this process
_said: set[str] = set()


def content_hash(model_path) -> str:
    """The SHA-256 of the model file's bytes: a file replaced by another of the same size and
    mtime (``cp -p``, ``rsync -a``) gets a key of its own."""
    digest = hashlib.sha256()
    with open(model_path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def record_path(digest: str) -> Path:
    return cache_dir() / "tiling" / (digest + RECORD_SUFFIX)


def cached(digest: str, rules: dict, valid_reach, *, say: bool = True) -> tuple[bool, int | None, str | None]:
    """(known, reach, a note to say once or None). `rules`: what the record must have been measured
    by; `valid_reach(value)`: whether a stored reach is sane (None: past the probe); `say`: False to
    only look (the note is kept for the look that measures again)."""
    if digest in _remembered:
        return True, _remembered[digest], None
    path = record_path(digest)
    try:
        record = _read_record(path)
    except FileNotFoundError:
        return False, None, None
    except (OSError, ValueError, RecursionError) as exc:
        return False, None, _once(path, str(exc) or type(exc).__name__) if say else None
    why = _mismatch(record, digest, rules, valid_reach)
    if why:
        return False, None, _once(path, why) if say else None
    _remembered[digest] = record["reach"]
    return True, record["reach"], None


def _read_record(path: Path) -> dict:
    """The record's JSON, read without following a link and without blocking on a FIFO."""
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise ValueError("not a regular file")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between the two looks
            raise ValueError("not a regular file")
        data = os.read(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"larger than {MAX_RECORD_BYTES} bytes")
    text = data.decode("utf-8")
    if text.count("[") + text.count("{") > MAX_BRACKETS:
        raise ValueError("nested deeper than a record")
    record = json.loads(text)
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    return record


def _mismatch(record: dict, digest: str, rules: dict, valid_reach) -> str | None:
    if record.get("sha256") != digest:
        return "written for another model file"
    if any(record.get(key) != value for key, value in rules.items()):
        return "measured by other rules"
    if "reach" not in record or not valid_reach(record["reach"]):
        return f"reach {json.dumps(record.get('reach'))[:20]} is not a number of pixels a probe can read"
    return None


def _once(path: Path, why: str) -> str | None:
    """The note for a record that was ignored, once per file per process."""
    if str(path) in _said:
        return None
    _said.add(str(path))
    return f"Ignored the cached reach {path.name} ({why}); measured it again."


def remember(digest: str, reach: int | None, rules: dict) -> None:
    """Keep the figure for this process, and in the cache folder when it can be written."""
    _remembered[digest] = reach
    record = {"sha256": digest, "reach": reach, **rules}
    path = record_path(digest)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(record, indent=1) + "\n")
    except OSError:
        pass  # a read-only models folder: this process keeps the figure
    _said.discard(str(path))


def forget_in_process(digest: str | None = None) -> None:
    """Drop what this process remembers (one model's figure, or all): the cache file alone answers
    next, as in a new process (tests)."""
    if digest is None:
        _remembered.clear()
        _said.clear()
    else:
        _remembered.pop(digest, None)
