"""One error path: every CLI option and every documented environment variable, given bad values,
ends in one line naming it and exit 2, never a traceback. Run in-process through main() (the
runtime is made once; the environment is checked on every call), so the whole table takes seconds.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pytest
from lean_image_ai.models import families
from lean_image_ai.runtime.settings import MAX_BUDGET_MB
from lean_image_ai.ui.cli import main as cli
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
GENERIC_BAD = ("abc", "nan", "1e999")  # bad for every typed option: no kind, range or syntax takes them

# bad values of the options that take free text: {option: [(value, marker)]}, where "{tmp}" is the
# test's folder and the marker is what the message must name besides (or instead of) the option
TEXT_BAD = {
    "--device": [("gpu7", "gpu7"), ("cuda:-1", "cuda:-1")],
    "--model": [("nope-model-id", "nope-model-id"), ("{tmp}/missing.onnx", "missing.onnx")],
    "--output": [("{tmp}/out.nope", "out.nope"), ("{tmp}/in.png", "in.png")],
    "output": [("{tmp}/out.nope", "out.nope"), ("{tmp}/in.png", "in.png")],
    "--input": [("{tmp}/missing.png", "missing.png"), ("{tmp}/empty", "empty")],
    "input": [("{tmp}/missing.png", "missing.png"), ("{tmp}/not_an_image.png", "not_an_image.png")],
    "--memory-plot": [
        ("{tmp}/plot.jpg", "--memory-plot"),
        ("{tmp}/in.png", "--memory-plot"),
        ("{tmp}", "--memory-plot"),
        ("{tmp}/missing/plot.png", "--memory-plot"),
        ("{tmp}/taken.png", "--memory-plot"),
    ],
    "--models-dir": [("{tmp}/in.png", "in.png"), ("{tmp}/missing", "missing")],
}
EXTRA_BAD = {  # beyond GENERIC_BAD: the edges of each range
    "--frames": ["5-1", "1-30000000", "1-99999999999999999999"],
    "--shard": ["0/3", "4/3"],
    "--tile": ["-1"],
    "--runs": ["0", "-5", "3"],
    "--workers": ["-1"],
    "--threads-per-worker": ["0"],
    "--chunk-size": ["-1", "0"],
    "--max-tries": ["0"],
    "--gpus-per-worker": ["-1", "inf"],
    "--address": ["nope", "ray://"],
    "--family": ["nope"],
    "--ram-budget": ["-1", "1.5", "4GB", "0x10", "1_000", str(MAX_BUDGET_MB + 1)],
    "--vram-budget": ["-1", "1.5", "4GB", "0x10", "1_000", str(MAX_BUDGET_MB + 1)],
}
ENV_BAD = {
    "LEAN_IMAGE_AI_RAM_RELEASE_DELAY": ["abc", "-1", "nan", "inf", "0x10", "1e308"],
    "LEAN_IMAGE_AI_RELEASE_CPU": ["maybe", "2"],
    "LEAN_IMAGE_AI_CUDNN_MAX_WORKSPACE": ["maybe", "-1"],
    "LEAN_IMAGE_AI_KEEP_MODELS_LOADED_ON_DML_COREML": ["maybe"],
    "LEAN_IMAGE_AI_MAX_PIXELS": ["-1", "abc", "1.5"],
    "LEAN_IMAGE_AI_LOG_DIR": ["{tmp}/in.png"],
    "LEAN_IMAGE_AI_MODELS_DIR": ["{tmp}/in.png", "{tmp}/missing"],
    "LEAN_IMAGE_AI_RAM_BUDGET_MB": ["abc", "-1", "1.5", "nan", "4GB", "1_000", str(MAX_BUDGET_MB + 1)],
    "LEAN_IMAGE_AI_VRAM_BUDGET_MB": ["abc", "-1", "1.5", "nan", "4GB", "1_000", str(MAX_BUDGET_MB + 1)],
}
# read by no command of the CLI: the GPU runtime's folder (Blender's installer), the test caches
NOT_READ_BY_THE_CLI = {
    # dev tools and tests (tools/reference_models.py, tests/test_stock_blender.py), not the add-on
    "LEAN_IMAGE_AI_PYTHON",
    "LEAN_IMAGE_AI_STOCK_BPY",
    "LEAN_IMAGE_AI_REFERENCE_DIR",
    "LEAN_IMAGE_AI_TRAINED_DIR",
    "LEAN_IMAGE_AI_GPU_RUNTIME_DIR",
    "LEAN_IMAGE_AI_CACHE",
    "LEAN_IMAGE_AI_BUDGET_FRESH",
    "LEAN_IMAGE_AI_BUDGET_TEST",
    # tests only: Blender's model jobs in the caller's process, a test catalog in child processes,
    # the worker's fault injection (models/worker/)
    "LEAN_IMAGE_AI_IN_PROCESS",
    "LEAN_IMAGE_AI_TEST_CHILD_CATALOG",
    "LEAN_IMAGE_AI_WORKER_FAULTS",
    # the interpreter the model worker runs under (Blender and headless scripts start the worker;
    # the command line runs its jobs in its own process): a bad value is refused in one line by
    # tests/test_engine_python.py
    "LEAN_IMAGE_AI_WORKER_PYTHON",
}


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _commands():
    """(argv prefix, parser) of every command that runs something."""
    for name, sub in _subparsers(cli.build_parser()):
        if name == "farm":
            for family, farm_sub in _subparsers(sub):
                yield ["farm", family], farm_sub
        else:
            yield [name], sub


def _cases():
    cases = []
    for prefix, parser in _commands():
        command = " ".join(prefix)
        family_command = prefix[-1] in {f.command for f in families.ALL}
        for action in parser._actions:
            if action.nargs == 0 or isinstance(action, argparse._HelpAction):
                continue  # flags take no value: nothing to get wrong
            name = action.option_strings[0] if action.option_strings else (action.metavar or action.dest)  # as argparse names it
            if action.type is None and action.choices is None:  # free text: its own table
                if prefix[0] == "farm" or prefix[-1] != "upscale" and name not in ("--device",):
                    continue  # Ray (farm) or a model (no embedded one) is needed before these are read
                if prefix[0] in ("doctor", "leak-check") and name not in TEXT_BAD:
                    continue
                assert name in TEXT_BAD, f"{command} {name}: add its bad values to TEXT_BAD"
                for value, marker in TEXT_BAD[name]:
                    cases.append(pytest.param(prefix, name, value, marker, id=f"{command} {name}={value}"))
                continue
            values = list(GENERIC_BAD) + EXTRA_BAD.get(name, [])
            option = next((o for f in families.ALL for o in f.options if "--" + o.name.replace("_", "-") == name), None)
            if option is not None and option.kind is not bool:
                values += [str(option.min - 1)] if option.min is not None else []
                values += [str(option.max + 1)] if option.max is not None else []
            for value in values:
                cases.append(pytest.param(prefix, name, value, name, id=f"{command} {name}={value}"))
        assert family_command or prefix[0] != "farm"
    return cases


@pytest.fixture
def job_folder(tmp_path, monkeypatch):
    Image.fromarray(np.full((12, 16, 3), 90, np.uint8)).save(tmp_path / "in.png")
    Image.fromarray(np.full((4, 4, 3), 9, np.uint8)).save(tmp_path / "taken.png")
    (tmp_path / "not_an_image.png").write_bytes(b"this is not a PNG")
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    for variable in ENV_BAD:
        if variable != "LEAN_IMAGE_AI_LOG_DIR":
            monkeypatch.delenv(variable, raising=False)
    return tmp_path


def _main(argv, capsys) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own exit
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.err


def _argv(prefix, name, value, tmp) -> list[str]:
    value = value.replace("{tmp}", str(tmp))
    if prefix[0] in ("doctor", "leak-check"):
        base = [*prefix, "--device", "cpu"] if prefix[0] == "leak-check" and name != "--device" else list(prefix)
        return [*base, f"{name}={value}"] if name.startswith("--") else [*base, value]
    input_, output = str(tmp / "in.png"), str(tmp / "out.png")
    if name == "input":
        return [*prefix, value, output, "--device", "cpu"]
    if name == "output":
        return [*prefix, input_, value, "--device", "cpu"]
    if name == "--input":
        return [*prefix, f"--input={value}", "--output", output, "--device", "cpu"]
    if name == "--output":
        return [*prefix, input_, f"--output={value}", "--device", "cpu"]
    device = [] if name == "--device" else ["--device", "cpu"]
    return [*prefix, input_, output, *device, f"{name}={value}"]


@pytest.mark.parametrize("prefix, name, value, marker", _cases())
def test_every_bad_option_is_one_line_exit_2_naming_it(prefix, name, value, marker, job_folder, capsys):
    code, err = _main(_argv(prefix, name, value, job_folder), capsys)
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0] == err.strip().splitlines()[-1], err
    assert name in err or marker in err, err
    assert not (job_folder / "out.png").exists()


def _documented_variables() -> set[str]:
    documents = [ROOT / "README.md", *ROOT.glob("docs/*.md")]  # the README and the pages beside it
    texts = [p.read_text(errors="replace") for p in [*documents, *ROOT.glob("*.py"), *ROOT.glob("*/*.py")]]
    found = set(re.findall(r"LEAN_IMAGE_AI_[A-Z_]+[A-Z]\b", "\n".join(texts)))
    return {v for v in found if not v.startswith(("LEAN_IMAGE_AI_OT_", "LEAN_IMAGE_AI_PT_"))}  # Blender class names


def test_every_documented_variable_is_in_the_table():
    variables = _documented_variables()
    assert variables - NOT_READ_BY_THE_CLI == set(ENV_BAD), "a new LEAN_IMAGE_AI_ variable: add its bad values"


@pytest.mark.parametrize(
    "variable, value",
    [
        pytest.param(v, x, id=f"{v}={x}")
        for v, values in ENV_BAD.items()
        for x in values
    ],
)
def test_every_bad_environment_variable_is_one_line_exit_2_naming_it(variable, value, job_folder, monkeypatch, capsys):
    monkeypatch.setenv(variable, value.replace("{tmp}", str(job_folder)))
    code, err = _main(["upscale", str(job_folder / "in.png"), str(job_folder / "out.png"), "--device", "cpu"], capsys)
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert variable in err, err
    assert not (job_folder / "out.png").exists()


@pytest.mark.parametrize("address", ["auto", "ray://127.0.0.1:1"], ids=["no cluster", "ray client"])
def test_a_ray_address_that_cannot_connect_is_one_line(address, job_folder, monkeypatch, capsys):
    """`auto` with no cluster running here; `ray://` without ray[client] (or with nothing listening)."""
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    argv = ["farm", "upscale", str(job_folder / "in.png"), str(job_folder / "o_####.png"), "--device", "cpu"]
    code, err = _main([*argv, "--address", address], capsys)
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: --address {address}: Ray could not connect"), err


def test_a_bug_is_still_one_line_with_the_traceback_in_the_event_log(job_folder, monkeypatch, capsys):
    def broken(*args, **kwargs):
        return 1 / 0

    monkeypatch.setattr(cli.cli_job, "job_spec", broken)
    code, err = _main(["upscale", str(job_folder / "in.png"), "--device", "cpu"], capsys)
    assert code == 2 and "Traceback" not in err
    assert err.strip().startswith("error: unexpected ZeroDivisionError: division by zero (a bug;")
    assert len(err.strip().splitlines()) == 1
    logged = cli.get_runtime().events.recent("cli_error")[-1]
    assert "ZeroDivisionError" in logged["traceback"] and "broken" in logged["traceback"]
