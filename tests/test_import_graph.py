"""The package's static import graph: no import cycle between modules, no Blender module in the
bpy-free parts (runtime/, models/ and the headless front-ends in ui/cli/), data flowing one way
(runtime never reaches models, models never reach operators/ or ui/, operators/ never reach ui/, the
command line never reaches the Blender glue), and no folder holding more than FOLDER_LIMIT modules.

The graph is read from the source with `ast`, never by importing anything: module-level and
function-level imports alike (an import inside a function is still a dependency, it only runs
later), relative (`from ..ui import preferences`) and absolute (`import lean_image_ai.runtime`,
`from lean_image_ai.models import base`) forms, and `importlib.import_module("...")` /
`__import__("...")` calls with a literal name.

Edges: `from P import n` depends on `P.n` when that is a module; otherwise on the module that
defines `n`, following a package `__init__`'s re-exports (`from .core import get_runtime` in
runtime/__init__.py makes `from ..runtime import get_runtime` an edge to runtime.core), else on
`P` itself. A module never gets an edge to a package it is inside (Python has that package
half-imported already when the module runs). Production modules only: tests/, bench/, tools/,
virtual environments and hidden folders are not part of the package.

The first tests check the checker itself on a small synthetic package, so a graph walker that
silently found nothing could not pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "lean_image_ai"
NOT_PRODUCTION = {"tests", "bench", "tools", "build", "dist", "examples", "venv", ".venv", "__pycache__"}
BPY_FREE = ("runtime", "models", "ui.cli")  # dotted prefixes (under PACKAGE) that never import Blender
# The one-way flow: a module under the key never imports one under the values (direct edges; with
# no cycles and every layer checked, no longer path can climb back either).
LAYER_RULES = {
    "runtime": ("models", "operators", "ui"),
    "models": ("operators", "ui"),
    "operators": ("ui",),  # ui -> operators is the flow; class registration is the package entry's (registration.py)
    "ui.cli": ("operators", "ui.panels", "ui.preferences", "ui.settings", "registration"),
}
FOLDER_LIMIT = 15  # modules per folder, its __init__ not counted
BLENDER_MODULES = {"bpy", "bpy_extras", "bpy_types", "bmesh", "mathutils", "gpu", "gpu_extras", "idprop"}


# ---- the graph ---------------------------------------------------------------------------------


def production_modules(root: Path) -> dict[str, Path]:
    """Dotted module name (rooted at PACKAGE) -> file, for every production .py under `root`."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in NOT_PRODUCTION or any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        parts = [PACKAGE, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


