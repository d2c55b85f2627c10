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

from ....runtime.errors import ModelInstallError, OperationCancelled
from ... import files
from ..catalog_entry import CatalogEntry
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
from .part_files import discard_part, record_path

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
    gave_up = urllib.request.HTTPRedirectHandler.inf_msg
    if str(exc.reason).startswith(gave_up):
        # urllib gives up on a loop, or on too many hops, with a 30x "error" whose text is
        # three lines of its own: say it in one.
        limit = urllib.request.HTTPRedirectHandler.max_redirections
        last = str(exc.reason).replace(gave_up, "").strip()
        return (
            f"the server answered with redirects that go round in a loop (or more than {limit} in a "
            f"row; the last was HTTP {code}{' ' + last if last else ''}), so the address is broken at "
            "the moment; try again later"
        )
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
            transfer = _Transfer(entry, dest, part, progress, cancel, timeout, chunk_size, watch, state)
            transfer.run(offset, if_range)
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


class _Restart(Exception):
    """The .part cannot be continued (the server refused its range, or sent another file's):
    the download starts over from byte 0, once."""


class _Transfer:
    """One download's fixed parts (what, where, callbacks, watch), so that each step of it (open,
    read the answer's headers, copy the body, check the end) is a method of its own."""

    def __init__(self, entry, dest, part, progress, cancel, timeout, chunk_size, watch: Watch, state: dict):
        self.entry, self.dest, self.part = entry, dest, part
        self.progress, self.cancel = progress, cancel
        self.timeout, self.chunk_size = timeout, chunk_size
        self.watch, self.state = watch, state
        expected = entry.size_bytes
        self.ceiling = expected if expected is not None else size_ceiling(entry.approx_size_bytes)
        self.fetch = opener(watch)

    def run(self, offset: int, if_range: str | None) -> None:
        restarted = False
        while True:
            try:
                return self._attempt(offset, if_range, restarted)
            except _Restart:
                discard_part(self.part)
                offset, restarted, if_range = 0, True, None
                self.state["done"] = 0

    def _attempt(self, offset: int, if_range: str | None, restarted: bool) -> None:
        if self.cancel is not None and self.cancel():
            raise OperationCancelled(_cancel_message(self.entry, self.part, offset))
        response = self._open(offset, if_range, restarted)
        with response:
            offset, mode, total = self._start(response, offset, if_range, restarted)
            done = self._receive(response, offset, mode, total)
        if self.watch.reason is not None:
            raise _Stopped()
        if total is not None and done < total:
            raise self._error(
                f"the transfer was cut off after {done} of {total} bytes; install again to resume "
                f"from {str(self.part)!r}"
            )

    def _error(self, what: str) -> ModelInstallError:
        return install_error(self.entry, self.dest, what)

    def _failed(self, what: str) -> Exception:
        """What a broken connection raises: _Stopped when the watch ended it (it says why), else
        the install error saying `what`."""
        return _Stopped() if self.watch.reason is not None else self._error(what)

    def _open(self, offset: int, if_range: str | None, restarted: bool):
        try:
            return self.fetch.open(_request(self.entry.url, offset, if_range), timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and offset > 0 and not restarted:
                # Our .part does not fit what the server has now: start over.
                exc.close()
                raise _Restart() from None
            raise self._failed(_describe_http_error(exc)) from exc
        except RefusedAddress as exc:
            raise self._error(str(exc.reason)) from exc
        except (urllib.error.URLError, TimeoutError) as exc:
            raise self._failed(_describe_url_error(exc)) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise self._failed(f"network error: {exc}") from exc

    def _start(self, response, offset: int, if_range: str | None, restarted: bool):
        """(offset, file mode, total bytes or None) for the body of this answer."""
        status = response.status
        length = _int_header(response, "Content-Length")
        if offset > 0 and status == 206:
            total, mode = self._resumed_total(response, offset, if_range, restarted, length), "ab"
        elif status in (200, 203):
            # Fresh download, a server that ignores Range, or (If-Range) a file that changed
            # since the .part was started: (re)write from byte 0 and remember what this is.
            offset, total, mode = 0, length, "wb"
            self._remember(response)
        else:
            raise self._error(f"unexpected HTTP status {status}")
        self._check_total(total)
        return offset, mode, (self.entry.size_bytes if total is None else total)

    def _resumed_total(self, response, offset, if_range, restarted, length) -> int | None:
        match = _CONTENT_RANGE_RE.match(response.headers.get("Content-Range", ""))
        changed = _validator_changed(if_range, _validator(response.headers))
        if match is None or int(match.group(1)) != offset or changed:
            # a wrong range, or a server that ignored If-Range and sent a part of a
            # different file (its ETag changed): the .part cannot be continued
            if restarted:
                raise self._error("the server answered the resume request with the wrong range")
            raise _Restart()
        total = int(match.group(3)) if match.group(3) != "*" else None
        if total is None and length is not None:
            total = offset + length
        return total

    def _remember(self, response) -> None:
        try:
            _write_record(self.part, self.entry.url, _validator(response.headers))
        except OSError as exc:
            raise ModelInstallError(
                f"Could not write {str(record_path(self.part))!r} while downloading {self.entry.title}: "
                f"{exc}. Check free disk space and write permission of the models folder."
            ) from exc

    def _check_total(self, total: int | None) -> None:
        expected = self.entry.size_bytes
        if expected is not None and total is not None and total != expected:
            discard_part(self.part)
            raise self._error(
                f"the server offers {total} bytes but the catalog expects {expected} bytes "
                "(size mismatch: a different file is at that address)"
            )
        if total is not None and total > self.ceiling:
            discard_part(self.part)
            raise self._error(f"the server offers {total} bytes, " + _over(self.entry, self.ceiling))

    def _receive(self, response, offset: int, mode: str, total: int | None) -> int:
        """Copy the body into the .part; the bytes it holds now."""
        done = self.state["done"] = offset
        if self.progress is not None:
            self.progress(done, total)
        try:
            with open(self.part, mode) as fh:
                while block := self._read(response, fh, done):
                    if done + len(block) > self.ceiling:
                        raise _SizeOverrun(done + len(block))
                    fh.write(block)
                    done = self.state["done"] = done + len(block)
                    self.watch.arrived(len(block))
                    if self.progress is not None:
                        self.progress(done, total)
        except _SizeOverrun as overrun:
            discard_part(self.part)
            raise self._error(
                f"the server sent at least {overrun.done} bytes, " + _over(self.entry, self.ceiling)
            ) from None
        except OSError as exc:
            if self.watch.reason is not None:
                raise _Stopped() from exc
            raise ModelInstallError(
                f"Could not write {str(self.part)!r} while downloading {self.entry.title}: {exc}. "
                "Check free disk space and write permission of the models folder."
            ) from exc
        return done

    def _read(self, response, fh, done: int) -> bytes:
        if self.cancel is not None and self.cancel():
            fh.flush()
            raise OperationCancelled(_cancel_message(self.entry, self.part, done))
        try:
            # one read at most: every byte that came is written and counted
            return response.read1(self.chunk_size)
        except TimeoutError as exc:
            raise self._failed(f"the transfer stalled and timed out after {done} bytes") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise self._failed(f"the transfer broke off after {done} bytes ({exc})") from exc


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


