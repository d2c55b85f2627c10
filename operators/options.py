"""Blender properties from the core's option records, defined once there: a family's job options
(models/family.py) and a shot's options (models/job_spec.py's ShotOptions: one depth range and
aligned depth for a depth sequence, one camera for a MoGe-2 sequence; their maths is
models/adapters/shot_depth.py and shot_camera.py, the two passes models/batch/runner.py).

The operators take them as properties and the scene settings (the N-panel's defaults,
ui/settings.py) hold the same ones. Functions, not shared objects: Blender needs a fresh property
definition per class.
"""

import bpy
from bpy.props import BoolProperty, EnumProperty, FloatProperty, IntProperty, StringProperty

from ..models import families
from ..models.adapters import shot_camera, shot_depth
from ..models.batch.shot_batch import ShotSettings
from ..models.family import Family, Option
from ..models.job_spec import ShotOptions

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


# --- a shot's options ----------------------------------------------------------------------------


def shot_properties() -> dict:
    return {
        "depth_range": StringProperty(
            name="Depth Range",
            description="How depth maps to 0..1 in 8/16-bit files: per-frame (each frame's own min..max), "
            "auto-shot (a first pass finds one range for the whole shot, so a still wall keeps its grey), "
            "or A:B (given)",
            default=shot_depth.PER_FRAME,
        ),
        "align_depth": BoolProperty(
            name="Align Depth",
            description="Align each frame's depth to the previous one (robust scale and shift on the pixels "
            "that agree), so a still background keeps its value",
        ),
        "shot_camera": EnumProperty(
            name="Camera",
            description="The lens of the meshes' camera: fitted on each frame, or one for the whole shot "
            "(a steady field of view, for a shot filmed without zooming)",
            items=[
                (shot_camera.PER_FRAME, "Per Frame", "Each frame fits its own focal length"),
                (shot_camera.SHOT, "One for the Shot", "A first pass fits one focal length (median over the frames)"),
            ],
            default=shot_camera.PER_FRAME,
        ),
        "shot_fov": FloatProperty(
            name="Field of View",
            description="Fix the horizontal field of view for every frame (degrees); 0: fitted",
            default=0.0,
            min=0.0,
            max=170.0,
        ),
    }


SHOT_NAMES = tuple(shot_properties())


def shot_options_of(owner) -> ShotOptions:
    """The shot options an operator holds, as a job carries them (models/job_spec.py)."""
    return ShotOptions(depth_range=owner.depth_range, align_depth=owner.align_depth, camera=owner.shot_camera,
                       fov=owner.shot_fov or None)


def shot_settings_of(owner, family_id: str, shard=None) -> ShotSettings:
    """The shot settings an operator (or the scene settings) holds."""
    return ShotSettings(
        family_id,
        depth_range=owner.depth_range,
        align_depth=owner.align_depth,
        camera=owner.shot_camera,
        fov=owner.shot_fov or None,
        shard=shard,
        skip_existing=bool(getattr(owner, "skip_existing", False)),
    )
