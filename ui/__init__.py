"""Blender UI: add-on preferences, N-panel panels, memory dashboard (bpy).

Imported only from the add-on's ``register()``/``unregister()``, never on package import.
"""

import importlib

import bpy

# Submodules with a module-level `classes` tuple; registered in this order, unregistered in reverse.
_MODULES = ("preferences", "settings", "panels")


def _modules():
    return [importlib.import_module(f".{name}", __name__) for name in _MODULES]


def _classes():
    return tuple(cls for module in _modules() for cls in module.classes)


def register():
    done = []
    try:
        for cls in _classes():
            if not getattr(cls, "is_registered", False):
                bpy.utils.register_class(cls)
                done.append(cls)
    except Exception:
        for cls in reversed(done):
            bpy.utils.unregister_class(cls)
        raise
    # optional hooks, e.g. a PointerProperty on bpy.types.Scene once its PropertyGroup exists
    for module in _modules():
        if hasattr(module, "post_register"):
            module.post_register()


def unregister():
    for module in reversed(_modules()):
        if hasattr(module, "pre_unregister"):
            module.pre_unregister()
    # Tolerates a second call (or a partial register): only registered classes are removed.
    for cls in reversed(_classes()):
        if getattr(cls, "is_registered", False):
            bpy.utils.unregister_class(cls)
