"""Shot-wide options of the command line: one depth range and aligned depth for a depth sequence,
one camera for a MoGe-2 sequence, and ``--preview N`` (one frame, the same settings).

A shot option that needs the whole shot first (``--depth-range auto-shot``, ``--camera shot``)
runs a first pass over every frame that keeps two floats a frame (a depth range, a focal length),
never a frame; the writing pass then uses the one value for all. The maths is in
models/shot_depth.py and models/shot_camera.py.
"""

from __future__ import annotations

import argparse

from .cli_images import CommandLineError
from .models import products, shot_camera, shot_depth
from .runtime.errors import OperationCancelled


def add_arguments(parser: argparse.ArgumentParser, family) -> None:
    group = parser.add_argument_group("shot (sequences)")
    if family.id == "da3":
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
    if family.id == "moge2":
        group.add_argument(
            "--camera",
            choices=shot_camera.MODES,
            default=shot_camera.PER_FRAME,
            help="per-frame: each frame fits its own focal length (default); shot: a first pass fits one "
            "focal for the shot (median over frames), used for every frame's depth and mesh",
        )
        group.add_argument("--fov", type=float, metavar="DEG", help="fix the horizontal field of view (degrees)")
    group.add_argument("--preview", type=int, metavar="N", help="process only frame N, with the same settings")


class ShotRun:
    """What the shot options add to one command's run: the frames, a first pass, the writer, the
    JSON fields."""

    def __init__(self, family, args):
        self.family_id = family.id
        self.preview = getattr(args, "preview", None)
        self.depth = None
        self.camera = None
        if family.id == "da3":
            choice = shot_depth.parse_depth_range(getattr(args, "depth_range", shot_depth.PER_FRAME))
            depth = shot_depth.ShotDepth(choice, align=bool(getattr(args, "align_depth", False)))
            self.depth = depth if depth.changes_output else None
        if family.id == "moge2":
            camera = shot_camera.ShotCamera(getattr(args, "camera", shot_camera.PER_FRAME), getattr(args, "fov", None))
            self.camera = camera if camera.changes_output else None
        if args.shard and self._first_pass_needed:
            raise CommandLineError(
                "--depth-range auto-shot and --camera shot look at the whole shot, but --shard gives this "
                "task only part of it. Give the shot's values instead: --depth-range A:B, --fov DEG."
            )

    @property
    def _first_pass_needed(self) -> bool:
        return bool((self.depth and self.depth.needs_first_pass) or (self.camera and self.camera.needs_first_pass))

    def frames(self, refs: list, skip: set) -> tuple[list, set]:
        """All frames, or only the one asked for with --preview (its output is written anyway)."""
        if self.preview is None:
            return refs, skip
        chosen = [r for r in refs if r.number == self.preview]
        if not chosen:
            numbers = [r.number for r in refs]
            shown = f"{numbers[0]}-{numbers[-1]}" if numbers else "none"
            raise CommandLineError(f"--preview {self.preview}: there is no such frame (frames {shown}); give one of them.")
        return chosen, set()

    def first_pass(self, run_pass) -> dict:
        """Run ``run_pass(record)`` (a batch over every frame whose 'write' is ``record``) when a
        shot option needs it; returns adapter keyword arguments for the writing pass."""
        if not self._first_pass_needed:
            return self.camera.adapter_kwargs() if self.camera else {}
        what = "depth ranges" if self.depth else "focal lengths"
        print(f"first pass: {what} only (no file is written)", flush=True)

        def record(ref, result):
            if self.depth is not None:
                self.depth.record(result.depth)
            if self.camera is not None:
                self.camera.record(result)

        report = run_pass(record)
        if report.cancelled:
            raise OperationCancelled("The first pass was cancelled; nothing was written.")
        if self.depth is not None:
            low, high = self.depth.finish_first_pass()
            print(f"shot depth range: {low:.6g}..{high:.6g} over {self.depth.frames_recorded} frame(s)", flush=True)
        if self.camera is not None:
            self.camera.finish_first_pass()
            print(f"shot camera: {self.camera.describe()}", flush=True)
        return self.camera.adapter_kwargs() if self.camera else {}

    def writer(self, write_result):
        """``write_result(family_id, out, result, values)``, with the shot's depth product."""
        if self.depth is None:
            return write_result

        from . import cli_images

        def write(family_id, out, result, values):
            product, notes = self.depth.product(result.depth, out.suffix, products.FLOAT_SUFFIXES)
            notes = notes + cli_images.write_image(out, product)
            low, high = product.metadata["lean_image_ai:depth_range"].split()
            return notes, f"wrote: {out} {product.pixels.shape[1]}x{product.pixels.shape[0]}, depth range {float(low):.6g}..{float(high):.6g}"

        return write

    def as_dict(self) -> dict:
        fields = {}
        if self.depth is not None:
            fields.update(self.depth.as_dict())
        if self.camera is not None:
            fields["camera"] = self.camera.as_dict()
        if self.preview is not None:
            fields["preview"] = self.preview
        return fields

