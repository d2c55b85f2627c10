"""The network side of a model download (bpy-free, stdlib only): which addresses may be fetched,
how large a transfer may grow, and a watch that ends a transfer that is cancelled, stalls or runs
past its deadline.

urllib's timeout bounds each socket read, so a server that sends one byte every half second never
times out, and a Cancel polled between large reads waits as long as the server likes. Here a watch
thread looks at the cancel flag, the overall deadline and the bytes that arrived ten times a
second, and when one of them says stop it shuts the connection's socket down from outside: the
blocked read returns at once, and the reader raises what the watch saw.

Addresses: https only. Plain http reaches only a loopback host named in :data:`PLAIN_HTTP_HOSTS`,
which is empty: no setting, environment variable or catalog field fills it (the tests' model server,
which has no certificate, is let in by the tests' own fixture: tests/model_server.py). A redirect is
held to the same rule.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from .transfer_limits import (  # noqa: F401 - the download's bounds, named here too
    HARD_MAX_BYTES,
    LOOPBACK_HOSTS,
    SIZE_FACTOR,
    TransferLimits,
    is_loopback_http,
    size_ceiling,
    size_floor,
)

PLAIN_HTTP_HOSTS: frozenset[str] = frozenset()  # loopback hosts plain http may reach: none


def refusal(url: str) -> str | None:
    """Why ``url`` may not be downloaded from, or None when it may."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return None
    if is_loopback_http(url) and parts.hostname in PLAIN_HTTP_HOSTS:
        return None
    return f"only https addresses are downloaded from, and {url!r} is not one"


CANCELLED, STALLED, DEADLINE = "cancelled", "stalled", "deadline"


class Watch:
    """Ends the watched connection when ``cancel()`` turns true (polled from the watch's own
    thread), when too few bytes arrive, or at the deadline. The reader reports bytes with
    :meth:`arrived` and, on any read error or end of data, asks :attr:`reason` first."""

    def __init__(self, cancel: Callable[[], bool] | None, limits: TransferLimits):
        self.limits = limits
        self.received = 0  # bytes of body that arrived, all requests together
        self.reason: str | None = None
        self.window_bytes = 0  # what arrived in the last stall window, when it stalled
        self._cancel = cancel
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lean_image_ai:download-watch", daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def arrived(self, count: int) -> None:
        self.received += count

    def attach(self, sock: socket.socket) -> None:
        """The socket the transfer reads from now (the raw one, then its TLS wrapper)."""
        with self._lock:
            self._sockets.append(sock)
            tripped = self.reason is not None
        if tripped:
            _shut(sock)

    def _run(self) -> None:
        limits = self.limits
        start = time.monotonic()
        window_start, window_received = start, 0
        while not self._stop.wait(limits.poll_seconds):
            now = time.monotonic()
            reason = None
            if self._cancel is not None and self._cancel():
                reason = CANCELLED
            elif now - start >= limits.deadline_seconds:
                reason = DEADLINE
            elif now - window_start >= limits.stall_seconds:
                got = self.received - window_received
                if got < limits.stall_bytes:
                    self.window_bytes, reason = got, STALLED
                else:
                    window_start, window_received = now, self.received
            if reason is not None:
                with self._lock:
                    self.reason = reason
                    sockets = list(self._sockets)
                for sock in sockets:
                    _shut(sock)
                return


def _shut(sock: socket.socket) -> None:
    # The OS-level shutdown wakes a read blocked in another thread; an SSLSocket's own shutdown()
    # would also drop its TLS state under that reader.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class RefusedAddress(urllib.error.URLError):
    """A redirect to an address :func:`refusal` does not allow."""


def _watched(connection_class, watch: Watch):
    class Watched(connection_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            create = self._create_connection

            def created(*a, **kw):
                sock = create(*a, **kw)
                watch.attach(sock)
                return sock

            self._create_connection = created

        def connect(self):
            super().connect()
            watch.attach(self.sock)  # https: the TLS socket that replaced the raw one

    return Watched


def opener(watch: Watch) -> urllib.request.OpenerDirector:
    """urllib with the user's proxies, every connection watched and redirects held to https."""
    http_connection = _watched(http.client.HTTPConnection, watch)
    https_connection = _watched(http.client.HTTPSConnection, watch)

    class HTTPHandler(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(http_connection, req)

    class HTTPSHandler(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(https_connection, req, context=self._context)

    class Redirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            why = refusal(newurl)
            if why is not None:
                raise RefusedAddress(f"the server redirected to another address, which is refused: {why}")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    return urllib.request.build_opener(HTTPHandler(), HTTPSHandler(), Redirects())
