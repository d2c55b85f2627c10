"""`--help` works for every command and every farm command (a help string argparse cannot
%-format crashes `--help` itself; geometry's "4%" once did)."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys

import pytest
from lean_image_ai.models import families
from lean_image_ai.ui.cli.main import build_parser, main


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _every_command() -> list[list[str]]:
    commands, seen = [], set()
    for name, parser in _subcommands(build_parser()).items():
        if id(parser) in seen:  # an alias (gpu-runtime for gpu): its usage names the command itself
            continue
        seen.add(id(parser))
        commands.append([name])
        commands.extend([name, sub] for sub in _subcommands(parser))
    return commands


COMMANDS = _every_command()


def test_the_command_list_covers_every_family_and_the_farm():
    names = {" ".join(c) for c in COMMANDS}
    for command in (*(f.command for f in families.ALL), "doctor", "leak-check", "farm"):
        assert command in names
        if command not in ("doctor", "leak-check", "farm"):
            assert f"farm {command}" in names


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_exits_0_and_prints_the_usage(command):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    assert out.getvalue().startswith("usage: python -m lean_image_ai " + " ".join(command))
    assert "%%" not in out.getvalue()  # a doubled percent shows where a text was escaped twice


def test_geometry_help_as_a_process_shows_the_discontinuity_option():
    done = subprocess.run(
        [sys.executable, "-m", "lean_image_ai", "geometry", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--discontinuity" in done.stdout and "4%" in done.stdout.replace("\n", " ")


@pytest.mark.parametrize(
    "args, message",
    [
        (["upscale", "--tile-size", "-5"], "argument --tile-size: give a whole number of 0 or more, got '-5'"),
        (["upscale", "--tile", "-5"], "argument --tile: give a whole number of 0 or more, got '-5'"),
        (["upscale", "--overlap", "-2"], "argument --overlap: give a whole number of -1 or more, got '-2'"),
        (["upscale", "--tile-size", "big"], "argument --tile-size: give a whole number, got 'big'"),
        (["geometry", "--resolution-level", "42"], "argument --resolution-level: give a whole number from 0 to 9, got '42'"),
        (["farm", "geometry", "--resolution-level", "-1"], "give a whole number from 0 to 9, got '-1'"),
    ],
)
def test_family_options_are_checked_with_the_blender_propertys_limits(args, message):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 2 and message in err.getvalue(), err.getvalue()


def test_the_tile_flags_take_auto_and_the_limits_come_from_the_family_record():
    from lean_image_ai.models import families

    parser = _subcommands(build_parser())["upscale"]
    assert parser.parse_args(["--tile", "auto"]).tile_size == 0
    assert parser.parse_args(["--tile-size", "64"]).tile_size == 64
    option = next(o for o in families.get("upscale").options if o.name == "tile_size")
    assert option.min == 0  # the Blender property's min: one source for both


def test_memory_figures_never_read_minus_zero():
    from lean_image_ai.runtime.measure.memory_report import format_freed, mb

    assert mb(-4096) == "0 MiB" and mb(-3 * 2**20) == "-3 MiB" and mb(5.6 * 2**20) == "6 MiB"
    assert format_freed("Unload all", {"by": {"ram": -4096}}) == "Unload all freed process RAM 0 MiB"
