"""The installer against a real loopback HTTP server (no mocked HTTP)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from lean_image_ai.models.store import installer
from lean_image_ai.models.store.catalog import BUILTIN_ENTRIES, Catalog
from lean_image_ai.runtime.errors import ModelFileError, ModelInstallError, OperationCancelled
from model_server import loopback_entry, loopback_http, onnx_payload
from polling import wait_until

PAYLOAD_SIZE = 300 * 1024
CHUNK = 16 * 1024


@pytest.fixture
def payload() -> bytes:
    # a real model: an entry without a catalog checksum is installed only once it loads
    return onnx_payload(PAYLOAD_SIZE)


def _tiny_onnx_bytes() -> bytes:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, None, None])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, None, None])
    node = helper.make_node("Resize", ["input", "", "scales"], ["output"], mode="nearest")
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1.0, 1.0, 4.0, 4.0])
    graph = helper.make_graph([node], "sr4x", [x], [y], initializer=[scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


# -- success ---------------------------------------------------------------------------------


def test_install_verifies_and_reports_progress(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), payload)
    calls: list[tuple[int, int | None]] = []

    path = installer.install(
        entry, tmp_path / "models", progress=lambda d, t: calls.append((d, t)), chunk_size=CHUNK
    )

    assert path == tmp_path / "models" / "test-model.onnx" == installer.model_path(entry, tmp_path / "models")
    assert path.read_bytes() == payload
    assert not installer.part_path(entry, tmp_path / "models").exists()
    done = [d for d, _ in calls]
    assert done == sorted(done), "progress must never go backwards"
    assert len(calls) > 3, "progress should be reported per chunk"
    assert calls[-1] == (PAYLOAD_SIZE, PAYLOAD_SIZE)
    assert all(t == PAYLOAD_SIZE for _, t in calls)
    sidecar = json.loads(installer.sidecar_path(entry, tmp_path / "models").read_text())
    assert sidecar["sha256"] == entry.sha256
    assert sidecar["size"] == PAYLOAD_SIZE
    assert sidecar["mtime_ns"] == path.stat().st_mtime_ns
    assert installer.is_installed(entry, tmp_path / "models")


def test_install_real_onnx_model_loads_in_onnxruntime(server, tmp_path):
    import numpy as np
    import onnxruntime as ort

    data = _tiny_onnx_bytes()
    server.files["/sr.onnx"] = data
    entry = loopback_entry(server.url("/sr.onnx"), data)
    path = installer.install(entry, tmp_path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = session.run(None, {"input": np.ones((1, 3, 2, 3), np.float32)})[0]
    assert out.shape == (1, 3, 8, 12)


def test_already_installed_model_is_not_downloaded_again(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), payload)
    installer.install(entry, tmp_path)
    assert len(server.requests) == 1
    installer.install(entry, tmp_path)
    assert len(server.requests) == 1


def test_entry_without_checksum_installs_and_records_what_it_got(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), None)  # size and sha256 unknown
    path = installer.install(entry, tmp_path)
    assert path.read_bytes() == payload
    sidecar = json.loads(installer.sidecar_path(entry, tmp_path).read_text())
    assert sidecar["sha256"] == hashlib.sha256(payload).hexdigest()
    assert sidecar["expected_sha256"] is None


# -- failures with clear messages ------------------------------------------------------------


def test_404_names_url_folder_and_filename(server, payload, tmp_path):
    entry = loopback_entry(server.url("/missing.onnx"), payload)
    with pytest.raises(ModelInstallError) as info:
        installer.install(entry, tmp_path / "models")
    msg = str(info.value)
    assert entry.url in msg
    assert "404" in msg
    assert str(tmp_path / "models") in msg
    assert "test-model.onnx" in msg
    assert not (tmp_path / "models" / "test-model.onnx").exists()


def test_connection_refused_is_a_clear_error(payload, tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/m.onnx"
    entry = loopback_entry(url, payload)
    with pytest.raises(ModelInstallError) as info, loopback_http():
        installer.install(entry, tmp_path, timeout=5)
    msg = str(info.value)
    assert url in msg
    assert "connection was refused" in msg
    assert str(tmp_path) in msg


def test_server_that_never_answers_times_out(server, payload, tmp_path):
    """The server holds its answer until the test lets go: the install can only come back
    before that by its own timeout (no clock is read, so a slow machine cannot fail this; an
    installer that ignored its timeout would wait for the answer and then succeed)."""
    server.files["/slow.onnx"] = payload
    server.hold = threading.Event()
    entry = loopback_entry(server.url("/slow.onnx"), payload)
    try:
        with pytest.raises(ModelInstallError, match="timed out") as info:
            installer.install(entry, tmp_path, timeout=0.3)  # returns while the server still holds
    finally:
        server.hold.set()
    assert server.held == 1 and len(server.requests) == 1, "one attempt, no silent retries"
    assert entry.url in str(info.value)
    assert not installer.model_path(entry, tmp_path).exists()


def test_truncated_transfer_then_resume_with_range(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), payload)
    cut = 100 * 1024
    server.truncate_after = cut

    with pytest.raises(ModelInstallError) as info:
        installer.install(entry, tmp_path, chunk_size=CHUNK)
    assert "cut off" in str(info.value)
    assert entry.url in str(info.value)
    part = installer.part_path(entry, tmp_path)
    assert part.stat().st_size == cut
    assert not installer.model_path(entry, tmp_path).exists()

    calls = []
    path = installer.install(entry, tmp_path, progress=lambda d, t: calls.append(d), chunk_size=CHUNK)
    assert server.requests[-1]["range"] == f"bytes={cut}-"
    assert server.requests[0]["range"] is None
    assert calls[0] == cut, "progress of a resumed download starts at the bytes already there"
    assert path.read_bytes() == payload
    assert not part.exists()


def test_wrong_checksum_leaves_nothing_behind(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), payload, sha256=hashlib.sha256(b"other").hexdigest())
    with pytest.raises(ModelInstallError) as info:
        installer.install(entry, tmp_path)
    msg = str(info.value)
    assert entry.sha256 in msg
    assert hashlib.sha256(payload).hexdigest() in msg
    assert not installer.model_path(entry, tmp_path).exists()
    assert not installer.part_path(entry, tmp_path).exists()
    assert not installer.sidecar_path(entry, tmp_path).exists()


def test_size_mismatch_is_refused_and_cleaned_up(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), payload, size_bytes=PAYLOAD_SIZE + 1)
    with pytest.raises(ModelInstallError) as info:
        installer.install(entry, tmp_path)
    msg = str(info.value)
    assert str(PAYLOAD_SIZE + 1) in msg and str(PAYLOAD_SIZE) in msg
    assert not installer.part_path(entry, tmp_path).exists()
    assert not installer.model_path(entry, tmp_path).exists()


def test_complete_part_from_earlier_run_is_only_verified(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), payload, sha256=None)
    part = installer.part_path(entry, tmp_path)
    part.write_bytes(payload)  # a complete .part from an earlier run
    path = installer.install(entry, tmp_path)
    assert server.requests == [], "a complete .part only needs verification"
    assert path.read_bytes() == payload


def test_server_ignoring_range_restarts_cleanly(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    server.ignore_range = True
    entry = loopback_entry(server.url("/m.onnx"), payload)
    part = installer.part_path(entry, tmp_path)
    part.write_bytes(b"\xff" * 5000)  # stale bytes that must not end up in the file
    path = installer.install(entry, tmp_path, chunk_size=CHUNK)
    assert server.requests[0]["range"] == "bytes=5000-"
    assert path.read_bytes() == payload


def test_part_larger_than_remote_file_restarts(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    # size unknown; a checksum, so the .part (with no validator record) may be resumed: the
    # server's 416 says it does not fit
    entry = loopback_entry(server.url("/m.onnx"), None, sha256=hashlib.sha256(payload).hexdigest())
    part = installer.part_path(entry, tmp_path)
    part.write_bytes(os.urandom(PAYLOAD_SIZE + 10))
    path = installer.install(entry, tmp_path)
    assert [r["range"] for r in server.requests] == [f"bytes={PAYLOAD_SIZE + 10}-", None]
    assert path.read_bytes() == payload


# -- a resume proves the server still has the same file ---------------------------------------


def _cut_download(server, entry, tmp_path, cut):
    server.truncate_after = cut
    with pytest.raises(ModelInstallError, match="cut off"):
        installer.install(entry, tmp_path, chunk_size=CHUNK)
    assert installer.part_path(entry, tmp_path).stat().st_size == cut


@pytest.mark.parametrize("validator", ["etag", "last_modified"])
def test_resume_after_the_server_file_changed_restarts_from_zero(server, payload, tmp_path, validator):
    """The file at the URL changes between the cut-off request and the resume: the result is the
    new file whole, never old start + new end (entries without size or checksum, like DA3)."""
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), None)  # no size, no sha256
    _cut_download(server, entry, tmp_path, 100 * 1024)
    record = json.loads((tmp_path / "test-model.onnx.part.json").read_text())
    if validator == "last_modified":  # a server that sends no ETag: Last-Modified proves it
        record["etag"] = None
        (tmp_path / "test-model.onnx.part.json").write_text(json.dumps(record))
    new = onnx_payload(PAYLOAD_SIZE, seed=1)  # same size: only a validator can tell them apart
    server.files["/m.onnx"] = new

    path = installer.install(entry, tmp_path, chunk_size=CHUNK)

    resume = server.requests[-1]
    assert resume["range"] == "bytes=102400-"
    assert resume["if_range"] == (record["etag"] or record["last_modified"])
    assert path.read_bytes() == new
    assert not installer.part_path(entry, tmp_path).exists()
    assert not (tmp_path / "test-model.onnx.part.json").exists()
    sidecar = json.loads(installer.sidecar_path(entry, tmp_path).read_text())
    assert sidecar["sha256"] == sidecar["first_sha256"] == hashlib.sha256(new).hexdigest()


def test_resume_of_an_unchanged_file_appends(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), None)
    _cut_download(server, entry, tmp_path, 100 * 1024)
    path = installer.install(entry, tmp_path, chunk_size=CHUNK)
    assert server.requests[-1]["if_range"] is not None
    assert len(server.requests) == 2, "resumed, not restarted"
    assert path.read_bytes() == payload


def test_server_ignoring_if_range_is_caught_by_its_etag(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    server.honour_if_range = False  # sends the range of the *new* file
    entry = loopback_entry(server.url("/m.onnx"), None)
    _cut_download(server, entry, tmp_path, 100 * 1024)
    new = onnx_payload(PAYLOAD_SIZE, seed=1)
    server.files["/m.onnx"] = new
    path = installer.install(entry, tmp_path, chunk_size=CHUNK)
    assert [r["range"] for r in server.requests[1:]] == ["bytes=102400-", None]
    assert path.read_bytes() == new


def test_part_without_validator_or_checksum_starts_over(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    server.validators = False
    entry = loopback_entry(server.url("/m.onnx"), None)
    _cut_download(server, entry, tmp_path, 100 * 1024)
    new = onnx_payload(PAYLOAD_SIZE, seed=1)
    server.files["/m.onnx"] = new
    path = installer.install(entry, tmp_path, chunk_size=CHUNK)
    assert server.requests[-1]["range"] is None, "nothing proves the .part is the same file"
    assert path.read_bytes() == new


def test_entry_without_checksum_shows_a_later_change(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), None)
    path = installer.install(entry, tmp_path)
    changed = bytearray(payload)
    changed[1000] ^= 0xFF
    path.write_bytes(bytes(changed))
    with pytest.raises(ModelFileError) as info:
        installer.verify_installed(entry, tmp_path)
    msg = str(info.value)
    assert "changed since it was installed" in msg and hashlib.sha256(payload).hexdigest() in msg
    assert "install again" in msg
    assert not installer.is_installed(entry, tmp_path)


def test_html_page_instead_of_model_is_rejected(server, tmp_path):
    page = b"<!DOCTYPE html><html><body>Sign in to continue</body></html>"
    server.files["/m.onnx"] = page
    entry = loopback_entry(server.url("/m.onnx"), None)
    with pytest.raises(ModelInstallError, match="web page"):
        installer.install(entry, tmp_path)
    assert not installer.model_path(entry, tmp_path).exists()
    assert not installer.part_path(entry, tmp_path).exists()


def test_cancel_keeps_part_and_a_later_install_resumes(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    server.throttle = 0.002
    entry = loopback_entry(server.url("/m.onnx"), payload)
    seen: list[int] = []

    def cancel() -> bool:
        return len(seen) >= 4

    with pytest.raises(OperationCancelled) as info:
        installer.install(
            entry, tmp_path, progress=lambda d, t: seen.append(d), cancel=cancel, chunk_size=CHUNK
        )
    part = installer.part_path(entry, tmp_path)
    assert not installer.model_path(entry, tmp_path).exists()
    kept = part.stat().st_size
    assert 0 < kept < PAYLOAD_SIZE
    assert str(part) in str(info.value)

    path = installer.install(entry, tmp_path, chunk_size=CHUNK)
    assert server.requests[-1]["range"] == f"bytes={kept}-"
    assert path.read_bytes() == payload


def test_cancel_before_start_sends_no_request(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), payload)
    with pytest.raises(OperationCancelled):
        installer.install(entry, tmp_path, cancel=lambda: True)
    assert server.requests == []


def test_entry_without_url_tells_the_user_what_to_do(tmp_path):
    entry = Catalog().get("upscale-realesr-general-wdn-x4v3")
    assert entry.url is None
    with pytest.raises(ModelInstallError) as info:
        installer.install(entry, tmp_path / "models")
    msg = str(info.value)
    assert "register" in msg
    assert str(tmp_path / "models") in msg
    assert entry.filename in msg


def test_user_model_install_returns_its_own_path(tmp_path):
    own = tmp_path / "elsewhere" / "mine.onnx"
    own.parent.mkdir()
    own.write_bytes(b"\x08\x07onnx")
    entry = Catalog().add_user_model("upscale", own)
    assert installer.install(entry, tmp_path / "models") == own.resolve()
    assert installer.is_installed(entry, tmp_path / "models")
    assert not installer.remove(entry, tmp_path / "models")
    assert own.exists(), "remove() never deletes a user's own file"
    own.unlink()
    with pytest.raises(ModelFileError):
        installer.install(entry, tmp_path / "models")


def test_nothing_beside_a_registered_file_is_written_or_deleted(tmp_path):
    """A registered model with a sha256 is verified with a record in the models folder; removing
    the entry deletes only that record, never `<its path>.part` and the like (the user's files)."""
    from dataclasses import replace

    from lean_image_ai.models.store import library

    own_folder = tmp_path / "thesis"
    own_folder.mkdir()
    own = own_folder / "thesis.docx"
    own.write_bytes(b"the model bytes")
    neighbours = {f"thesis.docx{s}": f"user's {s}".encode() for s in (".part", ".part.json", ".verified.json")}
    for name, data in neighbours.items():
        (own_folder / name).write_bytes(data)
    models = tmp_path / "models"
    entry = replace(
        Catalog().add_user_model("upscale", own), sha256=hashlib.sha256(b"the model bytes").hexdigest()
    )
    assert installer.verify_installed(entry, models) == own.resolve()
    record = installer.sidecar_path(entry, models)
    assert record.parent == models / installer.USER_RECORDS_DIR and record.is_file()
    assert json.loads(record.read_text())["sha256"] == entry.sha256
    assert installer.is_verified(entry, models)  # the record vouches without re-hashing

    assert library.remove(entry, models) is True  # the record went
    assert not record.exists()
    assert own.read_bytes() == b"the model bytes"
    assert {p.name: p.read_bytes() for p in own_folder.iterdir() if p != own} == neighbours


# -- installed state without re-hashing ------------------------------------------------------


def test_is_installed_does_not_rehash_unchanged_files(server, payload, tmp_path, monkeypatch):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), payload)
    path = installer.install(entry, tmp_path)

    hashed: list[str] = []
    real = installer.sha256_file

    def counting(p, cancel=None):
        hashed.append(str(p))
        return real(p, cancel=cancel)

    monkeypatch.setattr(installer, "sha256_file", counting)
    for _ in range(3):
        assert installer.is_installed(entry, tmp_path)
    assert hashed == []

    # A new mtime (same bytes) forces one re-hash, which renews the record.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert installer.is_installed(entry, tmp_path) and installer.is_installed(entry, tmp_path)
    assert len(hashed) == 1


