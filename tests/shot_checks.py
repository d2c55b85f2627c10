"""The shot operators' all-or-nothing rule (issue 32, item 4), run the same way in the dev venv's
bpy (tests/test_shot_blender.py) and in each stock Blender with the built zip installed
(tests/stock_blender_job.py, checked by tests/test_stock_blender.py): a shot with a damaged frame
given to Reconstruct Shot and Process Sequence. ``shot_facts`` runs inside Blender (numpy and
bpy only, the operators through ``bpy.ops``); ``red_shot`` and the checks run in the test."""

from __future__ import annotations

import re
from pathlib import Path

KINDS = ("objects", "meshes", "materials", "images", "actions", "cameras")
SHOT_ERROR = r"added nothing.*Failed: frame 2: Blender cannot read"
SEQUENCE_ERROR = r"2 written, 0 skipped, 1 failed of 3.*Failed: frame 2: Blender cannot read"


def red_shot(folder: Path, count: int = 4, damaged: int | None = None) -> Path:
    """``r_0001.png``... red frames the MoGe-like model sees whole; frame ``damaged`` truncated."""
    import numpy as np
    from PIL import Image as PILImage
    from test_moge2 import red_image

    folder.mkdir(parents=True)
    for n in range(1, count + 1):
        PILImage.fromarray((red_image(30, 40) * 255).astype(np.uint8)).save(folder / f"r_{n:04d}.png")
    if damaged is not None:
        good = (folder / f"r_{damaged:04d}.png").read_bytes()
        (folder / f"r_{damaged:04d}.png").write_bytes(good[: len(good) // 3])
    return folder


def scene_state(bpy) -> dict:
    """What a shot operator may change: every datablock list it adds to, the scene's camera,
    frame range and resolution."""
    scene = bpy.context.scene
    return {
        **{kind: sorted(getattr(bpy.data, kind).keys()) for kind in KINDS},
        "camera": scene.camera.name if scene.camera else None,
        "frames": [scene.frame_start, scene.frame_end],
        "resolution": [scene.render.resolution_x, scene.render.resolution_y],
    }


def _run(bpy, operator, **kwargs) -> dict:
    before = scene_state(bpy)
    try:
        result, error = sorted(operator(**kwargs)), ""
    except RuntimeError as exc:  # bpy raises an operator's ERROR report
        result, error = ["raised"], str(exc)
    return {"result": result, "error": error, "before": before, "after": scene_state(bpy)}


def shot_facts(bpy, shot: Path, moge2: str, upscale: str, out: Path) -> dict:
    """Both shot operators on a 3-frame shot whose frame 2 is damaged."""
    ops = bpy.ops.lean_image_ai
    facts = {
        "reconstruct_shot": _run(bpy, ops.reconstruct_shot, source=str(shot), model_path=moge2, shot_camera="shot"),
        "process_sequence": _run(
            bpy, ops.process_sequence, family="upscale", source=str(shot), output=str(out / "u_####.png"), model_path=upscale
        ),
    }
    facts["process_sequence"]["written"] = sorted(p.name for p in out.glob("*")) if out.is_dir() else []
    return facts


def check_reconstruct_shot(facts: dict) -> None:
    """CANCELLED leaves the scene as it was; the failed frame is named with its error in an ERROR."""
    run = facts["reconstruct_shot"]
    assert run["result"] == ["raised"] and re.search(SHOT_ERROR, run["error"], re.S), run
    assert "r_0002.png" in run["error"], run["error"]
    assert run["after"] == run["before"]


def check_process_sequence(facts: dict) -> None:
    """The good frames are written, the failed one named; nothing is left in the .blend."""
    run = facts["process_sequence"]
    assert run["result"] == ["raised"] and re.search(SEQUENCE_ERROR, run["error"], re.S), run
    assert run["after"] == run["before"]
    assert run["written"] == ["u_0001.png", "u_0003.png"], run["written"]
