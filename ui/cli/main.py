"""Command line for headless jobs: `python -m lean_image_ai COMMAND INPUT [OUTPUT] ...` (no Blender).

One command per model family (its record's ``command``: remove-background, depth, geometry,
upscale), each on one image, a folder, a numbered pattern (``shot_####.png``) or a frame range
(``--frames 1-48:2``). Everything about the output (format, folder, existing files, the input
itself) is checked before the model runs. A batch is one runtime operation; frames are read and
written while the model runs (models/batch/sequence.py). Progress goes to stdout, one line per stage;
the last line is one JSON object with what was written, skipped and failed, the time and memory.

Memory budgets, in MiB as Blender's preferences (0: no limit): ``--ram-budget`` (this process's RSS
on a CPU job) and ``--vram-budget`` (its GPU memory on a GPU job; also caps the CUDA arena), else
``$LEAN_IMAGE_AI_RAM_BUDGET_MB`` and ``$LEAN_IMAGE_AI_VRAM_BUDGET_MB``. They are checked before
each load and run, and an upscale's auto tile size follows the budget of the device it runs on:
the same budget and image give the same tile plan here, on the farm and in Blender (models/model_run.py).

Exit codes: 0 all frames written (or skipped), 2 an error or a failed frame (one line on stderr
says why, whatever the input, option or environment variable: never a traceback), 130 interrupted
by Ctrl+C, 143 by SIGTERM (a render farm's cancel). Either signal stops the job after the current
model run: the frames already written are kept, none is half-written; a second one stops at once.
Image files are read and written with Pillow and OpenEXR (models/batch/image_files.py), which Blender does not
ship: inside Blender use the add-on's operators.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from ...models import families, files
from ...models.adapters import upscale
from ...models.adapters.upscale.preview import preview_plan
from ...models.batch import image_files
from ...models.batch.frame_io import ImageFileFrames
from ...models.batch.runner import RunEvents, Runner
from ...models.family import Family
from ...runtime import format_snapshot, get_runtime, memory_snapshot, parse_device, settings
from ...runtime.errors import LeanImageError, OperationCancelled, first_line, printable
from ...runtime.log import event_file, event_writer
from ...runtime.measure import memory_plot
from ...runtime.measure.leak_check import MAX_RUNS, MIN_RUNS, RUNS_REASON
from ...runtime.measure.memory import peak_rss_bytes, reset_peak_rss
from ...runtime.oom import out_of_memory_error
from ...runtime.providers import device_help, measured_gpu
from . import cli_doctor, cli_flamenco, cli_gpu, cli_job, cli_models, cli_shot, farm_ray

EXIT_OK = cli_job.EXIT_OK
EXIT_ERROR = cli_job.EXIT_ERROR
EXIT_INTERRUPTED = cli_job.EXIT_INTERRUPTED
EXIT_TERMINATED = cli_job.EXIT_TERMINATED
EXIT_LEAK = 1  # leak-check: memory kept growing

DEMO_SIZE = (384, 512)  # height, width


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
            print(printable(f"  [{percent:3d}%] {stage}"), file=self.stream, flush=True)
            self.last_percent, self.last_kind = percent, kind


def _gpu_id(device: str) -> int | None:
    return measured_gpu(parse_device(device))


def _print_memory_report(runtime, since: float, gpu_id: int | None) -> list[dict]:
    """The job's memory in the runtime's own wording (runtime/measure/memory_report.py): what it grew,
    what the release gave back, what stays and in which floor. Returns the jobs' reports."""
    jobs = [e for e in runtime.events.recent("job_memory") if e["time"] >= since]
    if not jobs:
        print(f"memory: {format_snapshot(memory_snapshot(gpu_id))} (no job ran)")
    for job in jobs:
        for line in job["lines"]:
            print(line)
    return jobs


# ---- one command for every family -----------------------------------------------------------------