@pytest.mark.parametrize("checksum", [True, False], ids=["catalog sha256", "trust on first use"])
@pytest.mark.parametrize("how", ["in place", "replaced"])
def test_a_file_tampered_with_its_size_and_mtime_kept_is_hashed_and_refused(server, payload, tmp_path, monkeypatch, how, checksum):
    """Issue #39 item 11: the sidecar's key held size and mtime only, so other bytes written in
    place (or a copy moved over it) with the mtime set back were still "installed" and used."""
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), payload if checksum else None)
    path = installer.install(entry, tmp_path)
    assert installer.is_installed(entry, tmp_path)
    hashed: list[str] = []
    real = installer.sha256_file
    monkeypatch.setattr(installer, "sha256_file", lambda p, cancel=None: hashed.append(str(p)) or real(p, cancel=cancel))
    st = path.stat()
    damaged = bytearray(payload)
    damaged[1000] ^= 0xFF
    if how == "in place":
        path.write_bytes(bytes(damaged))
    else:
        (tmp_path / "other").write_bytes(bytes(damaged))
        os.replace(tmp_path / "other", path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert not installer.is_installed(entry, tmp_path)
    assert len(hashed) == 1
    with pytest.raises(ModelFileError, match="sha256" if checksum else "changed since it was installed"):
        installer.verify_installed(entry, tmp_path)


def test_a_size_change_is_caught_without_hashing(server, payload, tmp_path, monkeypatch):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), payload)
    path = installer.install(entry, tmp_path)
    hashed: list[str] = []
    real = installer.sha256_file
    monkeypatch.setattr(installer, "sha256_file", lambda p, cancel=None: hashed.append(str(p)) or real(p, cancel=cancel))

    # A size change is caught by stat alone.
    path.write_bytes(payload + b"x")
    hashed.clear()
    assert not installer.is_installed(entry, tmp_path)
    assert hashed == []

    # Restored content: one re-hash, then the refreshed sidecar avoids further ones.
    path.write_bytes(payload)
    hashed.clear()
    assert installer.is_installed(entry, tmp_path)
    assert installer.is_installed(entry, tmp_path)
    assert len(hashed) == 1


