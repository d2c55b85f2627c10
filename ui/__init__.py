"""Blender UI: add-on preferences, N-panel panels, memory dashboard (bpy).

Imported only from the add-on's ``register()``/``unregister()``, never on package import.
"""

from .. import registration

# Submodules with a module-level `classes` tuple; registered in this order, unregistered in reverse.
_MODULES = ("preferences", "settings", "panels")


def _classes():
    return registration.classes_of(__name__, _MODULES)


def register():
    registration.register(__name__, _MODULES, _classes())


def unregister():
    registration.unregister(__name__, _MODULES, _classes())
