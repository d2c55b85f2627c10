"""`python -m lean_image_ai farm FAMILY INPUT OUTPUT --address ...`: one sequence over Ray workers.

A front-end beside the command line (main.py) for plain-Python pipelines. The driver plans the
frames as the command line does (models/batch/runner.py: frame list, shard, output names and checks),
cuts the list into chunks with the farm's split rule (frame_lists.shard_slice), and hands one
chunk at a time to each worker: a Ray actor (farm_worker.FrameWorker) that keeps the runtime
and its session for the whole run. Input and output live on storage every worker shares;
each frame is written by the one atomic writer.

This module is the command (its arguments, the plan, the workers' start and end, the outcome);
the scheduling and what a worker's death costs (at most ``--max-tries`` tries of a frame, every
output complete or absent) are farm_schedule.py's. Ray is imported only by this command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from ...models import families
from ...models.batch.frame_io import ImageFileFrames
from ...models.batch.runner import RunEvents, Runner
from ...models.batch.sequence import BatchReport
from ...models.family import Family
from ...runtime import memory_snapshot, parse_device
from ...runtime.errors import LeanImageError, printable
from ...runtime.measure.memory import peak_rss_bytes, reset_peak_rss
from . import cli_job, cli_shot, farm_connect
from .cli_job import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, CommandLineError
from .farm_schedule import Farm, FarmFrame
from .farm_worker import FrameWorker

INSTALL_HINT = "pip install 'lean_image_ai[farm]'"
MAX_AUTO_CHUNK = 8  # frames: one release per chunk costs ~1%, a lost chunk redoes at most this many


def add_parser(subparsers) -> None:
    farm = subparsers.add_parser(
        "farm",
        help="run a family's job over a sequence on Ray workers (needs the farm extra)",
        description="The same job as the family's own command, over Ray workers: one actor per worker keeps "
        "the model loaded; frames are read from and written to storage every worker shares. "
        f"Needs Ray: {INSTALL_HINT}.",
    )
    per_family = farm.add_subparsers(dest="farm_family", metavar="FAMILY")
    for family in families.ALL:
        parser = per_family.add_parser(
            family.command, help=cli_job.argparse_text(f"{family.title}: {family.produces}")
        )
        cli_job.family_arguments(parser, family)
        cli_shot.add_arguments(parser, family)  # those a farm can honour; the rest refused in run()
        parser.add_argument(
            "--address",
            type=_address_arg,
            default="local",
            help="local (start Ray on this machine), auto (the running cluster) or ray://HOST:PORT",
        )
        parser.add_argument(
            "--workers", type=cli_job.counted(0, 100_000), default=0, help="worker actors (default: the cluster's CPUs / threads)"
        )
        parser.add_argument("--gpus-per-worker", type=_gpus_arg, default=0.0, help="GPUs Ray gives each worker (default 0)")
        parser.add_argument(
            "--threads-per-worker", type=cli_job.counted(1, 4096), default=1, help="intra-op threads = CPUs per worker"
        )
        parser.add_argument(
            "--chunk-size", type=cli_job.counted(1, 1_000_000), default=None,
            help=f"frames per chunk, 1 or more (default: chosen from the frames and workers, up to {MAX_AUTO_CHUNK})"
        )
        parser.add_argument(
            "--max-tries", type=cli_job.counted(1, 100), default=3, help="tries of a frame before it is reported failed"
        )
        parser.set_defaults(handler=run, family=family)
    farm.set_defaults(handler=lambda args: farm.print_help(sys.stderr) or EXIT_ERROR)


def _address_arg(text: str) -> str:
    if text in ("local", "auto") or re.fullmatch(r"(ray://)?[\w.\-\[\]:]+:\d{1,5}", text):
        return text
    raise argparse.ArgumentTypeError(f"give local, auto, HOST:PORT or ray://HOST:PORT, got {text!r}")


def _gpus_arg(text: str) -> float:  # what Ray accepts: a fraction of one GPU up to many
    return cli_job.number(text, float, 0.0, 1024.0)


def import_ray():
    try:
        import ray
    except ImportError:
        raise CommandLineError(
            f"The farm runner needs Ray, which is not installed in this Python: {INSTALL_HINT} "
            "(the add-on and the other commands work without it)."
        ) from None
    return ray


class _Progress:
    """A line on stderr every 10% of the frames, and on every worker death."""

    def __init__(self, total: int, workers: int, on_event=None):
        self.total, self.workers, self.forward = total, workers, on_event
        self.started, self.done, self.last = time.monotonic(), 0, -10

    def __call__(self, event: dict) -> None:
        if self.forward is not None:
            self.forward(event)
        if event["event"] == "worker_died":
            print(f"  worker {event['worker']} died; its {event['frames']} frame(s) go to another", file=sys.stderr)
            return
        if event["event"] == "frame_failed":
            print(printable(f"  frame {event['frame']} failed: {event['error']}"), file=sys.stderr)
        self.done += 1
        percent = int(100 * self.done / max(self.total, 1))
        if percent >= self.last + 10 or self.done == self.total:
            elapsed = time.monotonic() - self.started
            rate = self.done / elapsed if elapsed > 0 else 0.0
            eta = f", ETA {(self.total - self.done) / rate:.0f} s" if rate else ""
            print(
                f"  [{percent:3d}%] {self.done}/{self.total} frames, {self.workers} workers, {rate:.2f} frames/s{eta}",
                file=sys.stderr,
                flush=True,
            )
            self.last = percent


def _notice(text: str) -> None:
    print(printable(text), file=sys.stderr)


def run(args, *, on_event=None, worker_class=FrameWorker) -> int:
    """The `farm` command. ``on_event`` sees every frame written and every worker death;
    ``worker_class``: FrameWorker or a test's subclass of it."""
    ray = _import_ray_for(args.address)
    family: Family = args.family
    parse_device(args.device)  # a typo fails here, before Ray starts
    if not (args.input or args.input_opt):
        raise CommandLineError("Give an INPUT image, folder or pattern on storage every worker can read.")
    if getattr(args, "preview", None) is not None:
        raise CommandLineError(f"--preview {args.preview} is one frame: run it without the farm ({family.command} ... --preview N).")
    spec = cli_job.job_spec(family, args, farm=True)  # a shot value that needs the whole shot first is refused
    plan = Runner(spec, ImageFileFrames(), events=RunEvents(notice=_notice))  # the frames; nothing runs here
    job = plan.model_run.for_worker()
    todo = [FarmFrame(ref, out, family.id) for ref, out in zip(plan.refs, plan.outputs, strict=True) if ref not in plan.skip]
    before = memory_snapshot(None)
    reset_peak_rss()
    started_ray = farm_connect.connect(ray, args.address)
    try:
        farm, details, cancelled, seconds = _drive(ray, args, spec, job, plan, todo, on_event, worker_class)
    finally:
        if started_ray:
            ray.shutdown()
    if farm.fatal is not None and not farm.written:
        raise LeanImageError(farm.fatal)
    report = BatchReport(
        total=len(plan.refs), written=sorted(todo[i].ref.number for i in farm.written),
        skipped=[r.number for r in plan.refs if r in plan.skip],
        failed=sorted((todo[i].ref.number, todo[i].error) for i in farm.failed),
        warnings=farm.warnings, cancelled=cancelled, seconds=seconds,
    )
    memory = cli_job.memory_figures(before, memory_snapshot(None), peak_rss_bytes())  # the jobs ran in the workers
    _print_outcome(args, plan, report, memory, farm.fatal, details)
    return _exit_code(args, report, farm.fatal)