def test_missing_sidecar_costs_one_rehash(server, payload, tmp_path, monkeypatch):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), payload)
    installer.install(entry, tmp_path)
    installer.sidecar_path(entry, tmp_path).unlink()
    count = []
    real = installer.sha256_file
    monkeypatch.setattr(
        installer, "sha256_file", lambda p, cancel=None: count.append(1) or real(p, cancel=cancel)
    )
    assert installer.is_installed(entry, tmp_path)
    assert installer.is_installed(entry, tmp_path)
    assert len(count) == 1
    assert installer.sidecar_path(entry, tmp_path).exists()


def test_file_dropped_in_by_hand_is_recognised(payload, tmp_path):
    entry = loopback_entry("https://huggingface.co/x/y/resolve/main/m.onnx", payload)
    assert not installer.is_installed(entry, tmp_path)
    installer.model_path(entry, tmp_path).write_bytes(payload)
    assert installer.is_installed(entry, tmp_path)
    installer.model_path(entry, tmp_path).write_bytes(payload[:-1])
    assert not installer.is_installed(entry, tmp_path)


def test_remove_deletes_file_sidecar_and_part(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    entry = loopback_entry(server.url("/m.onnx"), payload)
    path = installer.install(entry, tmp_path)
    part = installer.part_path(entry, tmp_path)
    part.write_bytes(b"partial")
    assert installer.remove(entry, tmp_path)
    assert not path.exists()
    assert not installer.sidecar_path(entry, tmp_path).exists()
    assert not part.exists()
    assert not installer.is_installed(entry, tmp_path)
    assert not installer.remove(entry, tmp_path)


def test_install_runs_in_worker_threads(server, payload, tmp_path):
    """Two different models download at once from worker threads (no shared state)."""
    other = os.urandom(PAYLOAD_SIZE // 2)
    server.files["/a.onnx"] = payload
    server.files["/b.onnx"] = other
    a = loopback_entry(server.url("/a.onnx"), payload, id="a", filename="a.onnx")
    b = loopback_entry(server.url("/b.onnx"), other, id="b", filename="b.onnx")
    results: dict[str, object] = {}

    def work(entry):
        try:
            results[entry.id] = installer.install(entry, tmp_path, chunk_size=CHUNK)
        except Exception as exc:  # pragma: no cover - reported by the assert below
            results[entry.id] = exc

    threads = [threading.Thread(target=work, args=(e,)) for e in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert Path(results["a"]).read_bytes() == payload
    assert Path(results["b"]).read_bytes() == other


def test_builtin_model_paths_live_in_the_models_dir(tmp_path):
    for entry in BUILTIN_ENTRIES:
        assert installer.model_path(entry, tmp_path) == tmp_path / entry.filename
        assert not installer.is_installed(entry, tmp_path)


# -- two processes installing the same model into one folder ---------------------------------


def _install_process(server, tmp_path, payload, *, sha: bool, wait: float) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("install_job.py")),
            server.url("/m.onnx"),
            str(tmp_path),
            "-",
            hashlib.sha256(payload).hexdigest() if sha else "-",
            str(wait),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _outcome(proc: subprocess.Popen) -> tuple[list[str], dict]:
    out, err = proc.communicate(timeout=120)
    lines = out.strip().splitlines()
    assert lines, err
    return lines, json.loads(lines[-1])


@pytest.mark.parametrize("sha", [True, False], ids=["with-checksum", "no-checksum"])
def test_second_process_waits_then_finds_the_model_installed(server, payload, tmp_path, sha):
    """Process A is held mid-request by the server (holding the install); process B starts, must
    wait for A, then find the model installed without a download of its own."""
    server.files["/m.onnx"] = payload
    server.hold = threading.Event()
    first = _install_process(server, tmp_path, payload, sha=sha, wait=60)
    second = None
    try:
        wait_until(lambda: server.held == 1, "the first install's request")
        second = _install_process(server, tmp_path, payload, sha=sha, wait=60)
        assert second.stdout.readline().startswith("waiting: process"), "B must wait for A"
        server.hold.set()
        _, a = _outcome(first)
        lines, b = _outcome(second)
    finally:
        server.hold.set()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert a["ok"] and b["ok"], (a, b)
    assert len(server.requests) == 1, "the second process found the model installed"
    dest = tmp_path / "test-model.onnx"
    assert dest.read_bytes() == payload
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test-model.onnx", "test-model.onnx.verified.json"]


def test_second_process_that_cannot_wait_says_another_is_installing(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    server.hold = threading.Event()
    first = _install_process(server, tmp_path, payload, sha=False, wait=60)
    try:
        wait_until(lambda: server.held == 1, "the first install's request")
        second = _install_process(server, tmp_path, payload, sha=False, wait=0.3)
        lines, b = _outcome(second)
        server.hold.set()
        _, a = _outcome(first)
    finally:
        server.hold.set()
        if first.poll() is None:
            first.kill()
    assert not b["ok"]
    assert f"process {first.pid} on" in b["error"]
    assert "being installed" in b["error"] and "Wait for that install to finish" in b["error"]
    assert a["ok"] and (tmp_path / "test-model.onnx").read_bytes() == payload
    assert len(server.requests) == 1


def test_a_crashed_installer_releases_its_lock(server, payload, tmp_path):
    server.files["/m.onnx"] = payload
    server.hold = threading.Event()
    first = _install_process(server, tmp_path, payload, sha=False, wait=60)
    wait_until(lambda: server.held == 1, "the first install's request")
    first.kill()  # dies holding the lock
    first.communicate(timeout=30)
    server.hold.set()
    second = _install_process(server, tmp_path, payload, sha=False, wait=5)
    lines, b = _outcome(second)
    assert b["ok"], b
    assert not any(line.startswith("waiting") for line in lines)
    assert (tmp_path / "test-model.onnx").read_bytes() == payload
