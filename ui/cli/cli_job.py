"""One family job as the command line runs it, for every front-end that runs it without Blender
(ui/cli/main.py in one process, ui/cli/farm_ray.py over Ray workers): the family's arguments, the model, the
frame plan, how one result becomes files, and the last line's JSON fields.

Kept apart from ui/cli/main.py so that the farm runner reuses these very pieces (one concept, one place)
without importing the command line that imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

from ...models import families
from ...models.batch import frame_lists
from ...models.batch.sequence import BatchReport
from ...models.family import Family, number_problem
from ...models.job_spec import JobSpec, ShotOptions
from ...models.outputs import output_path
from ...models.store import library
from ...runtime import settings
from ...runtime.errors import LeanImageError, user_path
from ...runtime.measure.memory_report import mb
from ...runtime.providers import device_help
from ...runtime.settings import FALSE_WORDS, TRUE_WORDS


class CommandLineError(LeanImageError):
    """A command line the user can fix: a bad path, a flag out of range, a farm that cannot be reached."""


DEMO_NAME = "demo"
# a temporary file untouched this long before the run is a killed writer's: a live one (another
# task on the same outputs) changes it with every block it writes
STALE_TEMP_S = 10.0
EXIT_OK = 0
EXIT_ERROR = 2  # a LeanImageError or a failed frame: the message says what to do
EXIT_INTERRUPTED = 130  # Ctrl+C
EXIT_TERMINATED = 128 + 15  # SIGTERM: what Flamenco, Deadline and SLURM send on cancel


class Stopped(KeyboardInterrupt):
    """A second signal: stop at once (the frame being written is dropped, its temporary file removed)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Interrupts:
    """Ctrl+C (SIGINT) and a farm's cancel (SIGTERM) are one thing: the first sets ``event`` so the
    job stops after the current model run (finished frames kept, none half-written); a second one,
    or the first when ``immediate``, raises :class:`Stopped` in the main thread."""

    def __init__(self):
        self.event = threading.Event()
        self.signum: int | None = None
        self.immediate = False
        self.armed = True
        self.stops = "after the current model run"  # what the first signal waits for, as the user is told
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, getattr(signal, "SIGTERM", None)):
                if signum is not None:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signum = self.signum or signum
        if self.armed and (self.event.is_set() or self.immediate):
            self.event.set()
            raise Stopped(signum)
        if self.event.is_set():
            return
        self.event.set()
        again = "Ctrl+C again" if signum == signal.SIGINT else "a second SIGTERM"
        print(f"\n{self.name}: cancelling {self.stops} ({again} stops at once)...", file=sys.stderr)

    def disarm(self) -> None:
        """The job is over: a signal from now on only ends what is left (its cleanup) normally."""
        self.armed = False

    @property
    def name(self) -> str:
        return "SIGTERM" if self.signum == getattr(signal, "SIGTERM", None) else "Ctrl+C"

    @property
    def exit_code(self) -> int:
        return EXIT_TERMINATED if self.name == "SIGTERM" else EXIT_INTERRUPTED

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        return False


