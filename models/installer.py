"""Download, verify and install catalog models (stdlib ``urllib`` only: Blender has no requests).

bpy-free and free of global state, so :func:`install` can run in a worker thread. A download
goes to ``<file>.part`` and is resumed with an HTTP Range request next time; it is checked
against the catalog's size and sha256 (where known) and only then renamed into place with
``os.replace``. A small ``<file>.verified.json`` sidecar remembers what was verified, so
:func:`is_installed` does not re-hash a 1 GB file on every run (only when its size or mtime
changed).

Two installs of the same entry into the same folder at the same time are not supported (they
would share the ``.part`` file); run one download per model.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ..runtime.errors import ModelFileError, ModelInstallError, OperationCancelled
from . import files
from .catalog_entry import CatalogEntry

ProgressCallback = Callable[[int, "int | None"], None]
CancelCallback = Callable[[], bool]

DEFAULT_CHUNK_SIZE = 1 << 20  # 1 MiB
HASH_CHUNK_SIZE = 1 << 20
USER_AGENT = "lean-image-ai/0.1 (+Blender add-on; urllib)"
SIDECAR_SUFFIX = ".verified.json"
PART_SUFFIX = ".part"

_CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------


def model_path(entry: CatalogEntry, models_dir: str | os.PathLike) -> Path:
    """Where the entry's file lives: the user's own path, or ``models_dir / entry.filename``."""
    if entry.path is not None:
        return Path(entry.path)
    return Path(models_dir) / entry.filename


def part_path(entry: CatalogEntry, models_dir: str | os.PathLike) -> Path:
    dest = model_path(entry, models_dir)
    return dest.with_name(dest.name + PART_SUFFIX)


def sidecar_path(entry: CatalogEntry, models_dir: str | os.PathLike) -> Path:
    dest = model_path(entry, models_dir)
    return dest.with_name(dest.name + SIDECAR_SUFFIX)


# --------------------------------------------------------------------------------------------
# Hashing and the verification sidecar
# --------------------------------------------------------------------------------------------


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


def _read_sidecar(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_sidecar(entry: CatalogEntry, dest: Path, sidecar: Path, sha256: str) -> None:
    st = dest.stat()
    payload = {
        "entry_id": entry.id,
        "filename": dest.name,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sha256": sha256,
        "expected_sha256": entry.sha256,
        "expected_size": entry.size_bytes,
        "url": entry.url,
    }
    try:
        files.write_text(sidecar, json.dumps(payload, indent=2, sort_keys=True))
    except OSError:
        pass  # the sidecar is only a cache: failing to write it costs a re-hash next time


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


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
    the ``.verified.json`` sidecar as long as the file's size and mtime still match it, and is
    re-computed only when they changed or the sidecar is missing.
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
    if entry.sha256 is None:
        return dest
    if _sidecar_vouches(entry, st, sidecar_path(entry, models_dir)):
        return dest
    got = sha256_file(dest, cancel=cancel)
    if got != entry.sha256:
        raise ModelFileError(
            f"{entry.title}: {str(dest)!r} has sha256 {got}, expected {entry.sha256}. "
            "The file is damaged or a different version; remove it and install again."
        )
    _write_sidecar(entry, dest, sidecar_path(entry, models_dir), got)
    return dest


def _sidecar_vouches(entry: CatalogEntry, st: os.stat_result, sidecar: Path) -> bool:
    """The sidecar recorded this very file (size, mtime) with the catalog's sha256."""
    recorded = _read_sidecar(sidecar)
    return (
        recorded is not None
        and recorded.get("size") == st.st_size
        and recorded.get("mtime_ns") == st.st_mtime_ns
        and recorded.get("sha256") == entry.sha256
    )


def is_verified(entry: CatalogEntry, models_dir: str | os.PathLike) -> bool:
    """The file was hashed and matched since it last changed (no hashing here)."""
    try:
        st = model_path(entry, models_dir).stat()
    except OSError:
        return False
    return _sidecar_vouches(entry, st, sidecar_path(entry, models_dir))


def is_installed(entry: CatalogEntry, models_dir: str | os.PathLike) -> bool:
    """True if the model file is present and verified (cheap: no re-hash while unchanged)."""
    try:
        verify_installed(entry, models_dir)
    except ModelFileError:
        return False
    return True


def remove(entry: CatalogEntry, models_dir: str | os.PathLike) -> bool:
    """Delete an installed model, its sidecar and any partial download. True if anything went.

    A user-registered model's own file is never deleted (unregister it in the catalog instead).
    """
    removed = False
    if not entry.is_user:
        removed |= _unlink(model_path(entry, models_dir))
    removed |= _unlink(sidecar_path(entry, models_dir))
    removed |= _unlink(part_path(entry, models_dir))
    return removed


