"""Every operator the add-on registers is reachable: a panel, a preference or another operator
names it. An operator nothing draws is dead code the artist can only find with F3 (the removed
"Free Loaded Models" cleared the host's sessions, which hold nothing since the model worker).

Read from the sources (no bpy): the family operators are made from the records and drawn by
ui/panels.py through :func:`operators.options.operator_idname`, so only the literal names count.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFINED = re.compile(r'bl_idname = "lean_image_ai\.(\w+)"')


def _sources() -> dict[Path, str]:
    return {p: p.read_text(encoding="utf-8") for folder in ("operators", "ui") for p in (ROOT / folder).rglob("*.py")}


def test_every_named_operator_is_drawn_or_called_somewhere():
    sources = _sources()
    defined = {name for text in sources.values() for name in DEFINED.findall(text)}
    assert len(defined) > 10  # the scan found the operators
    unreachable = []
    for name in sorted(defined):
        uses = sum(len(re.findall(rf"lean_image_ai\.{name}\b", DEFINED.sub("", text))) for text in sources.values())
        if not uses:
            unreachable.append(name)
    assert unreachable == [], f"operators no panel or operator names: {unreachable}"
