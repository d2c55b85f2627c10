"""Blender operators: thin wrappers that read Blender data, start a job and apply results (bpy).

Imported only from the add-on's ``register()``/``unregister()``, never on package import.
``image_io`` holds the image <-> numpy helpers the operators share (no classes to register).
"""

import importlib

import bpy

# Submodules that define operators, each with a module-level `classes` tuple; registered in
# this order and unregistered in reverse.
_MODULES = ("jobs", "image_ops", "geometry_ops", "model_ops")


def _modules():
    return [importlib.import_module(f".{name}", __name__) for name in _MODULES]


def _classes():
    return tuple(cls for module in _modules() for cls in module.classes)


def cancel_running_jobs():
    """Cancel the running job and join its worker, so nothing touches unregistered classes."""
    from .jobs import manager

    manager.cancel_all()


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
    cancel_running_jobs()
    for module in reversed(_modules()):
        if hasattr(module, "pre_unregister"):
            module.pre_unregister()
    # Tolerates a second call (or a partial register): only registered classes are removed.
    for cls in reversed(_classes()):
        if getattr(cls, "is_registered", False):
            bpy.utils.unregister_class(cls)
