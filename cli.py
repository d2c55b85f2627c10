"""Command line for headless jobs: `python -m lean_image_ai <command> ...` (no Blender needed).

Only `upscale` exists for now. Another family adds itself by writing `_add_<name>(subparsers)`
that registers a subparser with `set_defaults(handler=...)`, and listing it in `COMMANDS`; the
handler gets the parsed arguments and returns an exit code. Shared plumbing (image files,
atomic writes, progress, memory report, exit codes) lives here for all of them.

Image files are read and written with Pillow, which Blender does not ship: inside Blender use the
add-on's operators instead. Pillow is imported only when a file is read or written.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from .models import files
from .runtime import format_snapshot, get_runtime, memory_snapshot, parse_device
from .runtime.errors import LeanImageError, OperationCancelled

EXIT_OK = 0
EXIT_ERROR = 2  # a LeanImageError: the message says what to do
EXIT_INTERRUPTED = 130

DEMO_SIZE = (384, 512)  # height, width


class CommandLineError(LeanImageError):
    """Bad file paths, missing Pillow, unsupported formats: things the user can fix."""


# ---- images ------------------------------------------------------------------------------------


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise CommandLineError(
            "Reading and writing image files needs Pillow, which is not installed in this Python. "
            "Install it (`pip install Pillow`), or run the job from Blender with the add-on's "
            "operator (Blender reads and writes images itself)."
        ) from None
    return Image


def demo_image(height: int = DEMO_SIZE[0], width: int = DEMO_SIZE[1]) -> np.ndarray:
    """A deterministic test card (uint8 RGB): colour gradients, a disc, a ring, stripes, text-like bars."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / max(width - 1, 1), y / max(height - 1, 1)
    image = np.stack([u, v, 1.0 - 0.5 * (u + v)], axis=2)
    radius = np.hypot(x - width * 0.3, y - height * 0.5)
    image[radius < height * 0.22] = (0.95, 0.85, 0.2)
    ring = np.abs(np.hypot(x - width * 0.72, y - height * 0.35) - height * 0.16) < 4
    image[ring] = (0.1, 0.1, 0.1)
    stripes = (x > width * 0.6) & (y > height * 0.65) & (y < height * 0.9)
    image[stripes] = np.where((x[stripes].astype(int) // 3) % 2 == 0, 1.0, 0.0)[:, None]
    for k in range(6):  # thin bars of growing width: where aliasing shows
        top = int(height * 0.08) + k * 9
        image[top : top + 1 + k // 2, int(width * 0.05) : int(width * 0.5)] = 0.0
    return (np.clip(image, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def read_image(path: Path) -> np.ndarray:
    Image = _pillow()
    try:
        with Image.open(path) as source:
            source.load()
            image = source
            if image.mode == "P":
                image = image.convert("RGBA" if "transparency" in image.info else "RGB")
            elif image.mode in ("CMYK", "YCbCr", "LAB", "HSV", "1"):
                image = image.convert("RGB" if image.mode != "1" else "L")
            elif image.mode == "PA":
                image = image.convert("RGBA")
            array = np.asarray(image)
    except FileNotFoundError:
        raise CommandLineError(f"Input image not found: {path}.") from None
    except IsADirectoryError:
        raise CommandLineError(f"Input path {path} is a folder; give an image file.") from None
    except OSError as exc:  # Pillow's UnidentifiedImageError is an OSError too
        raise CommandLineError(f"Cannot read {path} as an image: {exc}.") from None
    if array.dtype.kind in "iu" and array.dtype != np.uint8:
        # 16-bit PNG/TIFF greys come back as int32 ("I") or uint16 ("I;16")
        array = np.clip(array, 0, 65535).astype(np.uint16)
    return array


def _format_for(path: Path) -> str:
    Image = _pillow()
    image_format = Image.registered_extensions().get(path.suffix.lower())
    if image_format is None or image_format not in Image.SAVE:
        raise CommandLineError(
            f"Cannot write {path.name}: unknown or unsupported image file extension "
            f"{path.suffix or '(none)'}. Use .png (keeps alpha), .tif, .webp or .jpg."
        )
    return image_format


def write_image_atomic(path: Path, image: np.ndarray) -> list[str]:
    """Write float [0, 1] HxWxC as 8-bit, all or nothing (models/files.py)."""
    Image = _pillow()
    image_format = _format_for(path)
    notes = []
    array = (np.clip(image, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    if array.shape[2] == 4 and image_format in ("JPEG", "BMP"):
        array = array[:, :, :3]
        notes.append(f"{image_format} has no alpha channel; alpha was dropped (write .png to keep it).")
    picture = Image.fromarray(np.ascontiguousarray(array), "RGBA" if array.shape[2] == 4 else "RGB")
    try:
        with files.atomic_path(path) as temp:
            picture.save(temp, format=image_format)
    except OSError as exc:
        raise CommandLineError(f"Could not write {path}: {exc.strerror or exc}.") from None
    return notes


def _check_output_path(path: Path) -> None:
    """Fail before the model runs, not after."""
    _format_for(path)
    if not path.parent.is_dir():
        raise CommandLineError(f"Output folder {path.parent} does not exist; create it first.")
    if path.is_dir():
        raise CommandLineError(f"Output path {path} is a folder; give a file name such as result.png.")


# ---- progress, memory, interruption -------------------------------------------------------------


class _Progress:
    """Prints a line when the stage kind changes or every 10%, so large jobs stay readable."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self.last_percent = -100
        self.last_kind = None

    def __call__(self, fraction: float, stage: str) -> None:
        percent = int(fraction * 100)
        kind = stage.split(" ")[0]
        if kind != self.last_kind or percent >= self.last_percent + 10 or percent == 100:
            if percent == self.last_percent and kind == self.last_kind:
                return
            print(f"  [{percent:3d}%] {stage}", file=self.stream, flush=True)
            self.last_percent, self.last_kind = percent, kind


class _InterruptToCancel:
    """First Ctrl+C cancels between model runs (clean release); a second one stops at once."""

    def __init__(self):
        self.event = threading.Event()
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.event.is_set():
            raise KeyboardInterrupt
        self.event.set()
        print("\nCancelling after the current model run (Ctrl+C again to stop now)...", file=sys.stderr)

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


def _gpu_id(device: str) -> int | None:
    request = parse_device(device)
    return request.index if request.kind == "cuda" else None


def _print_memory_report(runtime, since: float, before: dict, gpu_id: int | None) -> None:
    after = memory_snapshot(gpu_id)
    print("memory:")
    print(f"  before the job: {format_snapshot(before)}")
    releases = [e for e in runtime.events.recent("memory_release") if e["time"] >= since]
    for event in releases:
        print(
            f"  release after {event['operation']} ({event['model']} on {event['device']}, "
            f"{event['reason']}, shrink {event['shrink'] or 'none'}): "
            f"{format_snapshot(event['before'])} -> {format_snapshot(event['after'])}"
        )
    if not releases:
        print("  release: none (the device has no shrinkable arena, or releasing is off)")
    print(f"  after the job:  {format_snapshot(after)}")


# ---- upscale ---------------------------------------------------------------------------------------


def _tile_arg(text: str):
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number of pixels, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("tile size must be >= 0 (0 = one tile for the whole image)")
    return None if value == 0 else value


def _add_upscale(subparsers) -> None:
    parser = subparsers.add_parser(
        "upscale",
        help="upscale an image with a super-resolution ONNX model",
        description=(
            "Upscale an image with an ONNX super-resolution model (Real-ESRGAN or any 1x3xHxW model). "
            "Without --input a generated demo image is used; without --model the embedded bicubic x2 "
            "model is used, so this works with nothing downloaded."
        ),
    )
    parser.add_argument("--input", type=Path, help="image file to upscale (default: a generated demo image)")
    parser.add_argument(
        "--output",
        type=Path,
        help="where to write the result (default: <input>_x<scale>.png beside the input, or "
        "demo_upscaled_x<scale>.png in the current folder)",
    )
    parser.add_argument("--model", type=Path, help="ONNX model file (default: the embedded bicubic x2)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda:N (default: auto)")
    parser.add_argument(
        "--tile",
        type=_tile_arg,
        default="auto",
        metavar="N",
        help="tile size in pixels, 'auto' (from free memory, the default) or 0 for a single tile; "
        "halved automatically on out-of-memory",
    )
    parser.set_defaults(handler=_run_upscale)


def _run_upscale(args) -> int:
    from .models import upscale

    parse_device(args.device)  # a typo fails here, before anything is loaded
    model = args.model or upscale.DEFAULT_MODEL_PATH
    if args.output is not None:
        _check_output_path(args.output)
    else:
        _pillow()  # fail before the model runs when the result could not be written
    if args.input is None:
        image = demo_image()
        print(f"input: generated demo image {image.shape[1]}x{image.shape[0]}")
    else:
        image = read_image(args.input)
        print(f"input: {args.input} {image.shape[1]}x{image.shape[0]} ({image.dtype})")
    print(f"model: {model}")
    runtime = get_runtime()
    gpu_id = _gpu_id(args.device)
    since = time.time()
    before = memory_snapshot(gpu_id)
    started = time.perf_counter()
    from .models.base import JobOptions

    with _InterruptToCancel() as interrupt:
        options = JobOptions(
            device=args.device, progress=_Progress(), cancel=interrupt.event, runtime=runtime
        )
        try:
            result = upscale.run(image, model, options=options, tile_size=args.tile)
        except OperationCancelled:
            if interrupt.event.is_set():
                raise KeyboardInterrupt from None
            raise
    seconds = time.perf_counter() - started
    output = args.output
    if output is None:
        if args.input is None:
            output = Path.cwd() / f"demo_upscaled_x{result.scale}.png"
        else:
            output = args.input.with_name(f"{args.input.stem}_x{result.scale}.png")
        _check_output_path(output)
    recent = [e for e in runtime.events.recent() if e["time"] >= since]
    sessions = [e for e in recent if e["event"] in ("session_create", "session_reuse")]
    device_label = sessions[-1]["device"] if sessions else args.device
    for event in recent:
        if event["event"] == "provider_fallback":
            print(f"warning: {event['message']}")
    for warning in result.warnings:
        print(f"warning: {warning}")
    for note in write_image_atomic(output, result.image):
        print(f"warning: {note}")
    height, width = result.image.shape[:2]
    print(
        f"result: {width}x{height} ({result.scale}x, {result.image.shape[2]} channels) in {seconds:.2f} s "
        f"on {device_label}, tile {result.tile_size_used} px"
    )
    print(f"wrote: {output}")
    _print_memory_report(runtime, since, before, gpu_id)
    return EXIT_OK


COMMANDS = (_add_upscale,)  # later: remove-background, depth, geometry


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lean_image_ai",
        description="Lean Image AI headless jobs: run the add-on's models on image files without Blender.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(subparsers)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return EXIT_ERROR
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        print("Interrupted; nothing was written.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except LeanImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