def leave_now_if_a_model_still_runs(code: int) -> None:
    """After a stop at once, the batch's worker thread may still be inside a model run (native
    code): letting the interpreter finalise under it makes onnxruntime's thread pool call
    std::terminate ('terminate called without an active exception', SIGABRT instead of the exit
    code). Everything of ours is already written or removed by now, so end without finalising."""
    if any(thread is not threading.main_thread() and thread.is_alive() for thread in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _option_type(option):
    """The parser of one family option's flag: its kind and its range, or a message naming both."""

    def parse(text: str):
        if option.kind is bool:
            word = text.strip().lower()
            if word in TRUE_WORDS or word in FALSE_WORDS:
                return word in TRUE_WORDS
            raise argparse.ArgumentTypeError(f"give true or false (1/0, yes/no, on/off), got {settings.quoted(text)}")
        return number(text, option.kind, option.min, option.max)

    return parse


def number(text: str, kind=int, minimum=None, maximum=None):
    """``text`` as a finite ``kind`` (int or float) within [minimum, maximum], for argparse: the
    rule of a job's option values (models/family.py number_problem), read from text."""
    try:
        value = kind(text)
    except (ValueError, OverflowError):
        value = None
    problem = number_problem(value, kind, minimum, maximum)
    if problem:
        raise argparse.ArgumentTypeError(f"{problem}, got {settings.quoted(text)}")
    return value


def counted(minimum: int, maximum: int | None = None):
    """argparse type: a whole number within [minimum, maximum]."""
    return lambda text: number(text, int, minimum, maximum)


def family_arg(text: str) -> str:
    """argparse type: a family by its command name (what the user types to run it); its id is
    accepted too. Returns the id."""
    from ...models import families

    for family in families.ALL:
        if text in (family.command, family.id):
            return family.id
    commands = ", ".join(f.command for f in families.ALL)
    raise argparse.ArgumentTypeError(f"no job called {text!r}; give one of {commands}")


def family_metavar() -> str:
    from ...models import families

    return "{" + ",".join(f.command for f in families.ALL) + "}"


def family_arguments(parser: argparse.ArgumentParser, family: Family) -> None:
    """INPUT, OUTPUT, frames, model, device, output policy and the family's own options."""
    parser.add_argument("input", nargs="?", help="image file, folder or pattern")
    parser.add_argument("output", nargs="?", help="file (one image), folder or pattern (out_####.exr)")
    parser.add_argument("--input", dest="input_opt", help=argparse.SUPPRESS)
    parser.add_argument("--output", dest="output_opt", help="same as OUTPUT")
    parser.add_argument("--frames", type=_frames_arg, help="frame range A-B or A-B:STEP")
    parser.add_argument("--model", help="a catalog model id, else an ONNX file (default: the first installed)")
    parser.add_argument("--models-dir", help=f"models folder (default: ${library.MODELS_DIR_ENV} or the user cache)")
    parser.add_argument("--device", default="auto", help=f"{device_help()} (default: auto)")
    budget_arguments(parser)
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
        if option.alias and not option.blender_only:
            flag = "--" + option.name.replace("_", "-")
            parser.add_argument(
                "--" + option.alias,
                dest=option.name,
                type=_auto_arg(option),
                help=f"same as {flag}; 'auto' is {option.default}",
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


def _auto_arg(option):
    parse_value = _option_type(option)

    def parse(text: str):
        return option.default if text == "auto" else parse_value(text)

    parse.__name__ = option.label.lower()
    return parse


def budgets(args) -> settings.MemoryBudgets:
    """``--ram-budget``/``--vram-budget`` (MiB), else their environment variables, else no limit."""
    from_environment = settings.budgets_from_environment()
    ram, vram = getattr(args, "ram_budget", None), getattr(args, "vram_budget", None)
    return settings.MemoryBudgets(
        from_environment.ram_bytes if ram is None else ram or None,  # a flag's 0: no limit, whatever the variable says
        from_environment.vram_bytes if vram is None else vram or None,
    )


def budget_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ram-budget`` and ``--vram-budget``: MiB, with the unit and limits of Blender's preferences."""
    for kind, env, what in (
        ("ram", settings.RAM_BUDGET_ENV, "system memory (RSS) of a CPU job"),
        ("vram", settings.VRAM_BUDGET_ENV, "this process's GPU memory of a GPU job (also caps the CUDA arena)"),
    ):
        parser.add_argument(
            f"--{kind}-budget",
            metavar="MiB",
            type=_budget_arg(f"--{kind}-budget"),
            help=f"most {what}, in MiB (2**20 bytes), as Blender's preference: checked before each load and run, and an "
            f"upscale's auto tile size follows it; 0: no limit (default: ${env}, else no limit)",
        )


def _budget_arg(flag: str):
    """argparse type of a budget flag: the preferences' and the variables' rule (runtime/settings.py)."""

    def parse(text: str) -> int:
        try:
            return settings.budget_bytes(flag, text) or 0
        except settings.SettingError:
            raise argparse.ArgumentTypeError(
                f"give a whole number of MiB from 0 (no limit) to {settings.MAX_BUDGET_MB}, got {settings.quoted(text)}"
            ) from None

    parse.__name__ = "memory budget"
    return parse


def option_values(family: Family, args) -> dict:
    """The family's job options as given on the command line (or their defaults)."""
    return {o.name: getattr(args, o.name) for o in family.options if hasattr(args, o.name)}


def job_spec(family: Family, args, *, farm: bool = False) -> JobSpec:
    """The job (models/job_spec.py) the command line's arguments describe; the checks only the
    command line has (INPUT given twice, no INPUT) before anything is resolved."""
    source = _checked_input(family, args)
    limits = budgets(args)
    shot = ShotOptions(**{name: getattr(args, flag, getattr(ShotOptions, name)) for name, flag in SHOT_FLAGS.items()})
    return JobSpec(
        family.id, model=args.model or "", models_dir=args.models_dir or "", source=source, output=args.output or args.output_opt,
        overwrite=args.overwrite or source is None,  # the demo replaces its own earlier result
        skip_existing=args.skip_existing, shard=args.shard, stop_on_error=args.stop_on_error,
        values=option_values(family, args), device=args.device, ram_budget=limits.ram_bytes,
        vram_budget=limits.vram_bytes, shot=shot, farm=farm,
    ).with_frames(args.frames)


def _checked_input(family: Family, args) -> str | None:
    """INPUT once, and one at all unless the family has a demo image."""
    for given, flag in ((args.input, args.input_opt), (args.output, args.output_opt)):
        if given and flag and given != flag:
            kind = "INPUT" if flag is args.input_opt else "OUTPUT"
            raise CommandLineError(f"{kind} is given twice ({given} and --{kind.lower()} {flag}); give it once.")
    source = args.input or args.input_opt
    if source is None and family.fallback_model is None:
        raise CommandLineError(f"Give an INPUT image, folder or pattern for {family.command}.")
    if source is None and args.frames is not None:
        raise CommandLineError("--frames needs an INPUT sequence (the generated demo image is one frame).")
    return source


SHOT_FLAGS = {"depth_range": "depth_range", "align_depth": "align_depth", "camera": "camera", "fov": "fov",
              "preview": "preview"}  # the job's shot field -> its argparse destination


def plan_memory_plot(args, refs, outputs) -> Path | None:
    """``--memory-plot``: an output like the others, checked before any model runs. A PNG (the
    plot's only format), not an input or another output, in a folder that exists, not replacing a
    file without ``--overwrite``."""
    if not getattr(args, "memory_plot", None):
        return None
    path = output_path(user_path(args.memory_plot))
    where = f"--memory-plot {args.memory_plot}"
    record = args.family.output
    taken = {Path(r.path).resolve() for r in refs} | {p for out in outputs for p in record.companion_paths(out)}
    if path in taken:
        raise CommandLineError(f"{where}: that is an input or an output of this job; give the plot its own name.")
    if path.is_dir():
        raise CommandLineError(f"{where} is a folder; give a file name such as memory.png.")
    if path.suffix.lower() != ".png":
        raise CommandLineError(f"{where}: the memory plot is a PNG image; give a name ending in .png.")
    if not path.parent.is_dir():
        raise CommandLineError(f"{where}: the folder {path.parent} does not exist; make it or choose another.")
    if not os.access(path.parent, os.W_OK):
        raise CommandLineError(f"{where}: the folder {path.parent} is not writable.")
    if os.path.lexists(path) and not args.overwrite:
        raise CommandLineError(f"{where} exists; add --overwrite to replace it, or choose another name.")
    return path


def written_line(family_id: str, out: Path, result, product) -> str:
    """The ``wrote:`` line that describes one frame's files."""
    if product is not None and "lean_image_ai:depth_range" in product.metadata:  # a shot's depth range
        low, high = product.metadata["lean_image_ai:depth_range"].split()
        size = f"{product.pixels.shape[1]}x{product.pixels.shape[0]}"
        return f"wrote: {out} {size}, depth range {float(low):.6g}..{float(high):.6g}"
    if product is None:
        also = [p.name for p in families.get(family_id).output.companion_paths(out)[1:] if p.is_file()]
        kind = f" (+ {', '.join(also)})" if also else ""
    else:
        kind = f", {product.bits} {out.suffix.lstrip('.').upper()}"
    shape = getattr(result, "image", getattr(result, "depth", None))
    scale = f" ({result.scale}x)" if hasattr(result, "scale") else ""
    size = f" {shape.shape[1]}x{shape.shape[0]}{scale}" if shape is not None else ""
    tile = ""
    if hasattr(result, "tile_size_used"):  # the largest window that ran, and its overlap
        tile = f", tile {result.tile_size_used} px, overlap {result.overlap} px, seams {result.seams}"
        if getattr(result, "plan", None):
            tile += f", {result.plan['windows']} window(s), compute {result.plan['compute']:.2f}x one run"
    return f"wrote: {out}{size}{tile}{kind}"


def single_file(args, refs) -> bool:
    """One image file given as it is (not a pattern, folder or frame range): its name is what
    messages call it, never a "frame" numbered from digits in the name (img1080.png)."""
    source = args.input or args.input_opt
    if source is None or len(refs) != 1 or args.frames is not None or frame_lists.is_pattern(source):
        return False
    return not user_path(source).is_dir()


def memory_figures(before: dict, after: dict, process_peak: int | None, jobs=()) -> dict:
    """The JSON line's memory, in bytes, each figure named for what it measures: the process's RSS
    before and after the command, its peak over the whole command (reading, the jobs, writing the
    files and the plot) and the jobs' peak (the one the text report and the picture say)."""
    peaks = [f["peak"] for job in jobs for f in job["figures"] if f["figure"] == "ram" and f["peak"] is not None]
    job_peak = max(peaks, default=None)
    if process_peak is not None and job_peak is not None:
        # the kernel's high-water mark is synced lazily and can lag a sampled RSS: the job is in the process
        process_peak = max(process_peak, job_peak)
    return {
        "unit": "bytes",
        "rss_before": before.get("rss_bytes"),
        "process_rss_peak": process_peak,
        "job_rss_peak": job_peak,
        "rss_after": after.get("rss_bytes"),
    }


def format_memory_figures(memory: dict) -> str:
    """The same figures in words, in MiB as the report: the process's peak is not the job's."""
    job = f"; the job's peak {mb(memory['job_rss_peak'])}" if memory.get("job_rss_peak") is not None else ""
    return (f"process RAM (RSS) over the whole command: peak {mb(memory['process_rss_peak'])} "
            f"(reading, the job, writing){job}; now {mb(memory['rss_after'])}")


def summary(family: Family, shard, refs, report: BatchReport, memory: dict, *, single: bool = False, **extra) -> dict:
    """The last line of a job, as JSON: the same fields whichever front-end ran it."""
    batch = report.as_dict()
    if single:  # the input file by its path, not as a frame number read from its name
        batch["failed"] = [{"input": str(refs[0].path), "error": error} for _, error in report.failed]
    return {
        "command": family.command,
        **({"shard": f"{shard[0]}/{shard[1]}", "frame_numbers": [r.number for r in refs]} if shard else {}),
        **batch,
        "memory": memory,
        **extra,
    }
