"""Results belong to the .blend (issue 32), checked the same way in the dev venv's bpy
(tests/test_results_in_blend.py) and in each stock Blender with the built zip installed
(tests/test_stock_blender.py): the project both give tests/results_job.py, and what each of its
facts must say. Runs in the test's Python (Pillow, onnx), never inside Blender."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

RESULTS = ("photo_cutout", "photo_depth", "photo_normal", "photo_x2")
REPLACED = ("plate.png", "plate.exr")  # a byte source and a float one (tests/results_job.py)
REOPENED = (*RESULTS, "photo_cutout.001", "Lean Image AI Memory", *REPLACED)
W, H = 40, 28


def photo_pixels(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (H, W, 4), dtype=np.uint8)
    pixels[..., 0] = np.maximum(pixels[..., 0], 60)  # MoGe-like model: red 0 is "no geometry"
    pixels[..., 3] = 255
    return pixels


def make_project(root: Path) -> Path:
    """photo.png, room.png, plate.png and the four stand-in models; returns the job's config file."""
    from builders_families import ben2_like_model, da3_like_model
    from builders_moge2 import moge2_like_model
    from onnx_builders import sr_model
    from PIL import Image as PILImage

    folder = root / "project"
    folder.mkdir(parents=True)
    for name, seed in (("photo", 1), ("room", 2), ("plate", 4)):
        PILImage.fromarray(photo_pixels(seed), "RGBA").save(folder / f"{name}.png")
    models = root / "results_models"
    models.mkdir()
    paths = {
        "ben2": ben2_like_model(models / "ben2.onnx", size=64),
        "da3": da3_like_model(models / "da3.onnx", fixed_hw=(28, 42)),
        "moge2": moge2_like_model(models / "moge.onnx"),
        "sr": sr_model(models / "sr.onnx", scale=2),
    }
    config = folder / "config.json"
    config.write_text(json.dumps({"models": {k: str(v) for k, v in paths.items()}}))
    return config


def load_session(folder: Path, output: str) -> dict:
    """What the make and read steps wrote, and the console of make (its warnings)."""
    return {
        "made": json.loads((folder / "make.json").read_text()),
        "made_pixels": dict(np.load(folder / "make.npz")),
        "read": json.loads((folder / "read.json").read_text()),
        "read_pixels": dict(np.load(folder / "read.npz")),
        "output": output,
        "folder": folder,
    }


def _file_pixels(path: Path) -> np.ndarray:
    from PIL import Image as PILImage

    return np.asarray(PILImage.open(path).convert("RGBA"), np.float32) / 255


def check_reopened_pixels(session: dict, name: str) -> None:
    assert name in session["read_pixels"], f"{name} was lost: {session['read']['images'].get(name)}"
    made, read = session["made_pixels"][name], session["read_pixels"][name]
    assert made.shape == read.shape, (name, made.shape, read.shape)
    np.testing.assert_array_equal(read, made, err_msg=name)


def check_depth_plane(session: dict) -> None:
    assert session["read"]["plane_image"] == "photo_depth"
    depth = session["read_pixels"]["photo_depth"]
    assert depth.std() > 0  # not the black image of a lost generated buffer
    np.testing.assert_array_equal(depth, session["made_pixels"]["photo_depth"])


def check_packed(session: dict, name: str) -> None:
    assert session["read"]["images"][name]["packed"], session["read"]["images"][name]


def check_packed_from_own_png(session: dict, name: str) -> None:
    """A byte result is packed from the add-on's own PNG (issue #37 item 10), not by Blender's
    pack() on the main thread: deflate level 1 (zlib header 78 01; Blender's PNG writer uses
    another level). Packed at once (redo keeps its pixels) and after save and reopen."""
    made = session["made"]["images"][name]
    assert made["packed"] and made["packed_head"][:4] == list(b"\x89PNG"), made
    idat = made["packed_head"][33 + 8:33 + 10]  # after the signature, IHDR, IDAT's length and tag
    assert idat == [0x78, 0x01], made
    assert session["read"]["images"][name]["packed"], session["read"]["images"][name]


def check_saved_result_reads_its_file(session: dict) -> None:
    image = session["read"]["images"]["photo_cutout.001"]
    assert image["source"] == "FILE" and image["filepath"] == "//cutout.png" and not image["packed"], image
    written = _file_pixels(session["folder"] / "cutout.png")
    read = session["read_pixels"]["photo_cutout.001"].reshape(H, W, 4)[::-1]
    np.testing.assert_allclose(read, written, atol=1e-6)


def check_replaced_source(session: dict) -> None:
    plate = session["read"]["images"]["plate.png"]
    assert plate["filepath"] == "//plate.png" and plate["packed"] and plate["users"] == 1, plate  # the editor
    original = _file_pixels(session["folder"] / "plate.png")
    assert not np.array_equal(session["read_pixels"]["plate.png"].reshape(H, W, 4)[::-1], original)


def check_replace_undo_redo(session: dict) -> None:
    """Undo after Replace shows the pixels the image had (the datablock alone came back before),
    redo the cut-out again; and the .blend saved after keeps the cut-out (check_reopened_pixels)."""
    made = session["made_pixels"]
    for name in REPLACED:
        assert not np.array_equal(made[name], made[f"{name}@before"]), name
        np.testing.assert_array_equal(made[f"{name}@undo"], made[f"{name}@before"], err_msg=f"{name} after undo")
        np.testing.assert_array_equal(made[f"{name}@redo"], made[name], err_msg=f"{name} after redo")


def check_loaded_source_relative(session: dict) -> None:
    assert session["read"]["images"]["room.png"]["filepath"] == "//room.png", session["read"]["images"]["room.png"]


def check_no_blend_relative_warning(session: dict) -> None:
    assert "blend relative" not in session["output"], session["output"][-3000:]


def check_undo_redo(session: dict, name: str) -> None:
    assert session["made"]["buttons"][name]["after_undo"] is False, name
    np.testing.assert_array_equal(session["made_pixels"][f"{name}@redo"], session["made_pixels"][name], err_msg=name)


def check_shown(session: dict, name: str) -> None:
    assert session["made"]["buttons"][name]["shown"] == name
    photo = session["read"]["images"]["photo.png"]
    assert photo["users"] >= 1  # still one click away in the image browser, also after reopening
