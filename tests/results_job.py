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
        # back the pixels it had, redo the cut-out (issue #39 item 12). A byte plate and a float one
        # (an EXR Blender reads as sRGB: its packed cut-out must not be linearised again)
        write_float_plate(folder / "plate.exr")
        for plate in ("plate.exr", "plate.png"):  # the byte plate stays shown (its users: the editor)
            replace_in_editor(area, arrays, plate, config["models"]["ben2"])
        bpy.data.images["plate.exr"].use_fake_user = True  # no longer shown: kept for the reopen
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


def write_float_plate(path: Path) -> None:
    """An RGBA EXR written by Blender's Image.save from a new float image (tagged sRGB: Blender reads
    it as sRGB), colour above 1 and alpha below 1."""
    y, x = np.mgrid[0:28, 0:40].astype(np.float32) / 40
    alpha = 0.25 + 0.75 * y
    premultiplied = np.stack([3 * x * alpha, y * alpha, (x + y) / 2 * alpha, alpha], axis=-1)
    image = bpy.data.images.new("plate_writer", 40, 28, alpha=True, float_buffer=True)
    image.pixels.foreach_set(np.ascontiguousarray(premultiplied[::-1], np.float32).ravel())
    image.filepath_raw, image.file_format = str(path), "OPEN_EXR"
    image.save()
    bpy.data.images.remove(image)


def replace_in_editor(area, arrays: dict, name: str, model: str) -> None:
    """Replace on ``//name`` shown in the editor, undone and redone; its pixels at each step."""
    area.spaces.active.image = bpy.data.images.load(f"//{name}")
    arrays[f"{name}@before"] = pixels(bpy.data.images[name])
    bpy.ops.ed.undo_push(message=f"{name} opened")
    bpy.ops.lean_image_ai.remove_background(replace=True, model_path=model)
    bpy.ops.ed.undo_push(message="remove_background replace")
    arrays[name] = pixels(bpy.data.images[name])
    bpy.ops.ed.undo()
    arrays[f"{name}@undo"] = pixels(bpy.data.images[name])
    bpy.ops.ed.redo()
    arrays[f"{name}@redo"] = pixels(bpy.data.images[name])


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