def _import_ray_for(address: str):
    if address == "local" and "ray" not in sys.modules:
        # Ray picks its node address when imported: a one-machine instance listens on loopback
        # only, and a throwaway instance reports no usage statistics
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return import_ray()


def _drive(ray, args, spec, job, plan, todo: list[FarmFrame], on_event, worker_class):
    """Workers started, the farm run (till done or a signal), workers killed: (farm, figures, cancelled, s)."""
    threads = max(1, args.threads_per_worker)
    count = args.workers or max(1, int(ray.cluster_resources().get("CPU", 1) // threads))
    chunk_size = args.chunk_size or max(1, min(MAX_AUTO_CHUNK, len(todo) // (3 * count)))
    _notice(f"farm: {len(todo)} frame(s) to do ({len(plan.skip)} skipped) on {count} worker(s), chunks of "
            f"{chunk_size}; model {job.model.path}")
    worker = ray.remote(worker_class).options(
        num_cpus=threads, num_gpus=args.gpus_per_worker, max_restarts=-1, max_task_retries=0)
    actors = [worker.remote(job, threads, spec) for _ in range(count)]
    farm = Farm(ray, actors, todo, chunk_size, max_tries=max(1, args.max_tries), stop_on_error=args.stop_on_error,
                on_event=_Progress(len(todo), count, on_event))
    started = time.monotonic()
    cancelled = _run_until_signal(farm, getattr(args, "interrupts", None))
    seconds = time.monotonic() - started
    for actor in actors:
        ray.kill(actor, no_restart=True)
    details = {
        "address": args.address, "workers": count, "chunk_size": chunk_size, "chunks": farm.chunks_sent,
        "worker_deaths": farm.deaths, "redone_frames": farm.redone, "temp_files_removed": farm.temps_removed,
        "processes": sorted(farm.processes.values(), key=lambda p: (p["worker"], p["pid"])),
    }
    return farm, details, cancelled, seconds


def _run_until_signal(farm: Farm, interrupts) -> bool:
    """Runs the farm; True when a signal stopped it (what the workers were writing cleaned up)."""
    if interrupts is not None:  # the driver only waits: a signal stops the waiting at once
        interrupts.immediate = True
    try:
        if interrupts is not None and interrupts.event.is_set():
            raise KeyboardInterrupt  # the signal came while Ray was starting: send nothing
        farm.run()
    except KeyboardInterrupt:
        farm.cancel()
        return True
    return False


def _print_outcome(args, plan, report: BatchReport, memory, fatal: str | None, details: dict) -> None:
    for warning in dict.fromkeys(report.warnings):
        print(printable(f"warning: {warning}"), file=sys.stderr)
    print(json.dumps(cli_job.summary(args.family, args.shard, plan.refs, report, memory,
                                     output_type=plan.output_type(), farm=details, **plan.shot.as_dict())))
    for number, error in report.failed:
        print(printable(f"error: frame {number}: {error}"), file=sys.stderr)
    if fatal is not None:
        print(printable(f"error: {fatal}"), file=sys.stderr)


def _exit_code(args, report: BatchReport, fatal: str | None) -> int:
    if report.cancelled:
        interrupts = getattr(args, "interrupts", None)
        name = interrupts.name if interrupts is not None else "Ctrl+C"
        print(f"Stopped by {name}; {len(report.written)} frame(s) written are kept, none half-way.", file=sys.stderr)
        return interrupts.exit_code if interrupts is not None else EXIT_INTERRUPTED
    return EXIT_ERROR if report.failed or fatal else EXIT_OK
