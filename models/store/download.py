"""One model file over HTTP(S) into its ``.part`` file, resuming with a Range request (stdlib
``urllib`` only: Blender has no requests). Verification and the move into place are the
installer's (models/store/installer.py).

A resume must prove the server still has the same file: when a ``.part`` is started, the
response's validator (a strong ``ETag``, else ``Last-Modified``) is kept beside it in
``<file>.part.json``, and the resume sends it as ``If-Range``. A server whose file changed answers
``200`` with the whole new file, which then replaces the ``.part`` from byte 0. A ``.part`` with no
validator is resumed only when the catalog's sha256 will catch a spliced result; otherwise the
download starts over.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ...runtime.errors import ModelInstallError, OperationCancelled
from .. import files
from .catalog_entry import CatalogEntry
from .http_watch import (
    CANCELLED,
    SIZE_FACTOR,
    STALLED,
    RefusedAddress,
    TransferLimits,
    Watch,
    opener,
    refusal,
    size_ceiling,
)

ProgressCallback = Callable[[int, "int | None"], None]
CancelCallback = Callable[[], bool]

USER_AGENT = "lean-image-ai/0.1 (+Blender add-on; urllib)"

_CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


def manual_hint(dest: Path) -> str:
    return (
        f"You can download it yourself and save it as {dest.name!r} in the folder "
        f"{str(dest.parent)!r} (full path: {str(dest)!r})."
    )


def install_error(entry: CatalogEntry, dest: Path, what: str) -> ModelInstallError:
    return ModelInstallError(
        f"Could not download {entry.title} from {entry.url}: {what}. " + manual_hint(dest)
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


def looks_like_text_not_model(head: bytes) -> bool:
    """True for an HTML error page or a Git LFS pointer saved instead of the model."""
    start = head.lstrip()[:64].lower()
    return (
        start.startswith(b"<!doctype html")
        or start.startswith(b"<html")
        or start.startswith(b"version https://git-lfs")
        or start.startswith(b'{"error"')
    )


def record_path(part: Path) -> Path:
    """Where the validator of the server's file, seen when ``part`` was started, is kept."""
    return part.with_name(part.name + ".json")


def discard_part(part: Path) -> bool:
    """Delete a partial download and its validator record; True if the .part was there."""
    files.remove_if_present(record_path(part))
    return files.remove_if_present(part)


def _validator(headers) -> dict:
    """The response's validators: a strong ETag (weak ones cannot be used with If-Range) and
    Last-Modified."""
    etag = (headers.get("ETag") or "").strip()
    if etag.startswith("W/"):
        etag = ""
    return {"etag": etag or None, "last_modified": (headers.get("Last-Modified") or "").strip() or None}


def _write_record(part: Path, url: str, validator: dict) -> None:
    files.write_text(record_path(part), json.dumps({"url": url, **validator}, sort_keys=True))


