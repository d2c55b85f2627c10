"""Blender operators: thin wrappers that read Blender data, start a job and apply results (bpy).

Imported only from the add-on's ``register()``/``unregister()``, never on package import.
Helpers without classes: ``image_io`` (pixels), ``sources`` (input image, output path),
``results`` (what operators create), ``prefs`` (reading the preferences), ``options`` (properties
from the family records), ``model_job`` (the model operators' base), ``jobs`` (the job engine).
"""

from .. import registration

# Submodules with a module-level `classes` tuple; registered in this order, unregistered in reverse.
# gpu_ops' post_register() loads the CUDA/cuDNN libraries before any session is made.
_MODULES = ("jobs", "image_ops", "geometry_ops", "batch_ops", "shot_ops", "model_ops", "memory_ops", "gpu_ops")


def _classes():
    return registration.classes_of(__name__, _MODULES)


def cancel_running_jobs():
    """Cancel the running job and join its worker, so nothing touches unregistered classes."""
    from .jobs import downloads, manager

    manager.cancel_all()
    downloads.cancel_all()


def register():
    registration.register(__name__, _MODULES, _classes())


def unregister():
    cancel_running_jobs()
    registration.unregister(__name__, _MODULES, _classes())
