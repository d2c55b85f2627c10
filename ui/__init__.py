"""Blender UI: add-on preferences, N-panel panels, memory dashboard (bpy).

Imported only from the add-on's ``register()``/``unregister()``, never on package import.
"""

import bpy

from . import preferences

# Classes registered in this order and unregistered in reverse. Add panels after the
# preferences, e.g. ``*panels.classes`` once a ``panels`` submodule exists.
classes = (preferences.LeanImageAIPreferences,)


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
    # Tolerates a second call (or a partial register): only registered classes are removed.
    for cls in reversed(classes):
        if getattr(cls, "is_registered", False):
            bpy.utils.unregister_class(cls)
