"""Blender operators: thin wrappers that read Blender data, start a job and apply results (bpy).

Imported only from the add-on's ``register()``/``unregister()``, never on package import.
Helpers without classes: ``image_io`` (pixels), ``sources`` (input image, output path),
``results`` (what operators create), ``prefs`` (reading the preferences), ``options`` (properties
from the family records), ``model_job`` (the model operators' base), ``jobs`` (the job engine).
"""

from .. import registration

# Submodules with a module-level `classes` tuple; registered in this order, unregistered in reverse.
# The CUDA/cuDNN libraries are loaded by the model worker process (models/worker/__main__.py), never here.
_MODULES = ("jobs", "image_ops", "geometry_ops", "batch_ops", "shot_ops", "model_ops", "memory_ops", "gpu_ops")


def _classes():
    from .image_ops import made_from_records

    written = registration.classes_of(__name__, _MODULES)
    return written + made_from_records(written)


def cancel_running_jobs():
    """Cancel the running job and join its worker, so nothing touches unregistered classes."""
    from .jobs import downloads, manager

    manager.cancel_all()
    downloads.cancel_all()


def check_family_operators(classes=None) -> None:
    """A family that names an operator must have its class (written here, or made from its record
    when its result is one image), or its N-panel button would fail when pressed. Checked before
    anything is registered."""
    from ..models import families
    from .options import operator_idname

    idnames = {getattr(cls, "bl_idname", "") for cls in (_classes() if classes is None else classes)}
    missing = [
        f"{family.id} ({operator_idname(family)})"
        for family in families.ALL
        if family.operator and operator_idname(family) not in idnames
    ]
    if missing:
        raise RuntimeError(
            f"Model families name operators that do not exist: {', '.join(missing)}. A result that is not "
            "one image needs an operator class (operators/); else leave 'operator' empty (it then runs "
            "through Process Sequence)."
        )


def register():
    classes = _classes()
    check_family_operators(classes)
    registration.register(__name__, _MODULES, classes)


def unregister():
    cancel_running_jobs()
    registration.unregister(__name__, _MODULES, _classes())