# --------------------------------------------------------------------------------------------
# Download
# --------------------------------------------------------------------------------------------


def _manual_hint(entry: CatalogEntry, dest: Path) -> str:
    return (
        f"You can download it yourself and save it as {dest.name!r} in the folder "
        f"{str(dest.parent)!r} (full path: {str(dest)!r})."
    )


def _fail(entry: CatalogEntry, dest: Path, what: str) -> ModelInstallError:
    return ModelInstallError(
        f"Could not download {entry.title} from {entry.url}: {what}. " + _manual_hint(entry, dest)
    )


def _describe_url_error(exc: BaseException) -> str:
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, TimeoutError):
        return "the connection timed out (offline, or the server is not answering)"
    if isinstance(reason, ConnectionRefusedError):
        return "the connection was refused (offline, or nothing is listening at that address)"
    if isinstance(reason, socket.gaierror):
        return f"the host name could not be resolved (offline?): {reason}"
    return f"network error: {reason}"


def _describe_http_error(exc: urllib.error.HTTPError) -> str:
    code = exc.code
    if code == 404:
        return "HTTP 404 Not Found (the file is not at that address any more)"
    if code in (401, 403):
        return (
            f"HTTP {code} {exc.reason} (the server refused access; the file may be gated, private or removed)"
        )
    if code == 429:
        return "HTTP 429 Too Many Requests (try again later)"
    if code >= 500:
        return f"HTTP {code} {exc.reason} (server error; try again later)"
    return f"HTTP {code} {exc.reason}"


def _looks_like_text_not_model(head: bytes) -> bool:
    """True for an HTML error page or a Git LFS pointer saved instead of the model."""
    start = head.lstrip()[:64].lower()
    return (
        start.startswith(b"<!doctype html")
        or start.startswith(b"<html")
        or start.startswith(b"version https://git-lfs")
        or start.startswith(b'{"error"')
    )


def _open(url: str, offset: int, timeout: float):
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if offset > 0:
        headers["Range"] = f"bytes={offset}-"
    request = urllib.request.Request(url, headers=headers)
    return urllib.request.urlopen(request, timeout=timeout)


def _int_header(response, name: str) -> int | None:
    value = response.headers.get(name)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if number >= 0 else None