def _add_family(subparsers, family: Family) -> None:
    demo = " Without INPUT a generated demo image is used." if family.fallback_model else ""
    parser = subparsers.add_parser(
        family.command,
        help=cli_job.argparse_text(f"{family.title}: {family.produces}"),
        description=f"{family.action}: {family.produces}.{demo} INPUT is an image file, a folder, a "
        "numbered pattern (shot_####.png or shot_%04d.png) or one frame of a numbered sequence "
        "with --frames.",
    )
    cli_job.family_arguments(parser, family)
    cli_shot.add_arguments(parser, family)
    parser.add_argument(
        "--memory-plot", metavar="FILE.png", help="write a PNG of memory during the job (runs, release) to FILE.png"
    )
    if family.id == upscale.FAMILY.id:  # the tile plan is the upscaler's
        parser.add_argument(
            "--plan-only", action="store_true",
            help="print the tile plan (window, overlap, number of windows, compute against one whole-image "
            "run) for the first frame, and run nothing",
        )  # fmt: skip
    parser.set_defaults(handler=_run, family=family)


def _run(args) -> int:
    family: Family = args.family
    parse_device(args.device)  # a typo fails here, before anything is loaded
    spec = cli_job.job_spec(family, args)
    demo = spec.source is None
    tilings = []  # how each upscaled frame was tiled (exact or not), for the JSON line

    def written(ref, out, result, product, notes):
        if hasattr(result, "seams"):
            tilings.append({"tile": result.tile_size_used, "overlap": result.overlap, "seams": result.seams,
                            "exact": result.exact, **(result.plan or {})})
        for note in notes:
            print(printable(f"warning: {note}"))
        print(printable(cli_job.written_line(family.id, out, result, product)), flush=True)
        return []  # said here, as each frame is written

    interrupt = args.interrupts
    events = RunEvents(
        progress=_Progress(), line=lambda text: print(text, flush=True), written=written,
        notice=lambda text: print(printable(text), file=sys.stderr),
    )
    io = ImageFileFrames(demo_image if demo else None)
    runner = Runner(spec, io, events=events, cancel=interrupt.event, runtime=get_runtime())
    refs = runner.refs
    plot = cli_job.plan_memory_plot(args, refs, runner.outputs)
    io.say_size = len(refs) == 1
    height, width = DEMO_SIZE
    shard = f" (shard {args.shard[0]}/{args.shard[1]})" if args.shard else ""
    if demo:
        print(f"input: generated demo image {width}x{height}{shard}")
    else:
        print(printable(f"input: {len(refs)} frame(s){shard}" + (f" from {refs[0].path}" if refs else "")))
    print(printable(f"model: {runner.model_run.model.describe()}"))
    if getattr(args, "plan_only", False):
        return _print_plan(runner, refs, demo)
    output_type = runner.output_type()  # reads the first frame's header: once
    print(f"output: {output_type}")

    runtime = get_runtime()
    gpu_id = _gpu_id(args.device)
    since = time.time()
    before = memory_snapshot(gpu_id)
    reset_peak_rss()
    report = runner.run()
    fallbacks = [e["message"] for e in runtime.events.recent("provider_fallback") if e["time"] >= since]
    for warning in dict.fromkeys([*fallbacks, *report.warnings]):  # each said once per job
        print(printable(f"warning: {warning}"))
    jobs = _print_memory_report(runtime, since, gpu_id)
    plot_error = _write_memory_plot(plot, runtime.last_timeline) if plot else None
    memory = cli_job.memory_figures(before, memory_snapshot(gpu_id), peak_rss_bytes(), jobs)
    print(cli_job.format_memory_figures(memory))
    single = cli_job.single_file(args, refs)
    extra = {"tiling": tilings} if tilings else {}
    preview = {"preview": spec.shot.preview} if spec.shot.preview is not None else {}
    summary = cli_job.summary(
        family, args.shard, refs, report, memory, single=single, output_type=output_type,
        **runner.shot.as_dict(), **preview, **extra,
    )
    print(json.dumps(summary))
    return _ending(report, refs[0].path.name if single else None, plot_error, interrupt)


def _print_plan(runner, refs, demo: bool) -> int:
    """``--plan-only``: the first frame's tile plan, as words and one JSON line; nothing runs."""
    if demo:
        height, width = DEMO_SIZE
    else:
        height, width = image_files.read_image(refs[0].path).shape[:2]
    run = runner.model_run
    plan = preview_plan(run.model.path, height, width, values=run.values, ram_budget=run.budgets.ram_bytes)
    words = plan if isinstance(plan, str) else plan.words()
    print(f"plan: {width}x{height}: {words}")
    print(json.dumps({"plan": plan if isinstance(plan, str) else plan.as_dict(), "size": [height, width]}))
    return 0


