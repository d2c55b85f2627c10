"""Shot-wide options of the command line: one depth range and aligned depth for a depth sequence,
one camera for a MoGe-2 sequence, and ``--preview N`` (one frame, the same settings).

A shot option that needs the whole shot first (``--depth-range auto-shot``, ``--camera shot``)
runs a first pass over every frame that keeps two floats a frame (a depth range, a focal length),
never a frame; the writing pass then uses the one value for all. The maths is in
models/adapters/shot_depth.py and models/adapters/shot_camera.py.
"""

from __future__ import annotations

import argparse

from ...models.adapters import shot_camera, shot_depth
from .cli_job import number


def add_arguments(parser: argparse.ArgumentParser, family) -> None:
    group = parser.add_argument_group("shot (sequences)")
    if "depth" in family.shot:
        group.add_argument(
            "--depth-range",
            default=shot_depth.PER_FRAME,
            metavar="MODE",
            help="how depth maps to 0..1 in 8/16-bit files: per-frame (each frame's own min..max, the "
            "default), auto-shot (a first pass finds one range for the whole shot: no flicker), or A:B",
        )
        group.add_argument(
            "--align-depth",
            action="store_true",
            help="align each frame's depth to the previous one (robust scale and shift on the pixels "
            "that agree), so a static background keeps its value",
        )
    if "camera" in family.shot:
        group.add_argument(
            "--camera",
            choices=shot_camera.MODES,
            default=shot_camera.PER_FRAME,
            help="per-frame: each frame fits its own focal length (default); shot: a first pass fits one "
            "focal for the shot (median over frames), used for every frame's depth and mesh",
        )
        group.add_argument(
            "--fov",
            type=lambda text: number(text, float, *shot_camera.FOV_LIMITS_DEG),
            metavar="DEG",
            help="fix the horizontal field of view (degrees, {:g} to {:g})".format(*shot_camera.FOV_LIMITS_DEG),
        )
    group.add_argument("--preview", type=lambda text: number(text, int, 0), metavar="N", help="process only frame N, with the same settings")
