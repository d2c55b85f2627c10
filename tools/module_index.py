"""Print the modules of each room with the first sentence of their docstrings, as Markdown.

    python tools/module_index.py            # print it
    python tools/module_index.py --write    # replace the list at the end of docs/architecture.md

The list in docs/architecture.md is this output: regenerate it when modules move, so the
page describes the code as it is rather than as it was.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_FOLDERS = {".venv", "tests", "build", "dist", "wheels", "__pycache__"}
OUTSIDE_THE_PACKAGE = ["bench", "tools", "examples"]  # listed after the package's folders


def first_sentence(path: Path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    except SyntaxError as error:
        return f"(does not parse: {error.msg})"
    text = " ".join(doc.split("\n\n")[0].split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def folders() -> list[Path]:
    """The package root, then every package folder under it (depth first, by name), then the
    development folders beside it."""
    found = [ROOT]
    for init in sorted(ROOT.rglob("__init__.py")):
        rel = init.parent.relative_to(ROOT)
        if init.parent != ROOT and not (SKIPPED_FOLDERS | set(OUTSIDE_THE_PACKAGE)) & set(rel.parts):
            found.append(init.parent)
    return found + [ROOT / name for name in OUTSIDE_THE_PACKAGE]


def index_text() -> str:
    lines: list[str] = []
    for folder in folders():
        is_root = folder == ROOT
        found = sorted(p for p in folder.glob("*.py") if is_root or p.name != "__init__.py")
        if not found:
            continue
        title = "top level (package entry)" if is_root else f"{folder.relative_to(ROOT).as_posix()}/"
        lines += ["", f"### {title}", ""]
        init = folder / "__init__.py"
        if not is_root and init.is_file() and first_sentence(init):
            lines += [first_sentence(init), ""]
        for path in found:
            lines.append(f"- `{path.relative_to(ROOT).as_posix()}`: {first_sentence(path) or '(no docstring)'}")
    return "\n".join(lines) + "\n"


FIRST_ROOM = "\n### top level (package entry)\n"  # the list runs from here to the page's end


def main(argv: list[str]) -> int:
    text = index_text()
    if "--write" not in argv:
        sys.stdout.write(text)
        return 0
    page = ROOT / "docs" / "architecture.md"
    before = page.read_text(encoding="utf-8")
    start = before.find(FIRST_ROOM)
    if start < 0:
        print(f"{page}: no '### top level (package entry)' heading to replace from", file=sys.stderr)
        return 2
    page.write_text(before[:start] + text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
