"""An artist's session with the four buttons, in a bpy process of its own (tests/results_checks.py
says what the tests compare).

    python results_job.py make CONFIG.json   run the buttons on photo.png shown in an Image Editor,
                                             undo and redo each, save the .blend
    python results_job.py read CONFIG.json   open that .blend (a new process) and read it back

Each step writes ``<step>.npz`` (every result image's pixels) and ``<step>.json`` (what the
datablocks and the editor say) into the config's folder; the test compares them. ``make`` is
also called inside tests/stock_blender_job.py, where the add-on is the installed extension
(``package`` is its module, already registered) and the scene is the one that job has open.
"""

import importlib
import json
import sys
from pathlib import Path

import bpy
import numpy as np

BUTTONS = (  # (operator, model key, the image it shows, its options)
    ("remove_background", "ben2", "photo_cutout", {}),
    ("estimate_depth", "da3", "photo_depth", {"make_plane": True}),
    ("reconstruct_geometry", "moge2", "photo_normal", {}),
    ("upscale", "sr", "photo_x2", {}),
)


def pixels(image) -> np.ndarray:
    flat = np.empty(len(image.pixels), np.float32)
    image.pixels.foreach_get(flat)
    return flat


def describe(image) -> dict:
    return {
        "source": image.source,
        "filepath": image.filepath_raw,
        "packed": image.packed_file is not None,
        "users": image.users,
        "size": list(image.size),
        "packed_size": image.packed_file.size if image.packed_file else 0,
        "packed_head": list(image.packed_file.data[:64]) if image.packed_file else [],
    }


def editor_context():
    window = bpy.context.window_manager.windows[0]
    area = window.screen.areas[0]
    area.type = "IMAGE_EDITOR"
    return window, area


def register_for_a_bare_bpy(package: str) -> None:
    """The dev venv's bpy has no add-on installed: a factory scene and the operators' classes."""
    operators = [importlib.import_module(f"{package}.operators.{name}") for name in ("jobs", "image_ops", "geometry_ops")]
    bpy.ops.wm.read_factory_settings(use_empty=True)
    for cls in [cls for module in operators for cls in module.classes]:
        bpy.utils.register_class(cls)


def make(config: dict, folder: Path, package: str = "lean_image_ai") -> None:
    if package == "lean_image_ai":
        register_for_a_bare_bpy(package)
    undoable = [importlib.import_module(f"{package}.operators.{name}") for name in ("image_ops", "geometry_ops")]
    assert all("UNDO" in cls.bl_options for module in undoable for cls in module.classes)
    bpy.ops.wm.save_as_mainfile(filepath=str(folder / "scene.blend"))  # `//` means this folder from now on
    window, area = editor_context()
    photo = bpy.data.images.load(str(folder / "photo.png"))
    facts, arrays = {"buttons": {}}, {}
    with bpy.context.temp_override(window=window, area=area):
        bpy.ops.ed.undo_push(message="photo opened")
        for operator, model, name, options in BUTTONS:
            area.spaces.active.image = photo
            button = getattr(bpy.ops.lean_image_ai, operator)
            button(model_path=config["models"][model], **options)
            # what Blender does after a button of an UNDO operator (a script's call pushes no step)
            bpy.ops.ed.undo_push(message=operator)
            made = bpy.data.images[name]
            arrays[name] = pixels(made)
            shown = area.spaces.active.image.name
            bpy.ops.ed.undo()
            after_undo = name in bpy.data.images
            bpy.ops.ed.redo()
            arrays[f"{name}@redo"] = pixels(bpy.data.images[name])
            facts["buttons"][name] = {"shown": shown, "after_undo": after_undo}
            photo = bpy.data.images["photo.png"]  # undo and redo renew every datablock
        # with a saved result: the datablock reads the file it wrote, `//`-relative
        bpy.ops.lean_image_ai.remove_background(
            filepath="//photo.png", output_path="//cutout.png", model_path=config["models"]["ben2"]
        )
        arrays["photo_cutout.001"] = pixels(bpy.data.images["photo_cutout.001"])
        # Replace: the source's new pixels are packed; it keeps its own file and users. Undo gives
        # back the pixels it had, redo the cut-out (issue #39 item 12)
        area.spaces.active.image = bpy.data.images.load("//plate.png")
        arrays["plate.png@before"] = pixels(bpy.data.images["plate.png"])
        bpy.ops.ed.undo_push(message="plate opened")
        bpy.ops.lean_image_ai.remove_background(replace=True, model_path=config["models"]["ben2"])
        bpy.ops.ed.undo_push(message="remove_background replace")
        arrays["plate.png"] = pixels(bpy.data.images["plate.png"])
        bpy.ops.ed.undo()
        arrays["plate.png@undo"] = pixels(bpy.data.images["plate.png"])
        bpy.ops.ed.redo()
        arrays["plate.png@redo"] = pixels(bpy.data.images["plate.png"])
        # a source the add-on loads and keeps (the mesh's material shows it) is stored `//`-relative
        bpy.ops.lean_image_ai.reconstruct_geometry(
            filepath=str(folder / "room.png"), model_path=config["models"]["moge2"]
        )
    plot = importlib.import_module(f"{package}.operators.memory_ops").update_plot_image()
    arrays[plot.name] = pixels(plot)
    facts["images"] = {image.name: describe(image) for image in bpy.data.images}
    bpy.ops.wm.save_mainfile()
    np.savez(folder / "make.npz", **arrays)
    (folder / "make.json").write_text(json.dumps(facts))


def read(config: dict, folder: Path) -> None:
    bpy.ops.wm.open_mainfile(filepath=str(folder / "scene.blend"))
    arrays = {image.name: pixels(image) for image in bpy.data.images if image.size[0] > 0}
    plane = bpy.data.objects.get("photo_depth_plane")
    displace = plane.modifiers["Depth"] if plane is not None else None
    facts = {
        "images": {image.name: describe(image) for image in bpy.data.images},
        "plane_image": displace.texture.image.name if displace and displace.texture else None,
    }
    np.savez(folder / "read.npz", **arrays)
    (folder / "read.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    step, config_file = sys.argv[1], Path(sys.argv[2])
    {"make": make, "read": read}[step](json.loads(config_file.read_text()), config_file.parent)
