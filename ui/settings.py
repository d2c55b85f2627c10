"""Scene settings: the N-panel's defaults for the model operators (``scene.lean_image_ai``).

The panel passes these to the operators as operator properties, so a headless script that calls
the operators directly never depends on them.
"""

# No ``from __future__ import annotations``: Blender reads the property annotations as objects.
import bpy
from bpy.props import BoolProperty, EnumProperty, FloatProperty, StringProperty

from ..models import families
from ..models.adapters import shot_depth
from ..operators import options
from . import prop_callbacks
from .model_menu import EMBEDDED_ID, NONE_ID, compute_model_items


def _model_enum(family, description):
    return EnumProperty(
        name="Model",
        description=description,
        # Blender 4.2 never lets go of these functions: see ui/prop_callbacks.py
        items=prop_callbacks.model_items(family),
        get=prop_callbacks.model_getter(family),
        set=prop_callbacks.model_setter(family),
    )


def _settings_annotations() -> dict:
    """Per family: the chosen model's id (kept as a string, see model_menu.get_model), the model menu,
    and the family's job options (models/family.py)."""
    fields = {}
    for family in families.ALL:
        fields[f"{family.id}_model_id"] = StringProperty(options={"HIDDEN"})
        fields[f"{family.id}_model"] = _model_enum(
            family.id, "The model that does the work. Only installed models are listed: add more in the preferences"
        )
        fields.update(options.family_properties(family))
    fields.update(
        use_sequence=BoolProperty(
            name="Sequence",
            description="Run the buttons below over every frame of an image sequence, a folder or a pattern",
        ),
        sequence_source=StringProperty(
            name="Frames From",
            description="A folder, a numbered pattern (shot_####.png) or one frame of a sequence. Empty: the Image Editor's image sequence",
            subtype="FILE_PATH",
            options=options.path_options(),
        ),
        sequence_frames=StringProperty(
            name="Frames", description="Which frames: A-B, or A-B:STEP for every STEP-th one. Empty: every frame"
        ),
        sequence_output=StringProperty(
            name="Save To",
            description="A folder or a pattern (out_####.exr). Empty: default names beside the frames",
            subtype="FILE_PATH",
            options=options.path_options(),
        ),
        skip_existing=BoolProperty(name="Skip Existing", description="Keep existing outputs, do only the rest"),
    )
    fields.update(options.shot_properties())  # depth range, alignment, camera of a shot
    fields.update(_depth_range_fields())
    return fields


# The operators take the depth range as text ("per-frame", "auto-shot", "A:B": scripts and the
# command line write it so); the panel offers a menu and two numbers, joined by depth_range_text.
DEPTH_RANGE_ITEMS = [
    (shot_depth.PER_FRAME, "Per Frame", "Each frame's own nearest and farthest depth become black and white"),
    (
        shot_depth.AUTO_SHOT,
        "Auto for the Shot",
        "One range for the whole shot, found in a first pass: a still wall keeps its grey from frame to frame",
    ),
    (shot_depth.GIVEN, "Given", "You give the depths that become black and white"),
]


def _depth_range_fields() -> dict:
    return {
        "depth_range": EnumProperty(
            name="Depth Range",
            description="How depth becomes grey levels in 8- and 16-bit files (float files keep the depth itself)",
            items=DEPTH_RANGE_ITEMS,
            default=shot_depth.PER_FRAME,
        ),
        "depth_black": FloatProperty(
            name="Black At", description="The depth that becomes black (nearer is clipped)", default=0.5, min=0.0
        ),
        "depth_white": FloatProperty(
            name="White At", description="The depth that becomes white (farther is clipped)", default=40.0, min=0.0
        ),
    }


def depth_range_text(settings) -> str:
    """The operators' form of the scene's depth range (models/adapters/shot_depth.py parses it)."""
    if settings.depth_range == shot_depth.GIVEN:
        return f"{settings.depth_black:g}:{settings.depth_white:g}"
    return settings.depth_range


def shot_values(settings) -> dict:
    """The shot options as the sequence operators take them."""
    values = {name: getattr(settings, name) for name in options.SHOT_NAMES}
    values["depth_range"] = depth_range_text(settings)
    return values


LeanImageAISettings = type(
    "LeanImageAISettings",
    (bpy.types.PropertyGroup,),
    {"__annotations__": _settings_annotations(), "__doc__": "The N-panel's defaults for the model operators"},
)


def selected_model(settings, family: str, context=None) -> tuple[str, str]:
    """``(model_id, model_path)`` for the operator, from the scene's choice for ``family``.

    ``("", "")`` means the family default (nothing installed); the embedded model is passed as
    an explicit model path, everything else as a catalog id.
    """
    items = compute_model_items(family, context)
    stored = getattr(settings, f"{family}_model_id", "")
    ident = next((item[0] for item in items if item[0] == stored), items[0][0])
    if ident == NONE_ID:
        return "", ""
    if ident == EMBEDDED_ID:
        return "", str(families.get(family).fallback_model)
    return ident, ""


def get_settings(context=None):
    """The scene's settings, or None when the add-on is not registered (or no scene)."""
    scene = getattr(context or bpy.context, "scene", None)
    return getattr(scene, "lean_image_ai", None)


def post_register():
    bpy.types.Scene.lean_image_ai = bpy.props.PointerProperty(type=LeanImageAISettings)


def pre_unregister():
    if hasattr(bpy.types.Scene, "lean_image_ai"):
        del bpy.types.Scene.lean_image_ai


classes = (LeanImageAISettings,)
