"""Devices as rows: every difference between devices is a column of runtime/providers.py's table.

A toy device added from this file alone (it cannot exist here, so its provider is one onnxruntime
does not have) gets the device string, the fallback warning, the release rule and the rest from
its row, on the real code path with the real onnxruntime. A scan of the package keeps provider
and device-kind comparisons inside the table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from lean_image_ai.models.store.library import prefer_for_device
from lean_image_ai.runtime import Runtime, mark_last
from lean_image_ai.runtime.errors import ProviderUnavailableError
from lean_image_ai.runtime.providers import (
    CPU,
    DEVICE_BY_KIND,
    NVIDIA_PROVIDERS,
    UNLOAD,
    DeviceKind,
    DeviceRequest,
    add_device,
    device_help,
    fallback_device,
    measured_gpu,
    parse_device,
    remove_device,
    resolve_providers,
)
from lean_image_ai.ui.cli import main as cli
from onnx_builders import conv_model
from test_device_release import ReportingFactory

TOY = "ToyExecutionProvider"
PACKAGE = Path(__file__).resolve().parents[1]


@pytest.fixture
def toy():
    row = add_device(
        DeviceKind("toy", TOY, "Toy", True, 3, None, lambda request, choices: {"device_id": str(request.index)}, UNLOAD)
    )
    yield row
    remove_device("toy")


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conv_model(tmp_path_factory.mktemp("models") / "conv.onnx")


def frame(seed=0):
    return np.random.default_rng(seed).random((1, 3, 32, 32), dtype=np.float32)


def two_runs(runtime, model, device, out=None):
    with runtime.operation("job") as op:
        handle = op.session(model, device)
        outputs = [op.run(handle, {"x": f}, last=last, out=out)["y"] for f, last in mark_last([frame(), frame(1)])]
    return op, handle, outputs


def test_a_new_row_is_a_device_string_everywhere(toy, capsys):
    assert parse_device("toy:2") == DeviceRequest("toy", 2) and str(parse_device(" TOY ")) == "toy:0"
    assert "toy, toy:N" in device_help()
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["upscale", "--help"])
    assert "toy, toy:N" in " ".join(capsys.readouterr().out.split())  # the command line's --device
    assert measured_gpu(DeviceRequest("toy", 1)) is None  # its memory is not measurable: RAM budgets
    assert [e.id for e in prefer_for_device(_entries(), "toy")] == ["fp32", "fp16"]  # no fp16 preference
    with pytest.raises(ProviderUnavailableError, match="or install the onnxruntime build for that device"):
        resolve_providers(DeviceRequest("toy"), [CPU])
    remove_device("toy")
    with pytest.raises(Exception, match="Unknown device 'toy'"):
        parse_device("toy")
    add_device(toy)  # the fixture removes it again


def _entries():
    class Entry:
        def __init__(self, id, dtype):
            self.id, self.weight_dtype = id, dtype

    return [Entry("fp16", "float16"), Entry("fp32", "float32")]


def test_a_new_row_that_lands_on_cpu_gets_the_fallback_warning(conv, toy):
    """The real onnxruntime has no toy provider: it runs the session on CPU, and the row's
    fallback warning says so, once, though no code names the toy device."""
    runtime = Runtime(available_providers=lambda: [TOY, CPU])
    op, handle, outputs = two_runs(runtime, conv, "toy")
    assert handle.providers == [CPU]
    assert handle.fallback_warning == (
        "Toy was requested for conv.onnx but the session runs on CPU: Toy could not be used here. Check its "
        "driver and that the onnxruntime build for that device is installed; results are correct but slower."
    )
    assert [e["message"] for e in runtime.events.recent("provider_fallback")] == [handle.fallback_warning]
    assert fallback_device(handle.fallback_warning) is toy and not toy.addon_libraries
    assert np.isfinite(outputs[1]).all()


def test_a_new_row_that_runs_gets_its_release_rule(conv, toy):
    """Landed on the toy device (a real CPU session that reports it): its release rule unloads the
    session when the job ends, no shrink entry is sent, no binding is tried, no VRAM is read."""
    factory = ReportingFactory([TOY, CPU], {TOY: {"device_id": "1"}})
    runtime = Runtime(session_factory=factory, available_providers=lambda: [TOY, CPU])
    target = np.zeros((1, 3, 32, 32), np.float32)
    op, handle, outputs = two_runs(runtime, conv, "toy:1", out={"y": target})
    assert factory.calls[0]["providers"] == [(TOY, {"device_id": "1"}), (CPU, {})]
    assert handle.fallback_warning is None and handle.device is toy
    assert handle.release == UNLOAD and handle.session is None and op.unloaded["sessions"] == 1
    assert factory.shrink_entries == ["", ""]
    assert handle.gpu_device_id is None and handle.device_label == "Toy"
    assert outputs[1] is target and np.isfinite(target).all()  # copied into the caller's array
    assert any("release rule: Toy: unload" in line for line in op.memory["lines"])


def test_a_row_without_a_known_release_rule_is_refused():
    with pytest.raises(ValueError, match="release must be one of"):
        DeviceKind("odd", "OddExecutionProvider", "Odd", False, None, None, lambda r, c: {}, "sometimes")


def test_the_nvidia_rows_and_their_neighbours_come_from_the_table():
    assert DEVICE_BY_KIND["cuda"].provider in NVIDIA_PROVIDERS and "TensorrtExecutionProvider" in NVIDIA_PROVIDERS
    assert CPU not in NVIDIA_PROVIDERS


# Modules that exist for one device: the CUDA libraries' own loader and the doctor's CUDA probe
ONE_DEVICE_MODULES = ("runtime/cuda/", "runtime/log/diagnostics.py")
PROVIDER_NAMES = {"CUDA", "CPU", "DML", "COREML"}
DEVICE_WORDS = {"cuda", "directml", "coreml", "cpu", "dml"}


def _names_a_device(node: ast.AST) -> bool:
    for part in ast.walk(node):
        if isinstance(part, ast.Name) and part.id in PROVIDER_NAMES:
            return True
        if isinstance(part, ast.Constant) and isinstance(part.value, str):
            if part.value.endswith("ExecutionProvider") or part.value.lower() in DEVICE_WORDS:
                return True
    return False


def test_no_provider_or_device_kind_is_compared_outside_the_table():
    """`if provider == ...` or `kind == "cuda"` outside runtime/providers.py is a difference between
    devices that a new row would not get: it belongs in a column."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.split("/")[0] in ("tests", "bench", "tools", "examples") or relative == "runtime/providers.py":
            continue
        if any(part.startswith(".") for part in relative.split("/")):  # .venv (CI's is in the checkout), .git
            continue
        if relative.startswith(ONE_DEVICE_MODULES):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            compares = isinstance(node, ast.Compare) and any(
                isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
            )
            if compares and _names_a_device(node):
                found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
