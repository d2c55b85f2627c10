"""A loopback HTTP server whose behaviour each test controls (404, Range, truncation, throttle).

Used through the `server` fixture in conftest.py; it only ever listens on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lean_image_ai.models.store.catalog import CatalogEntry
from lean_image_ai.models.store.transfer import http_watch

CHUNK = 16 * 1024


@contextlib.contextmanager
def loopback_http():
    """Within the block, the downloader may use plain ``http://`` to 127.0.0.1, ::1 and localhost
    (and nowhere else): this server has no certificate. The product never allows it."""
    previous = http_watch.PLAIN_HTTP_HOSTS
    http_watch.PLAIN_HTTP_HOSTS = http_watch.LOOPBACK_HOSTS
    try:
        yield
    finally:
        http_watch.PLAIN_HTTP_HOSTS = previous


class _Handler(BaseHTTPRequestHandler):
    server: ModelServer

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):  # noqa: N802 (http.server naming)
        srv = self.server
        srv.requests.append({"path": self.path, "range": self.headers.get("Range")})
        if srv.delay:
            time.sleep(srv.delay)
        if srv.hold is not None:
            # answer only once the test releases the hold (bounded, so a broken client cannot
            # keep the server thread forever)
            srv.held += 1
            srv.hold.wait(srv.hold_limit)
        if self.path in srv.redirects:
            self.send_response(302)
            self.send_header("Location", srv.redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if srv.endless:
            self._endless()
            return
        body = srv.files.get(self.path)
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "9")
            self.end_headers()
            self.wfile.write(b"not found")
            return
        start = 0
        rng = self.headers.get("Range")
        etag, modified = _validators(body)
        if_range = self.headers.get("If-Range")
        srv.requests[-1]["if_range"] = if_range
        if rng and if_range and srv.honour_if_range and if_range not in (etag, modified):
            rng = None  # RFC 9110: the file changed since the client's copy began, send all of it
        if rng and not srv.ignore_range:
            start = int(rng.split("=", 1)[1].split("-", 1)[0])
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        rest = body[start:]
        if srv.validators:
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", modified)
        self.send_header("Content-Type", "application/octet-stream")
        if srv.short_length is not None:  # announces (and sends) less than the file
            rest = rest[: srv.short_length]
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        if srv.drip:
            self._drip(rest)
            return
        if srv.truncate_after is not None:
            cut, srv.truncate_after = srv.truncate_after, None  # only the next response is cut
            self.wfile.write(rest[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        try:
            for i in range(0, len(rest), CHUNK):
                self.wfile.write(rest[i : i + CHUNK])
                if srv.throttle:
                    time.sleep(srv.throttle)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client cancelled


    def _drip(self, rest: bytes) -> None:
        """One byte every `drip` seconds: never silent long enough for a socket timeout."""
        srv = self.server
        try:
            for i in range(len(rest)):
                self.wfile.write(rest[i : i + 1])
                self.wfile.flush()
                srv.dripped += 1
                time.sleep(srv.drip)
        except (BrokenPipeError, ConnectionResetError):
            srv.drip_stopped = time.monotonic()  # the client went away

    def _endless(self) -> None:
        """Random bytes with no Content-Length until the client stops reading (bounded)."""
        srv = self.server
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        block = bytes(range(256)) * 256
        try:
            while srv.endless_sent < srv.endless_limit:
                self.wfile.write(block)
                srv.endless_sent += len(block)
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


def _validators(body: bytes) -> tuple[str, str]:
    """A strong ETag and a Last-Modified date, both of which change with the content."""
    digest = hashlib.sha256(body).hexdigest()
    return f'"{digest[:16]}"', email.utils.formatdate(1_600_000_000 + int(digest[:6], 16), usegmt=True)


class ModelServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.requests: list[dict] = []
        self.ignore_range = False
        self.validators = True  # send ETag and Last-Modified
        self.honour_if_range = True  # False: a server that sends the range whatever If-Range says
        self.truncate_after: int | None = None
        self.delay = 0.0
        self.throttle = 0.0
        self.hold: threading.Event | None = None  # set: requests wait for it before any answer
        self.hold_limit = 20.0
        self.held = 0  # requests that waited on `hold`
        self.redirects: dict[str, str] = {}  # path -> Location of a 302
        self.short_length: int | None = None  # send only this many bytes, announced as the length
        self.drip = 0.0  # seconds between single bytes of the body (0: normal speed)
        self.dripped = 0
        self.drip_stopped: float | None = None
        self.endless = False  # stream bytes with no Content-Length, up to endless_limit
        self.endless_limit = 256 << 20
        self.endless_sent = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


@contextlib.contextmanager
def serving():
    srv = ModelServer()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        if srv.hold is not None:
            srv.hold.set()
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def onnx_payload(size: int, seed: int = 0) -> bytes:
    """A real upscale-family ONNX model (4x nearest Resize) of exactly ``size`` bytes: an unused
    initializer of random bytes pads it, so two seeds give two different, loadable files."""
    import random

    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, None, None])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, None, None])
    node = helper.make_node("Resize", ["input", "", "scales"], ["output"], mode="nearest")
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1.0, 1.0, 4.0, 4.0])
    noise = random.Random(seed)

    def build(pad: int) -> bytes:
        blob = helper.make_tensor("padding", TensorProto.UINT8, [pad], noise.randbytes(pad), raw=True)
        graph = helper.make_graph([node], "sr4x", [x], [y], initializer=[scales, blob])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model.SerializeToString()

    pad = size
    for _ in range(8):  # the length prefixes grow with the padding: converge on the exact size
        data = build(pad)
        if len(data) == size:
            onnx.checker.check_model(onnx.load_from_string(data))
            return data
        pad += size - len(data)
    raise ValueError(f"cannot build an ONNX model of exactly {size} bytes")


def loopback_entry(url: str | None, data: bytes | None, **overrides) -> CatalogEntry:
    """A catalog entry for `data` served at `url`, with its real size and sha256 (None: unknown)."""
    fields = dict(
        id="test-model",
        family="upscale",
        variant="test",
        title="Test model",
        filename="test-model.onnx",
        url=url,
        size_bytes=len(data) if data is not None else None,
        sha256=hashlib.sha256(data).hexdigest() if data is not None else None,
        license="MIT",
        source="loopback",
        settings={"tile_overlap": 8},
        notes="test entry",
    )
    fields.update(overrides)
    return CatalogEntry(**fields)
