"""One family job as the command line runs it, for every front-end that runs it without Blender
(cli.py in one process, farm_ray.py over Ray workers): the family's arguments, the model, the
frame plan, how one result becomes files, and the last line's JSON fields.

Kept apart from cli.py so that the farm runner reuses these very pieces (one concept, one place)
without importing the command line that imports it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import cli_images
from .cli_images import CommandLineError
from .models import frame_lists, library, products
from .models.family import Family
from .models.sequence import BatchReport
from .runtime.errors import LeanImageError

DEMO_NAME = "demo"


def _option_type(option):
    """The flag's parser: the option's own type and range, the limits Blender's property has
    (models/family.py's Option is their one source)."""
    if option.kind is bool:
        return lambda text: text.lower() in ("1", "true", "yes", "on")

    def parse(text: str):
        try:
            value = option.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {_kind_name(option)}, got {text!r}") from None
        if value != value or (option.min is not None and value < option.min) or (
            option.max is not None and value > option.max
        ):
            raise argparse.ArgumentTypeError(f"{text} is out of range: {_accepted(option)}")
        return value

    parse.__name__ = option.kind.__name__  # argparse names the type in its messages
    return parse


def _kind_name(option) -> str:
    return "a whole number" if option.kind is int else "a number"


def _accepted(option) -> str:
    low, high = option.min, option.max
    if low is not None and high is not None:
        return f"give {_kind_name(option)} from {low:g} to {high:g}"
    if low is not None:
        return f"give {_kind_name(option)} >= {low:g}"
    return f"give {_kind_name(option)} <= {high:g}"


def family_arguments(parser: argparse.ArgumentParser, family: Family) -> None:
    """INPUT, OUTPUT, frames, model, device, output policy and the family's own options."""
    parser.add_argument("input", nargs="?", help="image file, folder or pattern")
    parser.add_argument("output", nargs="?", help="file (one image), folder or pattern (out_####.exr)")
    parser.add_argument("--input", dest="input_opt", help=argparse.SUPPRESS)
    parser.add_argument("--output", dest="output_opt", help="same as OUTPUT")
    parser.add_argument("--frames", type=_frames_arg, help="frame range A-B or A-B:STEP")
    parser.add_argument("--model", help="an ONNX file, or a catalog model id (default: the first installed)")
    parser.add_argument("--models-dir", help=f"models folder (default: ${library.MODELS_DIR_ENV} or the user cache)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda:N (default: auto)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing output files")
    parser.add_argument("--skip-existing", action="store_true", help="keep existing outputs, do only the rest")
    parser.add_argument("--stop-on-error", action="store_true", help="stop at the first frame that fails")
    parser.add_argument(
        "--shard",
        type=_shard_arg,
        help="I/N: only part I of N contiguous parts of the frames (render farms: N tasks cover every "
        "frame once; use with --skip-existing so a retried task only does what is missing)",
    )
    for option in family.options:
        if not option.blender_only:
            parser.add_argument(
                "--" + option.name.replace("_", "-"),
                type=_option_type(option),
                default=option.default,
                help=argparse_text(f"{option.description} (default: {option.default})"),
            )
    if family.id == "upscale":
        tile_size = next(o for o in family.options if o.name == "tile_size")
        parser.add_argument(
            "--tile", dest="tile_size", type=_tile_arg(_option_type(tile_size)), help="same as --tile-size; 'auto' is 0"
        )


def argparse_text(text: str) -> str:
    """``text`` as argparse's help wants it: argparse %-formats every help string, so a literal
    ``%`` (a description saying "0.04 = 4%") must be doubled or ``--help`` itself crashes."""
    return text.replace("%", "%%")


def _frames_arg(text: str) -> range:
    try:
        return frame_lists.parse_frames(text)
    except LeanImageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _shard_arg(text: str) -> tuple[int, int] | None:
    try:
        return frame_lists.parse_shard(text)
    except LeanImageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tile_arg(parse_tile_size):
    def parse(text: str) -> int:
        return 0 if text == "auto" else parse_tile_size(text)

    parse.__name__ = "tile size"
    return parse


def resolve_model(family: Family, args) -> library.ModelChoice:
    folder = library.models_dir(args.models_dir or "")
    model = args.model or ""
    as_file = model and (Path(model).expanduser().is_file() or model.endswith(".onnx"))
    return library.resolve(family.id, folder, "" if as_file else model, model if as_file else "")


def option_values(family: Family, args) -> dict:
    """The family's job options as given on the command line (or their defaults)."""
    return {o.name: getattr(args, o.name) for o in family.options if hasattr(args, o.name)}


def plan(family: Family, args):
    """(frame refs, output paths, refs to skip); every check that can fail before the model runs."""
    source = args.input or args.input_opt
    target = args.output or args.output_opt
    if source is None:
        if family.fallback_model is None:
            raise CommandLineError(f"Give an INPUT image, folder or pattern for {family.command}.")
        refs = [frame_lists.FrameRef(1, Path.cwd() / "(generated demo image)")]
        target = target or Path.cwd() / products.default_name(family.id, DEMO_NAME)
        many = False
    else:
        # what this command writes is never read back as a frame (an OUTPUT in the input folder)
        refs = frame_lists.resolve_input(source, args.frames, products.written_by(family.id, target))
        many = (
            len(refs) > 1
            or args.frames is not None
            or frame_lists.is_pattern(source)
            or Path(source).expanduser().is_dir()
        )
    refs, outputs, skip = products.plan_batch(
        family.id,
        refs,
        target,
        in_sequence=many,
        shard=args.shard,
        overwrite=args.overwrite or source is None,  # the demo replaces its own earlier result
        skip_existing=args.skip_existing,
        check_format=cli_images.check_writable_format,
        inputs_are_files=source is not None,
        suffix=products.default_suffix(family.id, _first_input_kind(refs) if source is not None else "8-bit"),
    )
    return refs, outputs, skip


def _first_input_kind(refs) -> str:
    """The output type follows the first frame that exists (a sequence is one format)."""
    return next((cli_images.input_kind(r.path) for r in refs if r.path.is_file()), "8-bit")


def output_type(family: Family, refs, outputs) -> str:
    """What the job writes, for the report and the JSON line (models/products.py's policy)."""
    if not outputs:
        return ""
    demo = not refs[0].path.is_file()
    return products.describe_output(family.id, outputs[0].suffix, "8-bit" if demo else _first_input_kind(refs))


def write_result(family_id: str, out: Path, result, values: dict) -> tuple[list[str], str]:
    """Write one frame's result to ``out`` (and its companions), all or nothing; returns the notes
    for the user and the ``wrote:`` line that describes it."""
    notes = []
    kind = ""
    if family_id == "moge2":
        products.write_geometry(
            out, result, discontinuity=values.get("discontinuity", 0.04), write_normals=cli_images.write_image
        )
        also = [p.name for p in products.companion_paths(family_id, out)[1:] if p.is_file()]
        kind = f" (+ {', '.join(also)})" if also else ""
    else:
        product = products.image_product(family_id, result, out.suffix)
        notes = cli_images.write_image(out, product)
        kind = f", {product.bits} {out.suffix.lstrip('.').upper()}"
    shape = getattr(result, "image", getattr(result, "depth", None))
    scale = f" ({result.scale}x)" if hasattr(result, "scale") else ""
    size = f" {shape.shape[1]}x{shape.shape[0]}{scale}" if shape is not None else ""
    tile = ""
    if hasattr(result, "tile_size_used"):  # the largest window that ran, and its overlap
        tile = f", tile {result.tile_size_used} px, overlap {result.overlap} px"
    return notes, f"wrote: {out}{size}{tile}{kind}"


def summary(family: Family, shard, refs, report: BatchReport, memory: dict, **extra) -> dict:
    """The last line of a job, as JSON: the same fields whichever front-end ran it."""
    return {
        "command": family.command,
        **({"shard": f"{shard[0]}/{shard[1]}", "frame_numbers": [r.number for r in refs]} if shard else {}),
        **report.as_dict(),
        "memory": memory,
        **extra,
    }
