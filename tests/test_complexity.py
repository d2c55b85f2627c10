"""No dense function: every function of the package has a cyclomatic complexity of at most LIMIT,
counted as radon counts it (radon is not a dependency: `ast` alone), unless its docstring holds a
line starting "Not split:" that says why it cannot be.

Radon's rules, per function: 1, plus 1 for each `if`/`elif` and conditional expression, each
`for`/`while` (one more for its `else`), each `except` (one more for a `try`'s `else`), each
`assert`, each comprehension `for` and its `if`s, each `case` of a `match` but a bare `_`, and
len(values) - 1 for each chain of `and`/`or`. `with` adds nothing. A nested function or class is
counted on its own and adds nothing to the function around it; a lambda's branches count for the
function that holds it.

The first tests check the counter itself on small snippets, so a counter that found nothing could
not pass.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOT_PRODUCTION = {"tests", "bench", "tools", "build", "dist", "examples", "venv", ".venv", "__pycache__"}
LIMIT = 15
EXCUSE = "Not split:"
# Functions in modules other branches are rewriting while this list was made: splitting them here
# would only collide with that work. The lead empties this list after merging those branches.
PENDING_MERGE: set[str] = set()  # PENDING-MERGE: "path::Class.function" entries; empty after merges

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_TRY = tuple(t for t in (ast.Try, getattr(ast, "TryStar", None)) if t is not None)


def _branches(node: ast.AST) -> int:
    """What this one node adds (its children are counted on their own)."""
    if isinstance(node, _TRY):
        return len(node.handlers) + bool(node.orelse)
    if isinstance(node, ast.BoolOp):
        return len(node.values) - 1
    if isinstance(node, (ast.If, ast.IfExp, ast.Assert)):
        return 1
    if isinstance(node, ast.Match):
        wildcard = any(getattr(case.pattern, "pattern", False) is None for case in node.cases)
        return max(0, len(node.cases) - wildcard)
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
        return 1 + bool(node.orelse)
    if isinstance(node, ast.comprehension):
        return 1 + len(node.ifs)
    return 0


def complexity(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Radon's cyclomatic complexity of one function (nested functions and classes left out)."""
    total, pending = 1, list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            continue
        total += _branches(node)
        pending.extend(ast.iter_child_nodes(node))
    return total


def functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function in `tree`, methods as Class.method and nested
    functions as outer.inner."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, _FUNCTIONS):
            yield prefix + child.name, child
            yield from functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from functions(child, f"{prefix}{child.name}.")
        else:
            yield from functions(child, prefix)


def excused(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    doc = ast.get_docstring(function) or ""
    return any(line.strip().startswith(EXCUSE) and line.strip() != EXCUSE for line in doc.splitlines())


def dense_functions(root: Path) -> dict[str, int]:
    """"path::qualified.name" -> complexity, for every production function above LIMIT that no
    "Not split:" line excuses."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in NOT_PRODUCTION or any(p.startswith(".") for p in rel.parts):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name, node in functions(tree):
            score = complexity(node)
            if score > LIMIT and not excused(node):
                found[f"{rel.as_posix()}::{name}"] = score
    return found


# ---- the counter itself ------------------------------------------------------------------------


def _one(source: str) -> int:
    tree = ast.parse(textwrap.dedent(source))
    return complexity(next(node for node in ast.walk(tree) if isinstance(node, _FUNCTIONS)))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n    return 1\n", 1),
        ("def f(a):\n    if a:\n        pass\n    elif a > 1:\n        pass\n    else:\n        pass\n", 3),
        ("def f(a, b, c):\n    return a and b or c\n", 3),  # two BoolOps: (a and b), (.. or c)
        ("def f(a, b, c):\n    return a and b and c\n", 3),  # one BoolOp of three values
        ("def f(a):\n    return 1 if a else 2\n", 2),
        ("def f(a):\n    for x in a:\n        pass\n    else:\n        pass\n", 3),
        ("def f(a):\n    while a:\n        pass\n", 2),
        ("def f():\n    try:\n        pass\n    except ValueError:\n        pass\n"
         "    except OSError:\n        pass\n    else:\n        pass\n    finally:\n        pass\n", 4),
        ("def f(a):\n    with a:\n        pass\n", 1),
        ("def f(a):\n    assert a\n", 2),
        ("def f(a):\n    return [x for x in a if x if x > 1]\n", 4),
        ("def f(a):\n    return {x: y for x in a for y in x}\n", 3),
        ("def f(a):\n    match a:\n        case 1:\n            pass\n        case 2:\n            pass\n"
         "        case _:\n            pass\n", 3),
        ("def f(a):\n    g = lambda x: x if x else a\n    return g\n", 2),
        ("def f(a):\n    def g(x):\n        if x:\n            pass\n    class C:\n"
         "        def h(self):\n            if a:\n                pass\n    return g\n", 1),
    ],
)
def test_counter_counts_as_radon_does(source, expected):
    assert _one(source) == expected


def test_counter_finds_nested_and_method_names_and_reads_the_excuse(tmp_path):
    branches = "".join(f"    if a == {i}:\n        pass\n" for i in range(LIMIT))  # 1 + LIMIT
    (tmp_path / "mod.py").write_text(
        f"def dense(a):\n{branches}"
        f"def excused(a):\n    '''Why.\n\n    Not split: one table of cases.\n    '''\n{branches}"
        f"def bare_excuse(a):\n    '''Not split:'''\n{branches}"
        f"class K:\n    def method(self, a):\n{textwrap.indent(branches, '    ')}"
        f"def outer():\n    def inner(a):\n{textwrap.indent(branches, '    ')}    return inner\n",
        encoding="utf-8",
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(f"def dense_test(a):\n{branches}", encoding="utf-8")
    assert dense_functions(tmp_path) == {
        "mod.py::dense": LIMIT + 1,
        "mod.py::bare_excuse": LIMIT + 1,
        "mod.py::K.method": LIMIT + 1,
        "mod.py::outer.inner": LIMIT + 1,
    }


# ---- the package -------------------------------------------------------------------------------


def test_no_function_above_the_limit():
    dense = dense_functions(REPO)
    listing = "\n".join(f"  {score:3d}  {name}" for name, score in sorted(dense.items(), key=lambda i: -i[1]))
    print(f"functions above {LIMIT} (pending merge marked *):")
    print("\n".join(f"{line}{' *' if line.split()[1] in PENDING_MERGE else ''}" for line in listing.splitlines()))
    offenders = {name: score for name, score in dense.items() if name not in PENDING_MERGE}
    assert not offenders, (
        f"{len(offenders)} function(s) above cyclomatic complexity {LIMIT}: split them, or say in one "
        f"docstring line starting '{EXCUSE}' why one cannot be:\n"
        + "\n".join(f"  {score:3d}  {name}" for name, score in sorted(offenders.items(), key=lambda i: -i[1]))
    )


def test_pending_merge_lists_only_dense_functions():
    """An entry whose function was split (or renamed) must leave the list, so the list cannot hide
    a new dense function under an old name."""
    stale = sorted(PENDING_MERGE - set(dense_functions(REPO)))
    assert not stale, f"no longer above {LIMIT} (or gone): remove from PENDING_MERGE: {stale}"
