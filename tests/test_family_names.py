"""A family is named in its own record: outside the adapters (each family's module) and the
built-in download table (models/store/builtin_models.py, the facts of each public export), a
family id appears as a string in at most 3 places (a default choice of a menu or a flag).
Headings, button texts, commands and the order the family check asks in are the record's."""

import re
from pathlib import Path

from lean_image_ai.models import families

ROOT = Path(__file__).resolve().parents[1]
OWN = ("models/adapters/", "models/store/builtin_models.py")
SKIPPED = ("tests/", "tools/", "bench/", ".")  # dev tools and benchmarks name the models they build


def test_family_ids_are_spelled_out_in_at_most_three_places():
    ids = "|".join(re.escape(f.id) for f in families.ALL)
    literal = re.compile(rf"""(["'])({ids})\1""")
    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(OWN) or rel.startswith(SKIPPED):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{rel}:{number}: {m.group(0)}" for m in literal.finditer(line)]
    assert len(found) <= 3, "\n".join(found)
