"""Blender properties from the families' job options (models/family.py), defined once there.

The operators take them as properties and the scene settings (the N-panel's defaults,
ui/settings.py) hold the same ones. Functions, not shared objects: Blender needs a fresh property
definition per class.
"""

import bpy
from bpy.props import BoolProperty, FloatProperty, IntProperty

from ..models import families
from ..models.family import Family, Option

_KINDS = {bool: BoolProperty, int: IntProperty, float: FloatProperty}


# Blender 4.5+ warns about a "//" value in a path property that does not declare it resolves it
# (all of ours do, through bpy.path.abspath); older versions have no such option and refuse it.
_BLEND_RELATIVE = (
    {"PATH_SUPPORTS_BLEND_RELATIVE"}
    if "is_path_supports_blend_relative" in bpy.types.Property.bl_rna.properties
    else set()
)


def path_options(*others: str) -> set[str]:
    """``options`` of a file or folder path property: accepts ``//`` where Blender can say so."""
    return {*_BLEND_RELATIVE, *others}


def blender_property(option: Option):
    limits = {
        name: option.kind(value)
        for name in ("min", "max", "soft_max")
        if (value := getattr(option, name)) is not None
    }
    return _KINDS[option.kind](
        name=option.label, description=option.description, default=option.default, **limits
    )


def family_properties(family: Family) -> dict:
    return {option.name: blender_property(option) for option in family.options}


def with_properties(properties: dict):
    """Class decorator: add Blender properties to a class before it is registered."""

    def decorate(cls):
        cls.__annotations__ = {**cls.__dict__.get("__annotations__", {}), **properties}
        return cls

    return decorate


def with_family_options(family: Family):
    """Class decorator: the family's operator from its record. Its options become the operator's
    properties; its name, label and job title are the record's unless the class gives its own."""

    def decorate(cls):
        cls.family = family
        cls.bl_idname = operator_idname(family)
        described = family.produces[:1].upper() + family.produces[1:]  # "a matte" -> "A matte", BEN2 kept
        for name, value in (("bl_label", family.action), ("job_title", family.action), ("bl_description", described)):
            if name not in cls.__dict__:
                setattr(cls, name, value)
        return with_properties(family_properties(family))(cls)

    return decorate


def operator_idname(family: Family) -> str:
    return f"lean_image_ai.{family.operator}"


# The scene settings hold every family's options side by side under their own names.
_names = [option.name for family in families.ALL for option in family.options]
assert len(_names) == len(set(_names)), f"two families declare an option of the same name: {_names}"
