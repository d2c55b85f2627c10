"""Registering the Blender classes of a sub-package (operators/, ui/): one mechanism for both.

It sits at the package root, beside the add-on's entry (``__init__.py``'s register/unregister),
so that operators/ and ui/ both use it without operators/ importing from ui/ (ui -> operators is
the flow). It imports nothing of the package, and bpy only when called.

Each submodule named in the sub-package's `_MODULES` has a `classes` tuple; they are registered
in order and unregistered in reverse. Optional module functions `post_register()` and
`pre_unregister()` handle what is not a class (e.g. a PointerProperty on bpy.types.Scene).
"""

import importlib


def submodules(package: str, names) -> list:
    return [importlib.import_module(f".{name}", package) for name in names]


def classes_of(package: str, names) -> tuple:
    return tuple(cls for module in submodules(package, names) for cls in module.classes)


def register(package: str, names, classes=None) -> None:
    import bpy

    done = []
    try:
        for cls in classes if classes is not None else classes_of(package, names):
            if not getattr(cls, "is_registered", False):
                bpy.utils.register_class(cls)
                done.append(cls)
    except Exception:
        # a half-registered add-on is worse than none: roll back what this call registered
        for cls in reversed(done):
            bpy.utils.unregister_class(cls)
        raise
    for module in submodules(package, names):
        if hasattr(module, "post_register"):
            module.post_register()


def unregister(package: str, names, classes=None) -> None:
    import bpy

    for module in reversed(submodules(package, names)):
        if hasattr(module, "pre_unregister"):
            module.pre_unregister()
    # only what is registered is removed, so a second unregister (or one after a failed
    # register) is harmless
    for cls in reversed(classes if classes is not None else classes_of(package, names)):
        if getattr(cls, "is_registered", False):
            bpy.utils.unregister_class(cls)
