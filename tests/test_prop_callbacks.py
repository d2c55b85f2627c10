"""The add-on's PropertyGroup callbacks reach no module that holds bpy (ui/prop_callbacks.py).

Blender 4.2 keeps its references to the items/get/set/update functions of a PropertyGroup's
properties after the class is unregistered (an AddonPreferences' or an operator's it lets go of).
Once the extension is uninstalled its modules leave sys.modules, and whatever those functions
reach through their globals outlives Python's shutdown: when that is bpy, the bpy 4.2 wheel
never closes Blender down and segfaults at exit (tests/test_stock_blender.py runs that for real
on 4.2.23). This test needs only the dev venv's bpy: it follows the references Blender would keep.
"""

from __future__ import annotations

import sys
import types
from collections import deque
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
CALLBACK_KEYWORDS = ("items", "get", "set", "update", "poll", "get_transform", "set_transform", "search")


def _registered_property_groups() -> list[type]:
    ui = bh.import_submodule("ui")
    operators = bh.import_submodule("operators")
    classes = (*ui._classes(), *operators._classes())
    return [cls for cls in classes if issubclass(cls, bpy.types.PropertyGroup)]


def _callbacks(cls) -> list[tuple[str, types.FunctionType]]:
    found = []
    for name, deferred in getattr(cls, "__annotations__", {}).items():
        for keyword in CALLBACK_KEYWORDS:
            value = getattr(deferred, "keywords", {}).get(keyword)
            if isinstance(value, types.FunctionType):
                found.append((f"{cls.__name__}.{name} {keyword}=", value))
    return found


def _path_to_bpy(function: types.FunctionType) -> list[str] | None:
    """The chain of names from ``function`` to a bpy module through globals, closures and the
    add-on's own modules (other modules stay in sys.modules and are cleared at shutdown)."""
    seen: set[int] = set()
    stack: deque[tuple[object, list[str]]] = deque([(function, [function.__qualname__])])
    while stack:
        obj, path = stack.popleft()  # breadth first: the shortest chain is reported
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, types.ModuleType):
            if obj.__name__ == "bpy" or obj.__name__.startswith(("bpy.", "_bpy")):
                return path
            if obj.__name__.split(".")[0] == bh.PACKAGE:
                stack.extend((v, [*path, f"{obj.__name__}.{k}"]) for k, v in vars(obj).items())
        elif isinstance(obj, types.FunctionType):
            stack.extend((v, [*path, k]) for k, v in obj.__globals__.items() if not k.startswith("__"))
            cells = obj.__closure__ or ()
            stack.extend((c.cell_contents, [*path, "<closure>"]) for c in cells if c.cell_contents is not None)
        elif isinstance(obj, type) and obj.__module__.split(".")[0] == bh.PACKAGE:
            module = sys.modules.get(obj.__module__)
            if module is not None:
                stack.append((module, [*path, obj.__module__]))
    return None


def test_the_settings_have_callbacks_to_check():
    groups = _registered_property_groups()
    assert groups, "no PropertyGroup registered: this test checks nothing"
    assert any(_callbacks(cls) for cls in groups)


@pytest.mark.parametrize("cls", _registered_property_groups(), ids=lambda cls: cls.__name__)
def test_property_group_callbacks_do_not_reach_bpy(cls):
    reaching = {label: path for label, fn in _callbacks(cls) if (path := _path_to_bpy(fn))}
    assert not reaching, "callbacks Blender 4.2 keeps after unregister reach bpy (see ui/prop_callbacks.py): " + "; ".join(
        f"{label} via {' -> '.join(path)}" for label, path in list(reaching.items())[:3]
    )
