"""Scene settings: the N-panel's defaults for the model operators (``scene.lean_image_ai``).

The panel passes these to the operators as operator properties, so a headless script that calls
the operators directly never depends on them.
"""

# No ``from __future__ import annotations``: Blender reads the property annotations as objects.
import bpy
from bpy.props import EnumProperty, StringProperty

from ..models.catalog import FAMILIES
from ..operators import options
from . import preferences

# The embedded bicubic x2 upscaler (models/assets/bicubic_x2.onnx): no catalog entry, no install.
BICUBIC_ID = "BUILTIN_BICUBIC_X2"
BICUBIC_LABEL = "Built-in bicubic x2"
NONE_ID = "NONE"

# Blender needs the strings of dynamic enum items kept alive while the enum is in use: each
# family's items live in these module-level lists, refreshed in place by the callbacks.
_model_items: dict[str, list[tuple[str, str, str, str, int]]] = {family: [] for family in FAMILIES}


def compute_model_items(family: str, context=None) -> list[tuple[str, str, str, str, int]]:
    """Installed catalog entries of ``family`` (plus the built-in bicubic x2 for upscale); a
    single "No model installed" item when there is none (an enum needs at least one)."""
    items = [
        (entry.id, entry.title, f"{entry.title} ({entry.license})", "", 0)
        for entry in preferences.installed_entries(family, context)
    ]
    if family == "upscale":
        items.append(
            (BICUBIC_ID, BICUBIC_LABEL, "The small bicubic x2 upscaler shipped with the add-on", "", 0)
        )
    if not items:
        items.append((NONE_ID, "No model installed", "Install one in the add-on preferences (Models)", "", 0))
    # The selection is stored by id (see _model_getter), so the numbers only need to be unique.
    return [(ident, name, desc, icon, number) for number, (ident, name, desc, icon, _n) in enumerate(items)]


def _items_callback(family):
    def items(_self, context):
        _model_items[family][:] = compute_model_items(family, context)
        return _model_items[family]

    return items


def _model_getter(family):
    # The choice is kept as a catalog id string, not as an enum number: a removed or not yet
    # installed model then falls back to the first item (the family default) instead of
    # pointing at whatever model took its number.
    def get(self):
        items = _items_callback(family)(self, None)
        stored = self.get(f"{family}_model_id", "")
        for ident, _name, _desc, _icon, number in items:
            if ident == stored:
                return number
        return items[0][4]

    return get


def _model_setter(family):
    def set_(self, value):
        for ident, _name, _desc, _icon, number in _items_callback(family)(self, None):
            if number == value:
                self[f"{family}_model_id"] = ident
                return

    return set_


def _model_enum(family, description):
    return EnumProperty(
        name="Model",
        description=description,
        items=_items_callback(family),
        get=_model_getter(family),
        set=_model_setter(family),
    )


class LeanImageAISettings(bpy.types.PropertyGroup):
    ben2_model_id: StringProperty(options={"HIDDEN"})
    da3_model_id: StringProperty(options={"HIDDEN"})
    moge2_model_id: StringProperty(options={"HIDDEN"})
    upscale_model_id: StringProperty(options={"HIDDEN"})

    ben2_model: _model_enum("ben2", "Background removal model (installed ones only)")
    da3_model: _model_enum("da3", "Depth model (installed ones only)")
    moge2_model: _model_enum("moge2", "Geometry model (installed ones only)")
    upscale_model: _model_enum("upscale", "Upscaler (installed ones, or the built-in bicubic x2)")

    replace: options.replace()
    make_plane: options.make_plane()
    resolution_level: options.resolution_level()
    make_camera: options.make_camera()
    discontinuity: options.discontinuity()
    tile_size: options.tile_size()


def selected_model(settings, family: str, context=None) -> tuple[str, str]:
    """``(model_id, model_path)`` for the operator, from the scene's choice for ``family``.

    ``("", "")`` means the family default (nothing installed); the bicubic choice is passed as
    an explicit model path, everything else as a catalog id.
    """
    items = compute_model_items(family, context)
    stored = getattr(settings, f"{family}_model_id", "")
    ident = next((item[0] for item in items if item[0] == stored), items[0][0])
    if ident == NONE_ID:
        return "", ""
    if ident == BICUBIC_ID:
        from ..models.upscale import DEFAULT_MODEL_PATH

        return "", str(DEFAULT_MODEL_PATH)
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
