"""Blender operators: thin wrappers that read Blender data, start a job and apply results (bpy).

Imported only from the add-on's ``register()``/``unregister()``, never on package import.
``image_io`` and ``common`` hold helpers the operators share (no classes to register).
"""

from .. import registration

# Submodules with a module-level `classes` tuple; registered in this order, unregistered in reverse.
_MODULES = ("jobs", "image_ops", "geometry_ops", "model_ops")


def _classes():
    return registration.classes_of(__name__, _MODULES)


def cancel_running_jobs():
    """Cancel the running job and join its worker, so nothing touches unregistered classes."""
    from .jobs import manager

    manager.cancel_all()


def register():
    registration.register(__name__, _MODULES, _classes())


def unregister():
    cancel_running_jobs()
    registration.unregister(__name__, _MODULES, _classes())
