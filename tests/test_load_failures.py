"""A model that cannot be loaded is blamed on the true cause (real onnxruntime, real files; the
OS's permission and busy errors injected at the OS call where this machine runs as root), and
the next valid job in the same process works."""

from __future__ import annotations

import errno
import os

import numpy as np
import onnx
import pytest
from lean_image_ai.runtime import ModelFileError, Runtime
from onnx import TensorProto, helper
from onnx_builders import conv_model


@pytest.fixture
def good(tmp_path):
    return conv_model(tmp_path / "good.onnx", mid_channels=4)


def _next_job_works(runtime: Runtime, good):
    with runtime.operation("next") as op:
        handle = op.session(good, "cpu")
        op.run(handle, {handle.inputs[0].name: np.zeros((1, 3, 8, 8), np.float32)}, last=True)


def _relu_model(path, *, opset=17, domain="", op="Relu", ir=8):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], domain=domain)], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = ir
    onnx.save(model, path)
    return path


def _inject_os_error(monkeypatch, target, error):
    real_open = os.open

    def failing_open(path, flags, *args, **kwargs):
        if os.fspath(path) == os.fspath(target):
            raise error
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing_open)


def _assert_not_blamed_on_the_file(msg):
    assert "install it again" not in msg and "corrupt" not in msg


def test_permission_denied_is_not_called_corrupt(good, monkeypatch):
    runtime = Runtime()
    _inject_os_error(monkeypatch, good, PermissionError(errno.EACCES, "Permission denied", str(good)))
    with pytest.raises(ModelFileError) as info:
        runtime.session(good, "cpu")
    msg = str(info.value)
    assert "Permission denied" in msg and str(good) in msg and "read permission" in msg
    _assert_not_blamed_on_the_file(msg)
    monkeypatch.undo()
    _next_job_works(runtime, good)


@pytest.mark.skipif(os.name == "nt" or os.geteuid() == 0, reason="root reads a mode-000 file")
def test_mode_000_file_as_a_normal_user(good):
    good.chmod(0)
    try:
        with pytest.raises(ModelFileError, match="Permission denied"):
            Runtime().session(good, "cpu")
    finally:
        good.chmod(0o644)


def test_busy_file_says_busy(good, monkeypatch):
    runtime = Runtime()
    _inject_os_error(monkeypatch, good, OSError(errno.ETXTBSY, "Text file busy", str(good)))
    with pytest.raises(ModelFileError) as info:
        runtime.session(good, "cpu")
    msg = str(info.value)
    assert "busy" in msg and "run the job again" in msg
    _assert_not_blamed_on_the_file(msg)
    monkeypatch.undo()
    _next_job_works(runtime, good)


def test_truncated_model_names_its_size(tmp_path, good):
    data = good.read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 3])
    runtime = Runtime()
    with pytest.raises(ModelFileError) as info:
        runtime.session(cut, "cpu")
    msg = str(info.value)
    assert f"{len(data) // 3:,} bytes" in msg and "truncated" in msg and "install it again" in msg
    assert runtime.cached_sessions() == []
    _next_job_works(runtime, good)


@pytest.mark.parametrize(
    "kind,build,expect",
    [
        ("opset", dict(opset=99), ["opset 99", "up to opset"]),
        ("custom-op", dict(domain="my.domain", op="FancyOp"), ["my.domain:FancyOp"]),
        ("ir-version", dict(ir=99), ["IR version 99"]),
    ],
)
def test_operator_or_opset_onnxruntime_lacks(tmp_path, good, kind, build, expect):
    import onnxruntime

    model = _relu_model(tmp_path / f"{kind}.onnx", **build)
    runtime = Runtime()
    with pytest.raises(ModelFileError) as info:
        runtime.session(model, "cpu")
    msg = str(info.value)
    for text in expect:
        assert text in msg
    assert f"onnxruntime {onnxruntime.__version__}" in msg and "not damaged" in msg
    _assert_not_blamed_on_the_file(msg)
    _next_job_works(runtime, good)


def test_symlink_loop_is_named(tmp_path, good):
    loop = tmp_path / "loop.onnx"
    loop.symlink_to(tmp_path / "loop2.onnx")
    (tmp_path / "loop2.onnx").symlink_to(loop)
    runtime = Runtime()
    with pytest.raises(ModelFileError) as info:
        runtime.session(loop, "cpu")
    assert "link loop" in str(info.value) and "Replace the link" in str(info.value)
    _next_job_works(runtime, good)


def test_a_folder_is_not_a_model_file(tmp_path, good):
    with pytest.raises(ModelFileError, match="is a folder: choose the .onnx file itself"):
        Runtime().session(tmp_path, "cpu")


def _cli_model(model: str, tmp_path):
    import subprocess
    import sys

    from PIL import Image

    image = tmp_path / "in.png"
    Image.fromarray(np.full((8, 8, 3), 50, np.uint8)).save(image)
    out = tmp_path / "out.png"
    command = [sys.executable, "-m", "lean_image_ai", "upscale", "--input", str(image), "--output", str(out)]
    done = subprocess.run(
        command + ["--model", model, "--device", "cpu"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert not out.exists()
    return lines[0]


def _model_paths(tmp_path) -> dict:
    folder = tmp_path / "a folder"
    folder.mkdir()
    pipe = tmp_path / "pipe.onnx"
    os.mkfifo(pipe)
    loop = tmp_path / "loop.onnx"
    loop.symlink_to(tmp_path / "loop2.onnx")
    (tmp_path / "loop2.onnx").symlink_to(loop)
    dangling = tmp_path / "gone.onnx"
    dangling.symlink_to(tmp_path / "never there.onnx")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    png = tmp_path / "photo.onnx"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    return {
        "folder": (folder, "is a folder: choose the .onnx file itself"),
        "fifo": (pipe, "is a named pipe (FIFO)"),
        "device": (os.devnull, "is a device"),
        "link-loop": (loop, "link loop"),
        "dangling-link": (dangling, "which does not exist"),
        "zero-bytes": (empty, "is empty (0 bytes)"),
        "text-file": (text, "is a text file (it begins 'root:x:0:0:root:/root:/bin/bash')"),
        "png": (png, "is a PNG image, not an ONNX model"),
    }


@pytest.mark.skipif(os.name != "posix", reason="FIFOs, /dev/null and symlinks as POSIX has them")
@pytest.mark.parametrize(
    "case", ["folder", "fifo", "device", "link-loop", "dangling-link", "zero-bytes", "text-file", "png"]
)
def test_the_cli_says_what_a_model_path_is(tmp_path, case):
    """Not "Model file not found" for what exists, and no "remove it" for a file that may be any
    of the user's."""
    path, expect = _model_paths(tmp_path)[case]
    line = _cli_model(str(path), tmp_path)
    assert expect in line and str(path) in line
    assert "not found" not in line.lower() or case == "dangling-link"
    assert "remove it" not in line.lower()
    if case in ("zero-bytes", "text-file", "png"):
        assert os.path.exists(path)
