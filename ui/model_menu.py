"""The model menus of the scene settings (ui/settings.py): installed models of a family, the
stored choice by id. Blender calls these through ui/prop_callbacks.py.
"""

from ..models import families
from ..models.store import library
from ..operators.prefs import models_folder

# A family's embedded model (upscale: models/assets/bicubic_x2.onnx): no catalog entry, no install.
EMBEDDED_ID = "EMBEDDED"
EMBEDDED_LABEL = "Built-in (no download)"
NONE_ID = "NONE"

# Blender needs the strings of dynamic enum items kept alive while the enum is in use: each
# family's items live in these module-level lists, refreshed in place by the callbacks.
_model_items: dict[str, list[tuple[str, str, str, str, int]]] = {family: [] for family in families.IDS}


def compute_model_items(family: str, context=None) -> list[tuple[str, str, str, str, int]]:
    """Installed catalog entries of ``family`` (plus the family's embedded model, if it has one);
    a single "No model installed" item when there is none (an enum needs at least one)."""
    items = [
        (entry.id, entry.title, f"{entry.title} ({entry.license})", "", 0)
        for entry in library.installed_entries(family, models_folder(context))
    ]
    if families.get(family).fallback_model is not None:
        items.append((EMBEDDED_ID, EMBEDDED_LABEL, "The small model shipped with the add-on", "", 0))
    if not items:
        items.append((NONE_ID, "No model installed", "Install one in the add-on preferences (Models)", "", 0))
    # The selection is stored by id (see get_model), so the numbers only need to be unique.
    return [(ident, name, desc, icon, number) for number, (ident, name, desc, icon, _n) in enumerate(items)]


def model_items(family: str, context=None) -> list[tuple[str, str, str, str, int]]:
    """The model menu's items (refreshed in place in the module-level list Blender reads)."""
    _model_items[family][:] = compute_model_items(family, context)
    return _model_items[family]


def get_model(family: str, settings) -> int:
    """The menu's number of the stored choice.

    The choice is kept as a catalog id string, not as an enum number: a removed or not yet
    installed model then falls back to the first item (the family default) instead of pointing
    at whatever model took its number."""
    items = model_items(family)
    stored = settings.get(f"{family}_model_id", "")
    for ident, _name, _desc, _icon, number in items:
        if ident == stored:
            return number
    return items[0][4]


def set_model(family: str, settings, value: int) -> None:
    for ident, _name, _desc, _icon, number in model_items(family):
        if number == value:
            settings[f"{family}_model_id"] = ident
            return