def _ending(report, single_name: str | None, plot_error: str | None, interrupt) -> int:
    """What failed, on stderr, and the exit code."""
    for number, error in report.failed:
        print(printable(f"error: {single_name or f'frame {number}'}: {error}"), file=sys.stderr)
    if plot_error:
        print(printable(f"error: {plot_error}"), file=sys.stderr)
    if report.cancelled:
        done = len(report.written)
        kept = f"{done} frame(s) written are kept, nothing was written half-way." if done else "nothing was written."
        print(f"Stopped by {interrupt.name}; {kept}", file=sys.stderr)
        return interrupt.exit_code
    return EXIT_ERROR if report.failed or plot_error else EXIT_OK


def _write_memory_plot(path: Path, timeline: dict | None) -> str | None:
    """Write the planned plot (all or nothing); the problem as one line, after the frames are safe."""
    if not timeline:
        return None
    try:
        files.write_bytes(path, memory_plot.png_bytes(memory_plot.render(timeline)))
    except OSError as exc:
        return f"--memory-plot {path}: could not write it ({exc.strerror or exc}); the frames are written."
    print(printable(f"memory plot: {path} ({'; '.join(memory_plot.legend(timeline))})"))
    return None


def _leak_check(args) -> int:
    """Same request N times; memory after each; the last line is `stable` or `growing`."""
    from ...models.leak_request import repeatable_run
    from ...models.store import library
    from ...runtime.measure.leak_check import leak_check
    from ...runtime.measure.memory_report import mb

    family = families.get(args.family_id)
    parse_device(args.device)
    job = repeatable_run(
        family.id,
        device=args.device,
        model=args.model or "",
        folder=library.models_dir(args.models_dir or ""),
        budgets=cli_job.budgets(args),
        cancel=args.interrupts.event,
    )
    print(f"leak check: {family.command} on a generated image, {args.runs} runs, device {args.device}")

    def after_run(index, values):
        shown = ", ".join(f"{key.upper()} {mb(value)}" for key, value in values.items() if value is not None)
        print(f"  run {index}: {shown}", flush=True)

    result = leak_check(job, runs=args.runs, gpu_device_id=_gpu_id(args.device), after_run=after_run)
    print(result.summary())
    print(result.verdict)
    return EXIT_OK if result.verdict == "stable" else EXIT_LEAK


def _leak_runs(text: str) -> int:
    """argparse type of --runs: fewer than MIN_RUNS is refused with the reason, not only the range."""
    runs = cli_job.counted(0, MAX_RUNS)(text)
    if runs < MIN_RUNS:
        raise argparse.ArgumentTypeError(f"{runs} run(s) cannot be judged. {RUNS_REASON}")
    return runs


def _add_leak_check(subparsers) -> None:
    parser = subparsers.add_parser(
        "leak-check",
        help="run the same request N times and say whether memory is stable or growing",
        description="Runs one family's job on the same generated image N times, records memory "
        "(RSS; this process's VRAM on a GPU) after each, and ends with `stable` (a plateau) or "
        "`growing` (slope per run, and which figure). Exit 0 stable, 1 growing.",
    )
    commands = [f.command for f in families.ALL]
    parser.add_argument(
        "--family",
        dest="family_id",
        type=cli_job.family_arg,
        default="upscale",
        metavar="{" + ",".join(commands) + "}",
        help="which job to repeat, by its command name (default: upscale)",
    )
    parser.add_argument(
        "--runs",
        type=_leak_runs,
        default=60,
        help=f"how many times, {MIN_RUNS} to {MAX_RUNS} (default 60). {RUNS_REASON}",
    )
    parser.add_argument("--model", help="a catalog model id, else an ONNX file (default: the installed or embedded one)")
    parser.add_argument("--models-dir", help="models folder")
    parser.add_argument("--device", default="auto", help=f"{device_help()} (default: auto)")
    cli_job.budget_arguments(parser)
    parser.set_defaults(handler=_leak_check)


