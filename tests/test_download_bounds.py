"""Every download is bounded and verified (issue #21): https only, a size ceiling without a
catalog size, a short length is a cut-off, a file without a catalog checksum is installed only
once it loads and fits its family (and is recorded as trust on first use), and a slow-drip server
is given up on (stall, deadline) or cancelled promptly. Against the real loopback server."""

from __future__ import annotations

import json
import threading
import time

import pytest
from lean_image_ai.models.store import installer, verified_record
from lean_image_ai.models.store.catalog_entry import CatalogEntry
from lean_image_ai.models.store.transfer import http_watch
from lean_image_ai.models.store.transfer.http_watch import TransferLimits
from lean_image_ai.runtime.errors import ModelInstallError, OperationCancelled
from model_server import loopback_entry, loopback_http, onnx_payload

SIZE = 200 * 1024
CHUNK = 16 * 1024


@pytest.fixture
def model() -> bytes:
    return onnx_payload(SIZE)


def _nothing_installed(entry, folder) -> None:
    assert not installer.model_path(entry, folder).exists()
    assert not installer.is_installed(entry, folder)


# -- addresses -----------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://example.com/m.onnx", "ftp://example.com/m.onnx", "file:///etc/passwd"])
def test_a_catalog_entry_takes_https_only(url):
    with pytest.raises(ValueError, match="https"):
        loopback_entry(url, b"x")


def test_plain_http_to_loopback_needs_the_test_allowance(tmp_path, model):
    from model_server import serving

    with serving() as srv:  # the server without the `server` fixture's allowance
        srv.files["/m.onnx"] = model
        entry = loopback_entry(srv.url("/m.onnx"), None)
        with pytest.raises(ModelInstallError, match="only https addresses"):
            installer.install(entry, tmp_path)
        assert srv.requests == []  # refused before any connection
    assert http_watch.refusal("http://example.com/m.onnx") is not None
    with loopback_http():  # the allowance admits no other host
        assert http_watch.refusal("http://example.com/m.onnx") is not None
        assert http_watch.refusal("http://127.0.0.1:8/m.onnx") is None
    assert http_watch.refusal("https://example.com/m.onnx") is None
    # the allowance is the tests' own fixture: the product module has no hook that turns it on
    assert http_watch.PLAIN_HTTP_HOSTS == frozenset()
    assert [name for name in vars(http_watch) if "test" in name.lower()] == []


def test_a_redirect_off_https_is_refused(server, tmp_path, model):
    server.redirects["/m.onnx"] = "http://example.invalid/m.onnx"
    entry = loopback_entry(server.url("/m.onnx"), None)
    with pytest.raises(ModelInstallError, match="redirected to another address, which is refused"):
        installer.install(entry, tmp_path)
    _nothing_installed(entry, tmp_path)


@pytest.mark.parametrize("loop", [{"/m.onnx": "/m.onnx"}, {"/m.onnx": "/n.onnx", "/n.onnx": "/m.onnx"}])
def test_a_redirect_loop_is_one_line(server, tmp_path, model, loop):
    server.redirects.update({path: server.url(target) for path, target in loop.items()})
    entry = loopback_entry(server.url("/m.onnx"), None)
    with pytest.raises(ModelInstallError, match="redirects that go round in a loop") as caught:
        installer.install(entry, tmp_path)
    assert "\n" not in str(caught.value)
    _nothing_installed(entry, tmp_path)


# -- sizes ---------------------------------------------------------------------------------------


def test_a_stream_without_length_is_read_only_up_to_the_ceiling(server, tmp_path):
    server.endless = True
    entry = loopback_entry(server.url("/m.onnx"), None, approx_size_bytes=SIZE)
    with pytest.raises(ModelInstallError) as info:
        installer.install(entry, tmp_path, chunk_size=CHUNK)
    ceiling = http_watch.size_ceiling(SIZE)
    assert ceiling == 2 * SIZE
    assert f"more than the {ceiling} bytes" in str(info.value) and "nothing was kept" in str(info.value)
    _nothing_installed(entry, tmp_path)
    assert not installer.part_path(entry, tmp_path).exists()
    time.sleep(0.2)
    assert server.endless_sent < 64 * ceiling  # the client stopped reading, far below the server's limit


