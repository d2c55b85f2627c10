"""A panel drawn into the recording layout, read as an artist reads it: as text, in order
(``listing``), and as each task's box (``boxes``, ``mode_facts``), with the rules of each mode.

Used by tests/test_panel_modes.py in the dev venv's bpy and by tests/stock_blender_job.py in each
stock Blender (checked by tests/test_stock_blender.py), and to print listings for notes. The
add-on's package is a parameter: ``lean_image_ai`` in the dev venv, the extension's
``bl_ext.user_default.lean_image_ai`` in a stock Blender. Needs only bpy."""

from __future__ import annotations

import importlib

from recording_layout import RecordingLayout

PACKAGE = "lean_image_ai"
SHOT_NAMES = {"depth_range", "depth_black", "depth_white", "align_depth", "shot_camera", "shot_fov"}
BLENDER_ONLY = {"replace", "make_plane", "make_camera"}
SEQUENCE_OPTIONS = {  # what each task's box offers in Sequence mode, after its model menu
    "ben2": [],
    "da3": ["depth_range", "align_depth"],
    "moge2": ["resolution_level", "discontinuity", "shot_camera", "shot_fov"],
    "upscale": ["tile_size", "overlap"],
}


def _describe(call, package: str) -> str:
    state = "" if call.enabled else "  [disabled]"
    if call.kind == "label":
        return f"{call.text}{state}"
    if call.kind == "prop":
        rna = call.data.bl_rna.properties[call.name]
        label = call.text or rna.name
        if rna.type == "ENUM":
            value = getattr(call.data, call.name)
            names = {item.identifier: item.name for item in rna.enum_items}
            names.update({item[0]: item[1] for item in _dynamic_items(call.name, package)})
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


def _dynamic_items(name: str, package: str) -> list:
    """A model menu's items (its enum is filled by a callback, so RNA lists none)."""
    if not name.endswith("_model"):
        return []
    if package == PACKAGE:  # the checkout, loaded by file location where it is not installed
        import blender_helpers as bh

        bh.import_package()
    return importlib.import_module(f"{package}.ui.settings").compute_model_items(name.removesuffix("_model"))


def listing(layout: RecordingLayout, package: str = PACKAGE) -> list[str]:
    return [_describe(call, package) for call in layout.log]


def boxes(layout: RecordingLayout, package: str = PACKAGE) -> dict[str, list]:
    """The calls of each task's box, by family id (a box starts at its title)."""
    families = importlib.import_module(f"{package}.models.families")
    titles = {f.panel_heading: f.id for f in families.ALL}
    out, current = {}, None
    for call in layout.log:
        if call.kind == "label" and call.text in titles:
            current = titles[call.text]
            out[current] = []
        elif call.kind == "label" and call.text.startswith(("Running:", "Last job:", "No job has run")):
            current = None  # the job section follows the tasks
        elif current is not None:
            out[current].append(call)
    assert set(out) == set(families.IDS), listing(layout, package)
    return out


def props(calls) -> list[str]:
    return [c.name for c in calls if c.kind == "prop"]


def main_button(calls):
    return next(c for c in calls if c.kind == "operator" and c.name.startswith("lean_image_ai."))


def mode_facts(layout: RecordingLayout, package: str = PACKAGE) -> dict:
    """Per task: the options its box shows, its menu's label, its button (for JSON, from a stock
    Blender) and the options its operator has in single-image mode."""
    families = importlib.import_module(f"{package}.models.families")
    facts = {}
    for family_id, calls in boxes(layout, package).items():
        button = main_button(calls)
        menus = [c.text for c in calls if c.kind == "prop"]
        facts[family_id] = {
            "props": props(calls),
            "menu_text": menus[0] if menus else None,
            "operator": button.name,
            "text": button.text,
            "enabled": button.enabled,
            "button_props": sorted(button.props),
            "options": [o.name for o in families.get(family_id).options],
            "action": families.get(family_id).action,
            "operator_of_family": families.get(family_id).operator,
            "labels": [c.text for c in calls if c.kind == "label"],
        }
    facts["all_props"] = sorted({c.name for c in layout.calls("prop")})
    return facts


def check_single_image(facts: dict, image: str) -> None:
    """Each box: its model menu, labelled, then its own options; its button names the image."""
    for family_id in SEQUENCE_OPTIONS:
        box = facts[family_id]
        assert box["props"] == [f"{family_id}_model", *box["options"]], (family_id, box)
        assert box["menu_text"] == "Model"
        assert box["operator"] == f"lean_image_ai.{box['operator_of_family']}" and box["enabled"], box
        assert image in box["text"], box
        assert not set(box["button_props"]) & SHOT_NAMES
        assert box["text"] not in box["labels"] and box["action"] not in box["labels"]  # one title per box
    assert not SHOT_NAMES & set(facts["all_props"])


def check_sequence(facts: dict, pattern: str) -> None:
    """Only what the sequence operators read; each button names the sequence."""
    assert not BLENDER_ONLY & set(facts["all_props"])
    for family_id, expected in SEQUENCE_OPTIONS.items():
        box = facts[family_id]
        assert box["props"] == [f"{family_id}_model", *expected], (family_id, box)
        assert box["operator"] == "lean_image_ai.process_sequence" and box["enabled"], box
        assert pattern in box["text"], box
        assert not set(box["button_props"]) & BLENDER_ONLY
        assert set(box["button_props"]) & SHOT_NAMES == set(expected) & SHOT_NAMES, box


def put_on_active_object(bpy, image):
    """``image`` on the active object's active Image Texture node: what the buttons work on in
    the 3D Viewport (background Blender has no Image Editor to open it in). Returns (object, mesh,
    material) for a caller that removes them."""
    mesh = bpy.data.meshes.new("Plane")
    obj = bpy.data.objects.new("Plane", mesh)
    bpy.context.scene.collection.objects.link(obj)
    bpy.context.view_layer.objects.active = obj
    material = bpy.data.materials.new("Photo")
    if not material.node_tree:  # Blender before 5.0 makes the tree only when asked
        material.use_nodes = True
    node = material.node_tree.nodes.new("ShaderNodeTexImage")
    node.image = image
    material.node_tree.nodes.active = node
    mesh.materials.append(material)
    return obj, mesh, material
