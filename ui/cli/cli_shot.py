"""Shot-wide options of the command line: one depth range and aligned depth for a depth sequence,
one camera for a MoGe-2 sequence, and ``--preview N`` (one frame, the same settings).

A shot option that needs the whole shot first (``--depth-range auto-shot``, ``--camera shot``)
runs a first pass over every frame that keeps two floats a frame (a depth range, a focal length),
never a frame; the writing pass then uses the one value for all. The maths is in
models/adapters/shot_depth.py and models/adapters/shot_camera.py.
"""

from __future__ import annotations

import argparse

from ...models import products
from ...models.adapters import shot_camera, shot_depth
from ...models.batch.shot_batch import ShotSettings
from ...runtime.errors import LeanImageError, OperationCancelled
from .cli_images import CommandLineError
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


class ShotRun:
    """What the shot options add to one command's run: the frames, a first pass, the writer, the
    JSON fields (the options themselves: models/batch/shot_batch.py's ShotSettings)."""

    def __init__(self, family, args, *, farm: bool = False):
        self.preview = getattr(args, "preview", None)
        if farm and self.preview is not None:
            raise CommandLineError(f"--preview {self.preview} is one frame: run it without the farm ({family.command} ... --preview N).")
        # what a farm worker needs to make the same settings (plain values: Ray sends them)
        self.options = {
            "depth_range": getattr(args, "depth_range", shot_depth.PER_FRAME),
            "align_depth": bool(getattr(args, "align_depth", False)),
            "camera": getattr(args, "camera", shot_camera.PER_FRAME),
            "fov": getattr(args, "fov", None),
        }
        try:
            self.settings = ShotSettings(
                family.id,
                **self.options,
                shard=args.shard,
                skip_existing=bool(getattr(args, "skip_existing", False)),
                farm=farm,
            )
        except LeanImageError as exc:
            raise CommandLineError(str(exc)) from None

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
        if self.settings.needs_first_pass:
            print(f"first pass: {self.settings.first_pass_keeps} only (no file is written)", flush=True)
            if run_pass(self.settings.record).cancelled:
                raise OperationCancelled("The first pass was cancelled; nothing was written.")
            print(self.settings.finish_first_pass(), flush=True)
        return self.settings.adapter_kwargs()

    def writer(self, write_result):
        return shot_writer(self.settings, write_result)

    def as_dict(self) -> dict:
        fields = self.settings.as_dict()
        if self.preview is not None:
            fields["preview"] = self.preview
        return fields


def shot_writer(settings: ShotSettings, write_result):
    """``write_result(family_id, out, result, values)``, writing the shot's depth (one range, aligned)
    through the job's output in place of the family's own image."""
    if settings.depth is None:
        return write_result

    from . import cli_images

    def write(family_id, out, result, values):
        notes, product = products.write_result(
            family_id, out, result, values, cli_images.write_image, image=settings.output_image
        )
        low, high = product.metadata["lean_image_ai:depth_range"].split()
        size = f"{product.pixels.shape[1]}x{product.pixels.shape[0]}"
        return notes, f"wrote: {out} {size}, depth range {float(low):.6g}..{float(high):.6g}"

    return write