def test_an_announced_size_over_the_ceiling_is_refused_before_reading(server, tmp_path, model):
    server.files["/m.onnx"] = model
    entry = loopback_entry(server.url("/m.onnx"), None, approx_size_bytes=SIZE // 4)
    with pytest.raises(ModelInstallError, match=f"offers {SIZE} bytes, more than the {SIZE // 2} bytes"):
        installer.install(entry, tmp_path)
    _nothing_installed(entry, tmp_path)
    assert not installer.part_path(entry, tmp_path).exists()


def test_no_approximate_size_still_has_the_hard_maximum():
    assert http_watch.size_ceiling(None) == http_watch.HARD_MAX_BYTES == 2 << 30
    assert http_watch.size_ceiling(5 << 30) == http_watch.HARD_MAX_BYTES


def test_a_short_content_length_is_a_cut_off_that_resumes(server, tmp_path, model):
    server.files["/m.onnx"] = model
    server.short_length = SIZE // 3  # announces a third of the file, and sends it
    entry = loopback_entry(server.url("/m.onnx"), None, approx_size_bytes=SIZE)
    with pytest.raises(ModelInstallError, match="cut off") as info:
        installer.install(entry, tmp_path, chunk_size=CHUNK)
    assert "installing again resumes" in str(info.value)
    _nothing_installed(entry, tmp_path)
    part = installer.part_path(entry, tmp_path)
    assert part.read_bytes() == model[: SIZE // 3]  # kept for the resume
    server.short_length = None
    path = installer.install(entry, tmp_path, chunk_size=CHUNK)
    assert server.requests[-1]["range"] == f"bytes={SIZE // 3}-"
    assert path.read_bytes() == model


def test_a_short_length_with_no_size_hint_is_caught_by_loading_it(server, tmp_path, model):
    server.files["/m.onnx"] = model
    server.short_length = SIZE // 2
    entry = loopback_entry(server.url("/m.onnx"), None)  # no size, no approximate size, no sha256
    with pytest.raises(ModelInstallError, match="(?i)not a super-resolution model"):
        installer.install(entry, tmp_path)
    _nothing_installed(entry, tmp_path)


# -- what arrived must be the model ------------------------------------------------------------


def test_bytes_that_are_no_model_are_never_installed(server, tmp_path):
    server.files["/m.onnx"] = bytes(range(256)) * 800
    entry = loopback_entry(server.url("/m.onnx"), None)
    with pytest.raises(ModelInstallError, match="onnxruntime cannot load it") as info:
        installer.install(entry, tmp_path)
    assert "nothing was kept" in str(info.value)
    _nothing_installed(entry, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_model_of_another_family_is_never_installed(server, tmp_path):
    from builders_families import ben2_like_model

    data = ben2_like_model(tmp_path / "ben2.onnx").read_bytes()
    (tmp_path / "ben2.onnx").unlink()
    server.files["/m.onnx"] = data
    entry = loopback_entry(server.url("/m.onnx"), None)  # an upscale entry
    with pytest.raises(ModelInstallError, match="does not look like a"):
        installer.install(entry, tmp_path)
    _nothing_installed(entry, tmp_path)


def test_a_first_install_without_checksum_is_recorded_as_trust_on_first_use(server, tmp_path, model):
    import hashlib

    server.files["/m.onnx"] = model
    entry = loopback_entry(server.url("/m.onnx"), None)
    installer.install(entry, tmp_path)
    record = json.loads(installer.sidecar_path(entry, tmp_path).read_text())
    digest = hashlib.sha256(model).hexdigest()
    assert record["trust"] == verified_record.FIRST_USE and record["first_sha256"] == digest
    assert record["size"] == SIZE
    note = installer.trust_note(entry, tmp_path)
    assert note.startswith("trust on first use") and digest[:16] in note and str(SIZE) in note
    pinned = loopback_entry(server.url("/m.onnx"), model, id="pinned", filename="p.onnx")
    installer.install(pinned, tmp_path)
    assert installer.trust_note(pinned, tmp_path) is None


# -- slow servers --------------------------------------------------------------------------------


def _drip_entry(server, model):
    server.files["/m.onnx"] = model
    server.drip = 0.5  # one byte every half second: the socket timeout never fires
    return loopback_entry(server.url("/m.onnx"), None)


def test_cancel_against_a_drip_server_ends_the_install_and_frees_the_lock(server, tmp_path, model):
    entry = _drip_entry(server, model)
    cancel = threading.Event()
    outcome = {}

    def install():
        try:
            installer.install(entry, tmp_path, cancel=cancel.is_set, timeout=5)
        except Exception as exc:  # noqa: BLE001 - looked at below
            outcome["error"] = exc

    worker = threading.Thread(target=install)
    worker.start()
    while server.dripped < 3:
        time.sleep(0.05)
    cancel.set()
    dripped_at_cancel = server.dripped
    worker.join(30)
    assert not worker.is_alive(), "the install kept going after Cancel"
    assert isinstance(outcome["error"], OperationCancelled)
    # measured in the server's own ticks: at most two seconds of drip after the Cancel (the
    # figure itself comes from bench/download_cancel.py)
    assert server.dripped - dripped_at_cancel <= 4
    kept = installer.part_path(entry, tmp_path).stat().st_size
    assert kept >= 3 and f"after {kept} bytes" in str(outcome["error"])
    # the lock went with it: another install may start at once (and is cancelled before it reads)
    with pytest.raises(OperationCancelled):
        installer.install(entry, tmp_path, cancel=lambda: True, lock_wait=0)


def test_a_drip_server_is_a_stall_naming_the_bytes_that_arrived(server, tmp_path, model):
    entry = _drip_entry(server, model)
    limits = TransferLimits(stall_seconds=1.5, stall_bytes=1024)
    with pytest.raises(ModelInstallError, match="the transfer stalled") as info:
        installer.install(entry, tmp_path, timeout=5, limits=limits)
    kept = installer.part_path(entry, tmp_path).stat().st_size
    message = str(info.value)
    assert kept > 0 and f"{kept} bytes arrived and are kept" in message
    assert "came in the last 1.5 s" in message and "below 1024" in message
    _nothing_installed(entry, tmp_path)


def test_the_overall_deadline_ends_a_slow_but_steady_transfer(server, tmp_path, model):
    server.files["/m.onnx"] = model
    server.throttle = 0.2  # 16 KiB every 0.2 s: never a stall under these limits
    entry = loopback_entry(server.url("/m.onnx"), None)
    limits = TransferLimits(stall_seconds=30, stall_bytes=1, deadline_seconds=1.0)
    with pytest.raises(ModelInstallError, match="did not finish within 1 s") as info:
        installer.install(entry, tmp_path, chunk_size=CHUNK, limits=limits)
    kept = installer.part_path(entry, tmp_path).stat().st_size
    assert 0 < kept < SIZE and f"{kept} bytes arrived" in str(info.value)
    _nothing_installed(entry, tmp_path)


def test_catalog_entries_are_all_https():
    from lean_image_ai.models.store.builtin_models import BUILTIN_ENTRIES

    assert all(e.url is None or e.url.startswith("https://") for e in BUILTIN_ENTRIES)
    assert isinstance(BUILTIN_ENTRIES[0], CatalogEntry)
