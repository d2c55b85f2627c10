"""Blender operators: thin wrappers that read Blender data, start a job and apply results (bpy).

Imported only from the add-on's ``register()``/``unregister()``, never on package import.
``image_io`` holds the image <-> numpy helpers the operators share (no classes to register).
"""

import bpy

# Classes registered in this order and unregistered in reverse. Add operator modules here, e.g.
#   from . import remove_background
#   classes = (*remove_background.classes, ...)
classes = ()


def cancel_running_jobs():
    """HOOK (to be filled in by the jobs/operators issue): cancel every running modal job and
    wait for/abandon its worker so nothing touches unregistered classes or freed data.
    Called first in :func:`unregister`. Does nothing yet."""


def register():
    done = []
    try:
        for cls in classes:
            if not getattr(cls, "is_registered", False):
                bpy.utils.register_class(cls)
                done.append(cls)
    except Exception:
        for cls in reversed(done):
            bpy.utils.unregister_class(cls)
        raise


def unregister():
    cancel_running_jobs()
    # Tolerates a second call (or a partial register): only registered classes are removed.
    for cls in reversed(classes):
        if getattr(cls, "is_registered", False):
            bpy.utils.unregister_class(cls)
