"""`python -m lean_image_ai flamenco-job-type [PATH]`: the Flamenco job type (flamenco/lean_image_ai.js)
offering this installation's commands.

Flamenco's Manager runs the job type in its own JavaScript engine, where the add-on's registry cannot
be asked: the commands it offers are written into the file. The shipped file holds the built-in
families' (tests/test_flamenco_job.py keeps it in step); an installation with a family of its own (a
plug-in registered with models/families.py ``register``) writes its own copy with this command.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ...models import families
from ...models.files import write_text
from ...runtime.errors import LeanImageError, user_path
from .cli_job import EXIT_OK

JOB_TYPE = Path(__file__).resolve().parent / "flamenco" / "lean_image_ai.js"
MARK = "// the registry's commands"  # marks the one line of the job type this command rewrites


def job_type_source(commands: Sequence[str], template: str | None = None) -> str:
    """The job type's text with ``commands`` as the choices of its command setting."""
    text = JOB_TYPE.read_text(encoding="utf-8") if template is None else template
    lines = text.splitlines(keepends=True)
    marked = [i for i, line in enumerate(lines) if MARK in line]
    if len(marked) != 1:  # the shipped file was edited by hand: say so rather than write a wrong job type
        raise ValueError(f"{JOB_TYPE.name}: expected one line marked {MARK!r}, found {len(marked)}")
    line = lines[marked[0]]
    indent = line[: len(line) - len(line.lstrip())]
    lines[marked[0]] = f"{indent}choices: {json.dumps(list(commands))}, {MARK}: python -m lean_image_ai flamenco-job-type\n"
    return "".join(lines)


def registered_commands() -> list[str]:
    return [family.command for family in families.ALL if family.command]


def _job_type(args) -> int:
    text = job_type_source(registered_commands())
    if not args.path:
        sys.stdout.write(text)
        return EXIT_OK
    target = user_path(args.path)
    if target.is_dir() or args.path.endswith(("/", os.sep)):
        target = target / JOB_TYPE.name
    if not target.parent.is_dir():
        raise LeanImageError(f"{target.parent} is not a folder: give an existing folder (the Manager's scripts/) or a file in one.")
    write_text(target, text)  # all or nothing: the Manager may read the scripts folder at any time
    print(f"wrote {target} (commands: {', '.join(registered_commands())})")
    return EXIT_OK


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "flamenco-job-type",
        help="the Flamenco job type offering this installation's commands (plug-in families included)",
        description="Print the Flamenco 3 job type (lean_image_ai.js), or write it to PATH (a file, or "
        "the Manager's scripts/ folder), with the commands of every family registered here.",
    )
    parser.add_argument("path", nargs="?", default="", metavar="PATH", help="where to write it (default: print it)")
    parser.set_defaults(handler=_job_type)
