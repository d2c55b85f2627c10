"""`--help` works for every command and every farm command (a help string argparse cannot
%-format crashes `--help` itself; geometry's "4%" once did)."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys

import pytest
from lean_image_ai.cli import build_parser, main


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _every_command() -> list[list[str]]:
    commands = []
    for name, parser in _subcommands(build_parser()).items():
        commands.append([name])
        commands.extend([name, sub] for sub in _subcommands(parser))
    return commands


COMMANDS = _every_command()


def test_the_command_list_covers_every_family_and_the_farm():
    names = {" ".join(c) for c in COMMANDS}
    for command in ("remove-background", "depth", "geometry", "upscale", "doctor", "leak-check", "farm"):
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