def _read_if_range(part: Path, url: str) -> str | None:
    """The validator to resume ``part`` with, or None when there is none for this URL."""
    try:
        record = json.loads(record_path(part).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("url") != url:
        return None
    return record.get("etag") or record.get("last_modified") or None


def _validator_changed(if_range: str | None, now: dict) -> bool:
    """A 206 answer whose own validator differs from the one the resume was sent with."""
    if if_range is None:
        return False
    if if_range.startswith('"'):
        return bool(now["etag"]) and now["etag"] != if_range
    return bool(now["last_modified"]) and now["last_modified"] != if_range


def _request(url: str, offset: int, if_range: str | None = None) -> urllib.request.Request:
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if offset > 0:
        headers["Range"] = f"bytes={offset}-"
        if if_range:
            headers["If-Range"] = if_range
    return urllib.request.Request(url, headers=headers)


def _int_header(response, name: str) -> int | None:
    value = response.headers.get(name)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if number >= 0 else None


class _Stopped(Exception):
    """The watch ended the transfer (cancel, stall, deadline), or the size ceiling was passed."""


def download_to_part(
    entry: CatalogEntry,
    dest: Path,
    part: Path,
    progress: ProgressCallback | None,
    cancel: CancelCallback | None,
    timeout: float,
    chunk_size: int,
    limits: TransferLimits | None = None,
) -> None:
    """Bring ``entry``'s file into ``part``, resuming what is there when the server proves it
    still has the same file. ``cancel`` is also called from the watch's thread."""
    why = refusal(entry.url)
    if why is not None:
        raise install_error(entry, dest, why)
    limits = limits or TransferLimits()
    expected = entry.size_bytes
    offset = part.stat().st_size if part.exists() else 0
    if expected is not None and offset > expected:
        discard_part(part)
        offset = 0
    if expected is not None and offset == expected:
        return  # a complete .part from an earlier run: only verification is left
    if_range = _read_if_range(part, entry.url) if offset > 0 else None
    if offset > 0 and if_range is None and entry.sha256 is None:
        # Nothing can prove the server still has the file this .part began, and no checksum
        # would catch a splice of old start + new end: start over.
        discard_part(part)
        offset = 0
    state = {"done": offset}
    with Watch(cancel, limits) as watch:
        try:
            _transfer(entry, dest, part, progress, cancel, timeout, chunk_size, watch, offset, if_range, state)
        except (OSError, http.client.HTTPException, _Stopped) as exc:
            if watch.reason is None:
                raise
            raise _stopped_error(entry, dest, part, watch, state["done"]) from exc
        if watch.reason is not None:  # ended as the last bytes came in
            raise _stopped_error(entry, dest, part, watch, state["done"])


def _stopped_error(entry, dest, part, watch: Watch, done: int) -> Exception:
    limits = watch.limits
    if watch.reason == CANCELLED:
        return OperationCancelled(_cancel_message(entry, part, done))
    kept = f"{done} bytes arrived and are kept in {str(part)!r}; install again to resume"
    if watch.reason == STALLED:
        what = (
            f"the transfer stalled: {watch.window_bytes} bytes came in the last "
            f"{limits.stall_seconds:g} s (the add-on gives up below {limits.stall_bytes}); {kept}"
        )
    else:
        what = f"the download did not finish within {limits.deadline_seconds:g} s; {kept}"
    return install_error(entry, dest, what)


def _transfer(entry, dest, part, progress, cancel, timeout, chunk_size, watch, offset, if_range, state) -> None:
    expected = entry.size_bytes
    ceiling = expected if expected is not None else size_ceiling(entry.approx_size_bytes)
    fetch = opener(watch)
    restarted = False
    while True:
        if cancel is not None and cancel():
            raise OperationCancelled(_cancel_message(entry, part, offset))
        try:
            response = fetch.open(_request(entry.url, offset, if_range), timeout=timeout)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and offset > 0 and not restarted:
                # Our .part does not fit what the server has now: start over.
                exc.close()
                discard_part(part)
                offset, restarted = 0, True
                state["done"] = 0
                continue
            if watch.reason is not None:
                raise _Stopped() from exc
            raise install_error(entry, dest, _describe_http_error(exc)) from exc
        except RefusedAddress as exc:
            raise install_error(entry, dest, str(exc.reason)) from exc
        except urllib.error.URLError as exc:
            if watch.reason is not None:
                raise _Stopped() from exc
            raise install_error(entry, dest, _describe_url_error(exc)) from exc
        except TimeoutError as exc:
            if watch.reason is not None:
                raise _Stopped() from exc
            raise install_error(entry, dest, _describe_url_error(exc)) from exc
        except (OSError, http.client.HTTPException) as exc:
            if watch.reason is not None:
                raise _Stopped() from exc
            raise install_error(entry, dest, f"network error: {exc}") from exc

        with response:
            status = response.status
            length = _int_header(response, "Content-Length")
            total: int | None
            if offset > 0 and status == 206:
                match = _CONTENT_RANGE_RE.match(response.headers.get("Content-Range", ""))
                now = _validator(response.headers)
                changed = _validator_changed(if_range, now)
                if match is None or int(match.group(1)) != offset or changed:
                    # a wrong range, or a server that ignored If-Range and sent a part of a
                    # different file (its ETag changed): the .part cannot be continued
                    if restarted:
                        raise install_error(
                            entry, dest, "the server answered the resume request with the wrong range"
                        )
                    discard_part(part)
                    offset, restarted, if_range = 0, True, None
                    state["done"] = 0
                    continue
                total = int(match.group(3)) if match.group(3) != "*" else None
                if total is None and length is not None:
                    total = offset + length
                mode = "ab"
            elif status in (200, 203):
                # Fresh download, a server that ignores Range, or (If-Range) a file that changed
                # since the .part was started: (re)write from byte 0 and remember what this is.
                offset = 0
                total = length
                mode = "wb"
                try:
                    _write_record(part, entry.url, _validator(response.headers))
                except OSError as exc:
                    raise ModelInstallError(
                        f"Could not write {str(record_path(part))!r} while downloading {entry.title}: "
                        f"{exc}. Check free disk space and write permission of the models folder."
                    ) from exc
            else:
                raise install_error(entry, dest, f"unexpected HTTP status {status}")

            if expected is not None and total is not None and total != expected:
                discard_part(part)
                raise install_error(
                    entry,
                    dest,
                    f"the server offers {total} bytes but the catalog expects {expected} bytes "
                    "(size mismatch: a different file is at that address)",
                )
            if total is not None and total > ceiling:
                discard_part(part)
                raise install_error(entry, dest, f"the server offers {total} bytes, " + _over(entry, ceiling))
            if total is None:
                total = expected

            done = state["done"] = offset
            if progress is not None:
                progress(done, total)
            try:
                with open(part, mode) as fh:
                    while True:
                        if cancel is not None and cancel():
                            fh.flush()
                            raise OperationCancelled(_cancel_message(entry, part, done))
                        try:
                            # one read at most: every byte that came is written and counted
                            block = response.read1(chunk_size)
                        except TimeoutError as exc:
                            if watch.reason is not None:
                                raise _Stopped() from exc
                            raise install_error(
                                entry, dest, f"the transfer stalled and timed out after {done} bytes"
                            ) from exc
                        except (OSError, http.client.HTTPException) as exc:
                            if watch.reason is not None:
                                raise _Stopped() from exc
                            raise install_error(
                                entry, dest, f"the transfer broke off after {done} bytes ({exc})"
                            ) from exc
                        if not block:
                            break
                        if done + len(block) > ceiling:
                            raise _SizeOverrun(done + len(block))
                        fh.write(block)
                        done = state["done"] = done + len(block)
                        watch.arrived(len(block))
                        if progress is not None:
                            progress(done, total)
            except _SizeOverrun as overrun:
                discard_part(part)
                raise install_error(
                    entry, dest, f"the server sent at least {overrun.done} bytes, " + _over(entry, ceiling)
                ) from None
            except OSError as exc:
                if watch.reason is not None:
                    raise _Stopped() from exc
                raise ModelInstallError(
                    f"Could not write {str(part)!r} while downloading {entry.title}: {exc}. "
                    "Check free disk space and write permission of the models folder."
                ) from exc

        if watch.reason is not None:
            raise _Stopped()
        if total is not None and done < total:
            raise install_error(
                entry,
                dest,
                f"the transfer was cut off after {done} of {total} bytes; install again to resume "
                f"from {str(part)!r}",
            )
        return


def _over(entry: CatalogEntry, ceiling: int) -> str:
    if entry.size_bytes is not None:
        return f"more than the expected {entry.size_bytes} bytes (size mismatch); nothing was kept"
    if entry.approx_size_bytes is not None:
        why = f"{SIZE_FACTOR}x its approximate size of {entry.approx_size_bytes} bytes"
    else:
        why = "the largest single ONNX file onnxruntime can load"
    return (
        f"more than the {ceiling} bytes the add-on accepts for it ({why}; the catalog has no exact "
        "size for it); nothing was kept"
    )


class _SizeOverrun(Exception):
    def __init__(self, done: int):
        super().__init__(done)
        self.done = done


def _cancel_message(entry: CatalogEntry, part: Path, done: int) -> str:
    return (
        f"Download of {entry.title} cancelled after {done} bytes. The partial file "
        f"{str(part)!r} was kept; installing again resumes from there."
    )


