"""One model file over HTTP(S) into its ``.part`` file, resuming with a Range request (stdlib
``urllib`` only: Blender has no requests). Verification and the move into place are the
installer's (models/installer.py)."""

from __future__ import annotations

import http.client
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ..runtime.errors import ModelInstallError, OperationCancelled
from . import files
from .catalog_entry import CatalogEntry

ProgressCallback = Callable[[int, "int | None"], None]
CancelCallback = Callable[[], bool]

USER_AGENT = "lean-image-ai/0.1 (+Blender add-on; urllib)"

_CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


def manual_hint(entry: CatalogEntry, dest: Path) -> str:
    return (
        f"You can download it yourself and save it as {dest.name!r} in the folder "
        f"{str(dest.parent)!r} (full path: {str(dest)!r})."
    )


def install_error(entry: CatalogEntry, dest: Path, what: str) -> ModelInstallError:
    return ModelInstallError(
        f"Could not download {entry.title} from {entry.url}: {what}. " + manual_hint(entry, dest)
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


def download_to_part(
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
        files.remove_if_present(part)
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
                files.remove_if_present(part)
                offset, restarted = 0, True
                continue
            raise install_error(entry, dest, _describe_http_error(exc)) from exc
        except urllib.error.URLError as exc:
            raise install_error(entry, dest, _describe_url_error(exc)) from exc
        except TimeoutError as exc:
            raise install_error(entry, dest, _describe_url_error(exc)) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise install_error(entry, dest, f"network error: {exc}") from exc

        with response:
            status = response.status
            length = _int_header(response, "Content-Length")
            total: int | None
            if offset > 0 and status == 206:
                match = _CONTENT_RANGE_RE.match(response.headers.get("Content-Range", ""))
                if match is None or int(match.group(1)) != offset:
                    if restarted:
                        raise install_error(
                            entry, dest, "the server answered the resume request with the wrong range"
                        )
                    files.remove_if_present(part)
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
                raise install_error(entry, dest, f"unexpected HTTP status {status}")

            if expected is not None and total is not None and total != expected:
                files.remove_if_present(part)
                raise install_error(
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
                            raise install_error(
                                entry, dest, f"the transfer stalled and timed out after {done} bytes"
                            ) from exc
                        except (OSError, http.client.HTTPException) as exc:
                            raise install_error(
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
                files.remove_if_present(part)
                raise install_error(
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
            raise install_error(
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


