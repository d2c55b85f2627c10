"""A panel drawn into the recording layout, as indented text: what an artist sees, in order.

Used by tests/test_panel_modes.py to compare modes, and to print listings for notes."""

from __future__ import annotations

from recording_layout import RecordingLayout


def _describe(call) -> str:
    state = "" if call.enabled else "  [disabled]"
    if call.kind == "label":
        return f"{call.text}{state}"
    if call.kind == "prop":
        rna = call.data.bl_rna.properties[call.name]
        label = call.text or rna.name
        if rna.type == "ENUM":
            value = getattr(call.data, call.name)
            names = {item.identifier: item.name for item in rna.enum_items}
            names.update({item[0]: item[1] for item in _dynamic_items(call.name)})
            return f"{label}: [{names.get(value, value)}]{state}"
        if rna.type == "BOOLEAN":
            return f"[{'x' if getattr(call.data, call.name) else ' '}] {label}{state}"
        value = getattr(call.data, call.name)
        return f"{label}: {value:g}{state}" if isinstance(value, float) else f"{label}: {value!r}{state}"
    if call.kind in ("operator", "operator_menu_enum"):
        return f"<{call.text}>{state}"
    if call.kind == "progress":
        return f"[{call.text}]"
    return "--"


def _dynamic_items(name: str) -> list:
    """A model menu's items (its enum is filled by a callback, so RNA lists none)."""
    import blender_helpers as bh

    family = name.removesuffix("_model")
    return bh.import_submodule("ui.settings").compute_model_items(family) if name.endswith("_model") else []


def listing(layout: RecordingLayout) -> list[str]:
    return [_describe(call) for call in layout.log]
