"""Process an image sequence on a render node:

    blender --background --python-exit-code 1 --python examples/farm_sequence.py -- \\
        depth /shots/plate_####.exr /out/ --frames 1001-1100 [--shard I/N] [--skip-existing] [--model-id ID]

--shard I/N (a render farm's task I of N) processes only part I of N contiguous parts of the frames
(models/batch/sequence.py's shard_slice); with --skip-existing a retried or duplicated task redoes only
what is missing, and every file is written all or nothing. Without OUTPUT the results go to the
folder <source folder>_<kind> beside the source's folder (plates/ -> plates_depth/), each frame
under its own number, in a file type that follows the frames (float EXR for EXR plates).

Commands: remove-background, depth, geometry, upscale. Works in a fresh Blender process: the add-on
is enabled here if the saved preferences did not enable it. Exits 0 when every frame was written
(or skipped), 1 when a frame failed or the batch could not run, with the reason said once (Blender
prints the operator's ERROR report on stdout).

The model runs in the add-on's model worker process (models/worker/), as in Blender with a UI:
in background mode the operator's ``execute`` pumps the job itself (modal operators get no timer
events there), and the worker is ended before Blender exits, so a render node keeps no process.

How Blender reports an operator's failure to a script: the operator returns {'CANCELLED'} after an
ERROR report, and bpy.ops turns that into a RuntimeError carrying the report's text. Blender's exit
code stays 0 unless the script exits non-zero (sys.exit below), or --python-exit-code N is given
and an exception escapes the script.
"""

import argparse
import importlib.util
import sys

import bpy

ADDON_MODULES = ("bl_ext.user_default.lean_image_ai", "lean_image_ai")  # extension, or a legacy add-on


def enable_addon() -> str:
    import addon_utils  # Blender's own; importable once bpy is

    for module in ADDON_MODULES:
        if module in bpy.context.preferences.addons:
            return module
    for module in ADDON_MODULES:
        if _importable(module) and addon_utils.enable(module, default_set=True) is not None:
            return module
    raise SystemExit("Lean Image AI is not installed in this Blender (Preferences > Get Extensions).")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package (bl_ext.user_default) is not there
        return False


def family_commands(module: str) -> dict[str, str]:
    """The add-on's commands (remove-background, depth, ...) -> family ids, from its registry."""
    families = importlib.import_module(f"{module}.models.families")
    return {family.command: family.id for family in families.ALL}


def main(argv) -> int:
    commands = family_commands(enable_addon())
    parser = argparse.ArgumentParser(prog="farm_sequence.py")
    parser.add_argument("command", choices=sorted(commands))
    parser.add_argument("source", help="a folder, a pattern like plate_####.exr, or one frame with --frames")
    parser.add_argument(
        "output",
        nargs="?",
        default="",
        help="a folder, or a pattern like out_####.exr (default: the folder <source folder>_<kind> beside "
        "the source's folder; the file type follows the frames: EXR plates give EXR, 16-bit give 16-bit PNG)",
    )
    parser.add_argument("--frames", default="", help="A-B or A-B:STEP (default: every frame)")
    parser.add_argument("--model-id", default="", help="catalog model id (default: the first installed)")
    parser.add_argument("--model-path", default="", help="an ONNX file instead of a catalog model")
    parser.add_argument("--skip-existing", action="store_true")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--stop-on-error", action="store_true")
    parser.add_argument("--shard", default="", help="I/N: part I of N of the frames (default: every frame)")
    args = parser.parse_args(argv)
    try:
        result = bpy.ops.lean_image_ai.process_sequence(
            family=commands[args.command],
            source=args.source,
            output=args.output,
            frames=args.frames,
            model_id=args.model_id,
            model_path=args.model_path,
            skip_existing=args.skip_existing,
            overwrite=args.overwrite,
            stop_on_error=args.stop_on_error,
            shard=args.shard,
        )
    except RuntimeError as exc:  # the operator's ERROR report: which frames failed, and why
        # Blender has printed the report already ("Error: ..." on stdout, as for every report in
        # background mode): printing it again doubled every failure. Anything else is said here.
        if not str(exc).startswith("Error:"):
            print(f"farm_sequence: {exc}", file=sys.stderr)
        return 1
    finally:
        _end_model_worker()
    return 0 if result == {"FINISHED"} else 1


def _end_model_worker() -> None:
    """The worker ends on its own when Blender's end closes its connection; ended here at once."""
    for name, module in list(sys.modules.items()):
        if name.endswith(".models.worker.client") and hasattr(module, "stop_shared"):
            module.stop_shared()


if __name__ == "__main__":
    argv = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []
    sys.exit(main(argv))