class _Parser(argparse.ArgumentParser):
    """argparse's usage errors as one line naming the option, exit 2, like every other error."""

    def error(self, message):
        self.exit(EXIT_ERROR, printable(f"error: {self.prog}: {message} (see --help)") + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m lean_image_ai",
        description="Lean Image AI headless jobs: run the add-on's models on image files without Blender.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for family in families.ALL:
        _add_family(subparsers, family)
    cli_doctor.add_parser(subparsers)
    _add_leak_check(subparsers)
    cli_models.add_parser(subparsers)
    cli_flamenco.add_parser(subparsers)
    cli_gpu.add_parser(subparsers)
    farm_ray.add_parser(subparsers)  # Ray itself is imported only when `farm` runs
    return parser


def check_environment() -> None:
    """Every LEAN_IMAGE_AI_* variable the command line reads, parsed before anything runs (the
    process-wide runtime is made once; these checks run on every call)."""
    settings.settings_from_environment()
    image_files.pixel_limit()
    folder = os.environ.get(event_file.LOG_DIR_ENV, "").strip()
    if folder and event_file.log_folder().exists() and not event_file.log_folder().is_dir():
        raise settings.SettingError(f"{event_file.LOG_DIR_ENV}={folder!r} is not a folder: name a folder for the event log.")


def _log_unwritable(path, error: str) -> None:
    """Said once: the bug line and the docs send the user to this log."""
    print(printable(f"warning: the event log cannot be written at {path} ({error}); the command goes on "
                    f"without it. Set {event_file.LOG_DIR_ENV} to a folder you can write."), file=sys.stderr, flush=True)


def _bug_line(exc: Exception) -> str:
    """The one line of an unexpected error, and where its traceback went (never raising itself)."""
    log = event_file.current()
    if log is not None and log.flush(2.0) and log.error is None:
        where = f"the traceback is in the event log in {log.folder}"
    else:
        where = "the event log could not keep its traceback"
    return f"error: unexpected {type(exc).__name__}: {first_line(exc)} (a bug; {where})"


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return EXIT_ERROR
    with cli_job.Interrupts() as interrupts:
        args.interrupts = interrupts
        try:
            code = _handled(args, interrupts)
        except cli_job.Stopped:  # a second signal while the first one's outcome was being reported
            code = interrupts.exit_code
        finally:
            interrupts.disarm()  # a signal from here on is noted, not raised in the cleanup
            event_file.stop()
    if interrupts.signum is not None:
        cli_job.leave_now_if_a_model_still_runs(code)
    return code


def _handled(args, interrupts) -> int:
    """The command, with every way it can fail as one line and an exit code."""
    try:
        check_environment()
        event_file.start(get_runtime().events, event_file.log_folder(), on_error=_log_unwritable,  # every decision, also on disk
                         kind=event_writer.ThreadedEventFile)
        return int(args.handler(args))
    except cli_job.Stopped:
        print(f"Stopped by {interrupts.name}; the frames already written are kept, none is half-written.", file=sys.stderr)
        return interrupts.exit_code
    except OperationCancelled as exc:
        print(printable(f"Stopped by {interrupts.name}: {exc}"), file=sys.stderr)
        return interrupts.exit_code
    except LeanImageError as exc:
        print(printable(f"error: {exc}"), file=sys.stderr)
        return EXIT_ERROR
    except MemoryError as exc:
        print(printable(f"error: {out_of_memory_error(exc)}"), file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            return _bug(exc)
        print(printable(f"error: {_too_long(exc)}"), file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - a bug still ends in one line; the log keeps the rest
        return _bug(exc)


def _too_long(exc: OSError) -> str:
    """Any path of the command (an input, an output, a folder) that the OS refuses as too long."""
    name = str(exc.filename or "")
    shown = name if len(name) <= 80 else f"{name[:60]}... ({len(name)} characters)"
    return (f"The path {shown} is longer than this system allows (a name or the whole path): "
            "give a shorter name or a folder nearer the root.")


def _bug(exc: Exception) -> int:
    """A bug still ends in one line; the log keeps the rest."""
    with contextlib.suppress(Exception):  # the log is for the report; the line below is for the user
        get_runtime().events.emit("cli_error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    print(printable(_bug_line(exc)), file=sys.stderr)
    return EXIT_ERROR
