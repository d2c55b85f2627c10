"""The one runner of a job (models/job_spec.py), for every front-end (bpy-free).

It resolves the model once, the frames (one image, a pattern, a folder, a frame list, A-B:S) and
their outputs (names, shard, overwrite or skip existing), claims frames another process may be
computing, runs the shot's first pass when a shot option needs the whole shot, then the writing
pass, and keeps the report (written, skipped, failed with reasons, the shot line).

The front-end gives only what only it can do, as a frame IO (duck-typed):

- ``writer``: its format writer row (models/file_formats.py ``COMMAND_LINE`` or ``BLENDER_WRITER``);
- ``read(ref, warn) -> array``: one frame's pixels (``warn`` may be None: the first pass says nothing);
- ``write_image(path, product) -> notes``: one image file, all or nothing;
- ``check_format(path)``: raises when it cannot write that format;
- ``input_kind(ref) -> "8-bit" | "16-bit" | "float"``: the samples of an input frame;
- optionally ``read_steps(ref, warn)``: the frame's read as steps a worker batch pumps one a call
  (Blender's, so no call of its main thread reads a frame whole), None where ``read`` is to be used;

and ``batch_factory``, a callable with models/batch/sequence.py BatchRun's signature (BatchRun for
the command line and the farm; a worker process's batch for Blender). It is given ``infer``, the
pass's bound ``ModelRun.infer``: a factory that sends the model run elsewhere takes
``infer.__self__``, plain data that pickles. Events go out through
:class:`RunEvents`. Blender pumps a runner from its timer (:meth:`Runner.pump`, its worker thread
calls :meth:`Runner.infer_all`); the command line and the farm call :meth:`Runner.run`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...runtime.errors import LeanImageError, OperationCancelled, user_path
from ..job_spec import JobSpec
from ..model_run import ModelRun
from ..outputs import JobOutput
from ..store import library
from . import frame_lists, job_checks
from .frame_io import FrameIO
from .frame_lists import FrameRef
from .report import BatchReport, PumpedBatch
from .shot_batch import ShotSettings, TwoPassBatch

DEMO_NAME = "demo"
DEMO_PATH = "(generated demo image)"
# a temporary file untouched this long before the run is a killed writer's: a live one (another
# task on the same outputs) changes it with every block it writes
STALE_TEMP_S = 10.0


def _quiet(*_args) -> None:
    return None


@dataclass
class RunEvents:
    """What a run tells its front-end. ``written`` returns the notes the report keeps (a front-end
    that says them at once returns none); ``take`` replaces writing files (Reconstruct Shot builds
    meshes from each result) and returns notes too."""

    progress: Callable[[float, str], None] | None = None
    line: Callable[[str], None] = _quiet  # a stage the user should see (the first pass, the shot's values)
    notice: Callable[[str], None] = _quiet  # something the run cleaned up (a killed run's temporary file or claim)
    written: Callable | None = None  # (ref, path, result, product or None, notes) -> notes
    take: Callable | None = None  # (ref, result) -> notes


class Runner:
    def __init__(self, spec: JobSpec, io: FrameIO, *, events: RunEvents | None = None, batch_factory=None,
                 cancel: threading.Event | None = None, model_run: ModelRun | None = None, runtime=None):
        spec = job_checks.checked(spec)  # a job received as data is trusted in nothing, before anything runs
        self.spec, self.io = spec, io
        self.events = events or RunEvents()
        self.cancel_event = cancel if cancel is not None else threading.Event()
        if batch_factory is None:  # the batch on threads of this process (command line, farm); never Blender's
            from .sequence import BatchRun as batch_factory
        self._factory, self._runtime = batch_factory, runtime
        # the model run (the model resolved once): a farm worker is given the driver's (named by its absolute path)
        self.model_run = model_run or ModelRun.resolve(
            spec.family_id, library.models_dir(spec.models_dir), model=spec.model, model_path=spec.model_path,
            values=spec.values, device=spec.device, budgets=spec.budgets,
        )
        shot = spec.shot  # a bad shot option fails before any folder is made
        self.shot = ShotSettings(spec.family_id, depth_range=shot.depth_range, align_depth=shot.align_depth,
                                 camera=shot.camera, fov=shot.fov, shard=spec.shard,
                                 skip_existing=spec.skip_existing, farm=spec.farm)
        # the one owner of what this job writes: its names, checks, plan, claims and writes
        self.output = JobOutput.of(spec.family_id, io.writer)
        self.refs = self._plan()
        self._batch: PumpedBatch | None = None  # this pass's (a BatchRun, a RemoteBatchRun, a TwoPassBatch)
        self._final_report: BatchReport | None = None  # the report once the run is over (close())
        self.shot_line = ""  # the shot's values once its first pass is over

    @property
    def family_id(self) -> str:
        return self.spec.family_id

    @property
    def outputs(self) -> list[Path]:
        """The planned output file of each of :attr:`refs`, in their order (none: results not files)."""
        return list(self.output.targets.values())

    @property
    def skip(self) -> set:
        return self.output.skip

    # -- the plan: frames and outputs, every check before the model runs --------------------------
    def _plan(self) -> list[FrameRef]:
        """This job's frames; their outputs are planned in :attr:`output` (the job's JobOutput)."""
        spec = self.spec
        self._started = time.time()  # nothing of this run is written yet: older temporary files are not its own
        if spec.frame_list is not None and spec.output_list is not None:  # a farm chunk: planned by its driver
            refs = [FrameRef(int(n), Path(p)) for n, p in spec.frame_list]
            self.output.adopt(refs, [Path(p) for p in spec.output_list])
            return refs
        refs = self._input_refs()
        if not spec.writes_files:
            return refs
        kind = self._first_kind(refs) if spec.source is not None else "8-bit"
        output = spec.output
        if spec.source is None:
            output = output or str(Path.cwd() / self.output.default_name(DEMO_NAME))
        refs, _outputs, _skip = self.output.plan(
            refs, output, in_sequence=self._in_sequence(refs), shard=spec.shard, overwrite=spec.overwrite,
            skip_existing=spec.skip_existing, check_format=self.io.check_format,
            inputs_are_files=spec.source is not None, suffix=self.output.default_suffix(kind),
        )
        # a killed earlier run's temporary files of these outputs (with Skip Existing: those no live
        # process writes) and its frame claims, whatever this run's mode (a claim held now stays)
        for claim in self._remove_killed_temps():
            self.events.notice(f"removed a frame claim left by an interrupted run: {claim}")
        return self._preview(refs) if spec.shot.preview is not None else refs

    def _remove_killed_temps(self) -> list[Path]:
        """With Skip Existing, the temporary files of the planned outputs that no live process
        writes (models/files.py): at the start, a killed earlier run's; at the end, also one a run
        killed while this one ran left, or one too young to judge at the start where only age
        tells. Returns the stale frame claims removed with them."""
        started = getattr(self, "_started", time.time())
        temps, claims = self.output.tidy(
            temps_older_than=started - STALE_TEMP_S if self.spec.skip_existing else None)
        for temp in temps:
            self.events.notice(f"removed a temporary file left by an interrupted run: {temp}")
        return claims

    def _in_sequence(self, refs) -> bool:
        spec = self.spec
        if spec.in_sequence is not None:
            return spec.in_sequence
        if spec.source is None:
            return False
        return len(refs) > 1 or spec.frames is not None or frame_lists.is_pattern(spec.source) or \
            user_path(spec.source).is_dir()

    def _input_refs(self) -> list[FrameRef]:
        spec = self.spec
        if spec.frame_list is not None:
            return [FrameRef(int(n), Path(p)) for n, p in spec.frame_list]
        if spec.source is None:  # the command line's generated demo image
            return [FrameRef(1, Path.cwd() / DEMO_PATH)]
        # what this job writes is never read back as a frame (an output in the input folder)
        exclude = self.output.written_by(spec.output) if spec.writes_files else None
        return frame_lists.resolve_input(spec.source, spec.frame_range, exclude)

    def _preview(self, refs):
        """Only the frame asked for (its output is written anyway)."""
        number = self.spec.shot.preview
        chosen = [r for r in refs if r.number == number]
        if not chosen:
            numbers = [r.number for r in refs]
            shown = f"{numbers[0]}-{numbers[-1]}" if numbers else "none"
            raise LeanImageError(f"--preview {number}: there is no such frame (frames {shown}); give one of them.")
        self.output.keep_only(chosen)
        return chosen

    def _first_kind(self, refs) -> str:
        """The output type follows the first frame that exists (a sequence is one format)."""
        return next((self.io.input_kind(r) for r in refs if r.path.is_file()), "8-bit")

    def output_type(self) -> str:
        """What the job writes, for the report (models/outputs.py's policy)."""
        if not self.outputs:
            return ""
        kind = self._first_kind(self.refs) if self.spec.source is not None else "8-bit"
        return self.output.describe(self.outputs[0].suffix, kind)

    # -- the passes ------------------------------------------------------------------------------
    def _write(self, ref: FrameRef, result) -> list[str]:
        if self.events.take is not None:
            return self.events.take(ref, result) or []
        return self.write_file(ref, result)

    def write_file(self, ref: FrameRef, result) -> list[str]:
        """One frame's result as its files (all or nothing); returns the notes for the report."""
        out = self.output.targets[ref]
        staged = getattr(self.io, "staged", False)
        stage = self.io.stage if staged else None
        notes, product = self.output.write(  # a shot's depth: its one range and alignment
            out, result, self.model_run.values, self.io.write_image, image=self.shot.output_image, stage=stage,
            count_clipped=not staged,  # a staged write counts clipped colours in the bands it pulls
        )
        if self.events.written is not None:
            return self.events.written(ref, out, result, product, notes)
        return notes

    def _make_pass(self, write, shot_kwargs: dict, first: bool):
        """One pass over the frames: the first (a shot's) records and skips nothing, never claims."""
        run = self.model_run
        pass_run = ModelRun(run.family_id, run.model, run.values, run.device, run.budgets, {**run.extra, **shot_kwargs})
        fields = {"runtime": self._runtime} if self._runtime is not None else {}
        options = pass_run.options(progress=self.events.progress, cancel=self.cancel_event, **fields)
        claims = self.spec.skip_existing and self.spec.source is not None and self.spec.writes_files and not first
        report = []  # the pass's report once the pass exists; the pass itself would be a cycle

        def read(ref):
            return self.io.read(ref, None if first else report[0].warnings.append)

        # a frame IO that reads a frame over several pumps (Blender's, operators/model_job.py) gives its steps
        steps = getattr(self.io, "read_steps", None)
        stepped = {} if steps is None else {"read_steps": lambda ref: steps(ref, None if first else report[0].warnings.append)}
        batch = self._factory(
            self.refs, pass_run.infer, read, write, options=options,
            skip=(lambda ref: False) if first else self.skip.__contains__,
            stop_on_error=self.spec.stop_on_error,
            **self.output.claim_hooks(claims), **self._staged_hook(), **stepped,
        )
        report.append(batch.report)
        return batch

    def _staged_hook(self) -> dict:
        """A frame IO that leaves a frame's file to be written over later pumps hands it to the
        batch (models/worker/remote_batch.py) through ``staged``; its ``stage(steps)`` takes the
        steps of a family's own writer (models/outputs.py's write)."""
        if not getattr(self.io, "staged", False):
            return {}
        record = self.output.record
        if record.write is not None and record.stage is None:
            # a family's own writer that makes a frame's files together only in one call (a mesh,
            # its camera, its normal map): all of them in the call, so none waits on disk for the others
            self.io.staged = False
            return {}
        return {"staged": self.io.take_staged}

    def _pumped(self):
        if self._final_report is not None:
            raise RuntimeError("this run is over; a Runner runs once")
        if self._batch is None:
            if self.shot.needs_first_pass:
                self._batch = TwoPassBatch(self.shot, self._make_pass, self._write, self.cancel_event,
                                           announce=self.events.line)
            else:
                self._batch = self._make_pass(self._write, self.shot.adapter_kwargs(), False)
        return self._batch

    @property
    def report(self) -> BatchReport:
        if self._final_report is not None:
            return self._final_report
        return self._batch.report if self._batch is not None else BatchReport(total=len(self.refs))

    @property
    def needs_model(self) -> bool:
        return self._pumped().needs_model

    def infer_all(self):
        """The model's side, on the front-end's worker thread (Blender's job engine)."""
        return self._pumped().infer_all()

    def pump(self, budget: float = 0.05) -> bool:
        """Read and write frames for about ``budget`` seconds (Blender's main thread); True once over."""
        if self._final_report is not None:
            return True
        over = self._pumped().pump(budget)
        self.shot_line = getattr(self._batch, "shot_line", "") or self.shot_line
        if over:
            self._let_go()
        return over

    def cancel(self) -> None:
        self.cancel_event.set()
        if self._batch is not None:
            self._batch.cancel()

    def close(self) -> None:
        """A finished, cancelled or failed run's claimed frames are free for another task."""
        self.output.claims.release_all()
        if self.spec.writes_files:
            self._remove_killed_temps()

    def _let_go(self) -> None:
        """The run is over: its pass is let go, keeping its report. The pass refers back to this
        runner (its write), a cycle that would hold every frame the pass read until Python's
        collector ran (Blender's memory, issue #37)."""
        self.close()
        if self._batch is not None:
            self._final_report, self._batch = self._batch.report, None

    def run(self) -> BatchReport:
        """The whole job on this thread's watch (the command line, a farm worker): frames read on a
        reader thread, the model on a worker, results written here, all three at once."""
        try:
            kwargs = self._first_pass() if self.shot.needs_first_pass else self.shot.adapter_kwargs()
            self._batch = self._make_pass(self._write, kwargs, False)
            return self._batch.run()
        finally:
            self._let_go()

    def _first_pass(self) -> dict:
        self.events.line(f"first pass: {self.shot.first_pass_keeps} only (no file is written)")
        self._batch = self._make_pass(self.shot.record, {}, True)
        if self._batch.run().cancelled:
            raise OperationCancelled("The first pass was cancelled; nothing was written.")
        self.shot_line = self.shot.finish_first_pass()
        self.events.line(self.shot_line)
        return self.shot.adapter_kwargs()
