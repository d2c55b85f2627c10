"""Print the modules of each room with the first sentence of their docstrings, as Markdown.

    python tools/module_index.py > /tmp/rooms.md   # then paste into docs/architecture.md

The list in docs/architecture.md is this output: regenerate it when modules move, so the
page describes the code as it is rather than as it was.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOMS = [
    ("top level (package entry, headless front-ends)", "."),
    ("runtime/", "runtime"),
    ("models/", "models"),
    ("operators/", "operators"),
    ("ui/", "ui"),
    ("bench/", "bench"),
    ("tools/", "tools"),
    ("examples/", "examples"),
]
SKIPPED_FOLDERS = {".venv", "tests", "build", "dist", "wheels"}


def first_sentence(path: Path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    except SyntaxError as error:
        return f"(does not parse: {error.msg})"
    text = " ".join(doc.split("\n\n")[0].split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def modules(folder: Path) -> list[Path]:
    if folder == ROOT:
        return sorted(folder.glob("*.py"))
    return sorted(p for p in folder.rglob("*.py") if not SKIPPED_FOLDERS & set(p.relative_to(ROOT).parts))


def main() -> int:
    for title, name in ROOMS:
        folder = ROOT / name
        found = [p for p in modules(folder) if p.name != "__init__.py" or folder == ROOT]
        if not found:
            continue
        print(f"\n### {title}\n")
        for path in found:
            print(f"- `{path.relative_to(ROOT).as_posix()}`: {first_sentence(path) or '(no docstring)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