def install(
    entry: CatalogEntry,
    models_dir: str | os.PathLike,
    *,
    progress: ProgressCallback | None = None,
    cancel: CancelCallback | None = None,
    timeout: float = 30,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Path:
    """Download ``entry`` into ``models_dir`` (resuming a partial download) and return its path.

    ``progress(done_bytes, total_bytes_or_None)`` is called as bytes arrive (``done_bytes``
    counts resumed bytes too). ``cancel()`` is polled between chunks; when it returns True,
    :class:`OperationCancelled` is raised and the ``.part`` file is kept for a later resume.
    Network and HTTP failures raise :class:`ModelInstallError` naming the URL, what went wrong
    and the exact file path where the model can be saved by hand. A size or checksum mismatch
    deletes the partial file. An already installed, verified model returns at once.
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

    part = part_path(entry, models_dir)
    _download_to_part(entry, dest, part, progress, cancel, timeout, chunk_size)
    digest = _verify_part(entry, dest, part, cancel)

    # Drop any stale sidecar before the file changes underneath it.
    _unlink(sidecar_path(entry, models_dir))
    try:
        files.replace_into(part, dest)
    except OSError as exc:
        raise ModelInstallError(
            f"{entry.title} was downloaded and verified, but moving {str(part)!r} to {str(dest)!r} "
            f"failed: {exc}. If Blender is using the old file, restart it and install again."
        ) from exc
    _write_sidecar(entry, dest, sidecar_path(entry, models_dir), digest)
    size = dest.stat().st_size
    if progress is not None:
        progress(size, size)
    return dest


def _download_to_part(
    entry: CatalogEntry,
    dest: Path,
    part: Path,
    progress: ProgressCallback | None,
    cancel: CancelCallback | None,
    timeout: float,
    chunk_size: int,
) -> None:
    expected = entry.size_bytes
    offset = part.stat().st_size if part.exists() else 0
    if expected is not None and offset > expected:
        _unlink(part)
        offset = 0
    if expected is not None and offset == expected:
        return  # a complete .part from an earlier run: only verification is left

    restarted = False
    while True:
        if cancel is not None and cancel():
            raise OperationCancelled(_cancel_message(entry, part, offset))
        try:
            response = _open(entry.url, offset, timeout)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and offset > 0 and not restarted:
                # Our .part does not fit what the server has now: start over.
                exc.close()
                _unlink(part)
                offset, restarted = 0, True
                continue
            raise _fail(entry, dest, _describe_http_error(exc)) from exc
        except urllib.error.URLError as exc:
            raise _fail(entry, dest, _describe_url_error(exc)) from exc
        except TimeoutError as exc:
            raise _fail(entry, dest, _describe_url_error(exc)) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise _fail(entry, dest, f"network error: {exc}") from exc

        with response:
            status = response.status
            length = _int_header(response, "Content-Length")
            total: int | None
            if offset > 0 and status == 206:
                match = _CONTENT_RANGE_RE.match(response.headers.get("Content-Range", ""))
                if match is None or int(match.group(1)) != offset:
                    if restarted:
                        raise _fail(
                            entry, dest, "the server answered the resume request with the wrong range"
                        )
                    _unlink(part)
                    offset, restarted = 0, True
                    continue
                total = int(match.group(3)) if match.group(3) != "*" else None
                if total is None and length is not None:
                    total = offset + length
                mode = "ab"
            elif status in (200, 203):
                # Fresh download, or a server that ignores Range: (re)write from byte 0.
                offset = 0
                total = length
                mode = "wb"
            else:
                raise _fail(entry, dest, f"unexpected HTTP status {status}")

            if expected is not None and total is not None and total != expected:
                _unlink(part)
                raise _fail(
                    entry,
                    dest,
                    f"the server offers {total} bytes but the catalog expects {expected} bytes "
                    "(size mismatch: a different file is at that address)",
                )
            if total is None:
                total = expected

            done = offset
            if progress is not None:
                progress(done, total)
            try:
                with open(part, mode) as fh:
                    while True:
                        if cancel is not None and cancel():
                            fh.flush()
                            raise OperationCancelled(_cancel_message(entry, part, done))
                        try:
                            block = response.read(chunk_size)
                        except TimeoutError as exc:
                            raise _fail(
                                entry, dest, f"the transfer stalled and timed out after {done} bytes"
                            ) from exc
                        except (OSError, http.client.HTTPException) as exc:
                            raise _fail(
                                entry, dest, f"the transfer broke off after {done} bytes ({exc})"
                            ) from exc
                        if not block:
                            break
                        fh.write(block)
                        done += len(block)
                        if expected is not None and done > expected:
                            raise _SizeOverrun(done)
                        if progress is not None:
                            progress(done, total)
            except _SizeOverrun as overrun:
                _unlink(part)
                raise _fail(
                    entry,
                    dest,
                    f"the server sent more than the expected {expected} bytes "
                    f"(got at least {overrun.done}; size mismatch)",
                ) from None
            except OSError as exc:
                raise ModelInstallError(
                    f"Could not write {str(part)!r} while downloading {entry.title}: {exc}. "
                    "Check free disk space and write permission of the models folder."
                ) from exc

        if total is not None and done < total:
            raise _fail(
                entry,
                dest,
                f"the transfer was cut off after {done} of {total} bytes; install again to resume "
                f"from {str(part)!r}",
            )
        return


class _SizeOverrun(Exception):
    def __init__(self, done: int):
        super().__init__(done)
        self.done = done


def _cancel_message(entry: CatalogEntry, part: Path, done: int) -> str:
    return (
        f"Download of {entry.title} cancelled after {done} bytes. The partial file "
        f"{str(part)!r} was kept; installing again resumes from there."
    )


def _verify_part(entry: CatalogEntry, dest: Path, part: Path, cancel: CancelCallback | None) -> str:
    """Check the finished .part against the catalog; delete it on mismatch. Returns its sha256."""
    size = part.stat().st_size
    if entry.size_bytes is not None and size != entry.size_bytes:
        _unlink(part)
        raise ModelInstallError(
            f"Download of {entry.title} from {entry.url} has the wrong size: expected "
            f"{entry.size_bytes} bytes, got {size}. The partial file was deleted. "
            + _manual_hint(entry, dest)
        )
    if size == 0:
        _unlink(part)
        raise _fail(entry, dest, "the server sent an empty file")
    with open(part, "rb") as fh:
        head = fh.read(256)
    if _looks_like_text_not_model(head):
        _unlink(part)
        raise _fail(entry, dest, "the server sent a web page or a Git LFS pointer, not the model file")
    digest = sha256_file(part, cancel=cancel)
    if entry.sha256 is not None and digest != entry.sha256:
        _unlink(part)
        raise ModelInstallError(
            f"Download of {entry.title} from {entry.url} failed the checksum: expected sha256 "
            f"{entry.sha256}, got {digest}. The partial file was deleted. " + _manual_hint(entry, dest)
        )
    return digest


__all__ = [
    "install",
    "is_installed",
    "model_path",
    "part_path",
    "remove",
    "sha256_file",
    "sidecar_path",
    "verify_installed",
]
