"""docs/architecture.md names only modules that exist: every backticked path ending in ``.py`` is
a file of the repository (a path from its root), and a bare module name (`core.py`) is a file
somewhere in it. A page that names a removed module sends a newcomer to a room that is not there."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
NAMED = re.compile(r"`([\w./-]+\.py)`")


def test_every_module_the_architecture_page_names_exists():
    text = PAGE.read_text(encoding="utf-8")
    named = sorted(set(NAMED.findall(text)))
    assert len(named) > 50  # the page lists the modules room by room
    everywhere = {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts}
    missing = [name for name in named if not ((ROOT / name).is_file() if "/" in name else name in everywhere)]
    assert missing == [], f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_package_module_is_on_the_page():
    """The module list (tools/module_index.py) is regenerated when modules come or go."""
    text = PAGE.read_text(encoding="utf-8")
    listed = set(re.findall(r"^- `([\w./-]+\.py)`:", text, re.MULTILINE))
    modules = {
        p.relative_to(ROOT).as_posix()
        for folder in ("models", "operators", "runtime", "ui")
        for p in (ROOT / folder).rglob("*.py")
        if p.name != "__init__.py"
    }
    assert sorted(modules - listed) == []