class Graph:
    def __init__(self, root: Path):
        self.root = root
        self.modules = production_modules(root)
        self.trees = {
            name: ast.parse(path.read_text(encoding="utf-8"), str(path))
            for name, path in self.modules.items()
        }
        self.blender_imports: list[str] = []  # "runtime/x.py:12 imports bpy"
        self.edges: dict[str, set[str]] = {name: set() for name in self.modules}
        for name in self.modules:
            self._read(name)

    def is_package(self, name: str) -> bool:
        return self.modules[name].name == "__init__.py"

    def _package_of(self, name: str) -> str:
        return name if self.is_package(name) else name.rpartition(".")[0]

    def _absolute(self, name: str, level: int, module: str | None, lineno: int) -> str:
        """The absolute dotted name a (possibly relative) import in module `name` refers to."""
        if level == 0:
            return module or ""
        base = self._package_of(name).split(".")
        if level - 1 >= len(base):
            raise AssertionError(f"{self._where(name, lineno)}: relative import goes above the package")
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def _where(self, name: str, lineno: int) -> str:
        return f"{self.modules[name].relative_to(self.root)}:{lineno}"

    def _owner(self, dotted: str) -> str | None:
        """The longest production module that `dotted` names or lies inside."""
        while dotted:
            if dotted in self.modules:
                return dotted
            dotted = dotted.rpartition(".")[0]
        return None

    def _reexport(self, package: str, attribute: str, seen=()) -> str:
        """The module that defines `package.attribute`, following `from .x import attribute`."""
        if package in seen or not self.is_package(package):
            return package
        for node in self.trees[package].body:
            if isinstance(node, ast.ImportFrom) and any(
                (alias.asname or alias.name) == attribute for alias in node.names
            ):
                source = self._absolute(package, node.level, node.module, node.lineno)
                owner = self._owner(source)
                if owner is None:
                    return package
                original = next(a.name for a in node.names if (a.asname or a.name) == attribute)
                if f"{owner}.{original}" in self.modules:
                    return f"{owner}.{original}"
                return self._reexport(owner, original, (*seen, package))
        return package

    def _add(self, name: str, target: str | None) -> None:
        if target is None or target == name:
            return
        if self.is_package(target) and (name == target or name.startswith(target + ".")):
            return  # a package the importing module is inside: already (half) imported
        self.edges[name].add(target)

    def _imported(self, name: str, dotted: str, lineno: int) -> None:
        top = dotted.split(".")[0]
        if top in BLENDER_MODULES and _under(name, BPY_FREE):
            self.blender_imports.append(f"{self._where(name, lineno)} imports {dotted}")

    def _read(self, name: str) -> None:
        for node in ast.walk(self.trees[name]):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self._imported(name, alias.name, node.lineno)
                    if alias.name.split(".")[0] == PACKAGE:
                        self._add(name, self._owner(alias.name))
            elif isinstance(node, ast.ImportFrom):
                source = self._absolute(name, node.level, node.module, node.lineno)
                self._imported(name, source, node.lineno)
                if source.split(".")[0] != PACKAGE:
                    continue
                owner = self._owner(source)
                if owner is None:
                    raise AssertionError(f"{self._where(name, node.lineno)}: {source} is no module here")
                for alias in node.names:
                    if alias.name == "*":
                        self._add(name, owner)
                    elif f"{source}.{alias.name}" in self.modules:
                        self._add(name, f"{source}.{alias.name}")
                    else:
                        self._add(name, self._reexport(owner, alias.name))
            elif (
                isinstance(node, ast.Call)
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                    or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
                )
            ):
                target = node.args[0].value
                self._imported(name, target, node.lineno)
                if target.startswith("."):
                    level = len(target) - len(target.lstrip("."))
                    target = self._absolute(name, level, target.lstrip(".") or None, node.lineno)
                if target.split(".")[0] == PACKAGE:
                    self._add(name, self._owner(target))

    def layer_violations(self) -> list[str]:
        """Every import that flows against LAYER_RULES, as "runtime.core -> models.base"."""
        found = []
        for name, targets in sorted(self.edges.items()):
            for layer, forbidden in LAYER_RULES.items():
                if _under(name, (layer,)):
                    found += [f"{_short(name)} -> {_short(t)}" for t in sorted(targets) if _under(t, forbidden)]
        return found

    def crowded_folders(self) -> list[str]:
        """Folders holding more than FOLDER_LIMIT modules, as "models (16 modules)"."""
        counts = {}
        for path in self.modules.values():
            if path.name != "__init__.py":
                folder = path.parent.relative_to(self.root).as_posix()
                counts[folder] = counts.get(folder, 0) + 1
        return [f"{folder} ({count} modules)" for folder, count in sorted(counts.items()) if count > FOLDER_LIMIT]

    def cycles(self) -> list[list[str]]:
        """The shortest cycle through each module of every tangle (strongly connected component),
        each written from its smallest module name, first module repeated at the end."""
        cycles = set()
        for component in _strongly_connected(self.edges):
            if len(component) < 2:
                continue
            for start in component:
                ring = _shortest_cycle(self.edges, start, set(component))[:-1]
                turn = ring.index(min(ring))
                ring = ring[turn:] + ring[:turn]
                cycles.add((*ring, ring[0]))
        return sorted(list(c) for c in cycles)


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on deep graphs)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def _shortest_cycle(edges, start: str, within: set[str]) -> list[str]:
    """Breadth-first from `start` back to `start` inside one component."""
    previous = {start: None}
    queue = [start]
    for node in queue:
        for child in sorted(edges[node]):
            if child == start:
                path = [node]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if child in within and child not in previous:
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is in a component but on no cycle")


def _under(name: str, prefixes) -> bool:
    """Is the module `name` inside one of the dotted `prefixes` (rooted under PACKAGE)?"""
    return any(name == f"{PACKAGE}.{p}" or name.startswith(f"{PACKAGE}.{p}.") for p in prefixes)


def _short(name: str) -> str:
    return name.removeprefix(PACKAGE + ".")


def describe(cycles: list[list[str]]) -> str:
    return "\n".join(" -> ".join(_short(m) for m in cycle) for cycle in cycles)


# ---- the checker on a synthetic package (so it cannot pass by finding nothing) ------------------


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_checker_finds_cycles_of_every_import_form(tmp_path):
    root = _write(
        tmp_path,
        {
            "__init__.py": "def register():\n    from . import ui\n",
            "runtime/__init__.py": "from .core import get_runtime\n",
            "runtime/core.py": "import os\n\ndef get_runtime():\n    from ..models import base\n",
            "models/__init__.py": "",
            "models/base.py": "from ..runtime import get_runtime\n",  # via the re-export: core
            "ui/__init__.py": "",
            "ui/prefs.py": "import lean_image_ai.ui.panels\nfrom . import extra\n",  # absolute form
            "ui/extra.py": "from .prefs import something\n",  # a second cycle in the same tangle
            "ui/panels.py": "def draw():\n    from lean_image_ai.ui import prefs\n",  # function-level
            "ui/solo.py": "from . import prefs\nimport importlib\nimportlib.import_module('lean_image_ai.ui.solo2')\n",
            "ui/solo2.py": "from .solo import x\n",  # literal import_module closes this one
            "tests/test_x.py": "from lean_image_ai.ui import prefs\nimport bpy\n",  # not production
        },
    )
    graph = Graph(root)
    assert "lean_image_ai.tests.test_x" not in graph.modules
    assert graph.edges["lean_image_ai.models.base"] == {"lean_image_ai.runtime.core"}
    assert describe(graph.cycles()).splitlines() == [
        "models.base -> runtime.core -> models.base",
        "ui.extra -> ui.prefs -> ui.extra",
        "ui.panels -> ui.prefs -> ui.panels",
        "ui.solo -> ui.solo2 -> ui.solo",
    ]
    assert graph.blender_imports == []


def test_checker_finds_blender_imports_in_the_core_only(tmp_path):
    root = _write(
        tmp_path,
        {
            "__init__.py": "",
            "runtime/__init__.py": "",
            "runtime/gpu_info.py": "def f():\n    import mathutils\n",
            "models/__init__.py": "",
            "models/mesh.py": "from bpy.types import Mesh\n",
            "models/lazy.py": "import importlib\nbm = importlib.import_module('bmesh')\n",
            "operators/__init__.py": "",
            "operators/ops.py": "import bpy\n",  # allowed: Blender glue
        },
    )
    found = Graph(root).blender_imports
    assert sorted(found) == [
        "models/lazy.py:2 imports bmesh",
        "models/mesh.py:1 imports bpy.types",
        "runtime/gpu_info.py:2 imports mathutils",
    ]
    assert Graph(root).cycles() == []


def test_checker_finds_imports_against_the_layers_and_crowded_folders(tmp_path):
    files = {
        "__init__.py": "",
        "runtime/__init__.py": "",
        "runtime/core.py": "from ..models import base\n",  # runtime reaching up into models
        "models/__init__.py": "",
        "models/base.py": "def f():\n    from ..operators import ops\n",  # models reaching the glue
        "operators/__init__.py": "",
        "operators/ops.py": "import bpy\nfrom ..models import base\n",  # allowed: glue -> models
        "ui/__init__.py": "",
        "ui/panels.py": "import bpy\n",
        "ui/cli/__init__.py": "",
        "ui/cli/main.py": "from ..panels import x\nimport bpy\nfrom ...models import base\n",
    }
    files.update({f"models/m{i}.py": "" for i in range(FOLDER_LIMIT)})  # models/: base + 15 = 16
    graph = Graph(_write(tmp_path, files))
    assert graph.layer_violations() == [
        "models.base -> operators.ops",
        "runtime.core -> models.base",
        "ui.cli.main -> ui.panels",
    ]
    assert graph.blender_imports == ["ui/cli/main.py:2 imports bpy"]
    assert graph.crowded_folders() == [f"models ({FOLDER_LIMIT + 1} modules)"]


# ---- the package itself ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def package_graph() -> Graph:
    graph = Graph(REPO)
    # the walk must really have seen the package: its layers and their known dependencies
    for layer in ("runtime.core", "models.base", "operators.model_job", "ui.preferences"):
        assert f"{PACKAGE}.{layer}" in graph.modules, layer
    assert f"{PACKAGE}.runtime.errors" in graph.edges[f"{PACKAGE}.models.base"]
    return graph


def test_no_blender_module_is_imported_under_runtime_models_or_the_command_line(package_graph):
    assert package_graph.blender_imports == [], (
        "runtime/, models/ and ui/cli/ must stay bpy-free:\n" + "\n".join(package_graph.blender_imports)
    )


def test_data_flows_one_way_between_the_layers(package_graph):
    found = package_graph.layer_violations()
    assert not found, "imports against the layers (see LAYER_RULES):\n" + "\n".join(found)


def test_no_folder_holds_more_than_the_limit_of_modules(package_graph):
    assert package_graph.crowded_folders() == [], package_graph.crowded_folders()


def test_no_import_cycle_between_modules(package_graph):
    cycles = package_graph.cycles()
    assert not cycles, (
        f"{len(cycles)} import cycle(s), the shortest through each module in one:\n" + describe(cycles)
    )
