"""The worker process's side (bpy-free): the shared runtime of this process runs the jobs the
client sends, one at a time, each as one models/batch/sequence.py BatchRun.

The main thread only reads the connection (frames, cancel, state, free); a job runs on a thread
of its own here, with BatchRun's reader and inference threads: threads are fine in this process,
it is not Blender's. Every send goes through one lock (the job thread sends results and
progress, the main thread answers state requests).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from ...runtime import get_runtime, providers
from ...runtime.errors import LeanImageError
from ...runtime.measure import memory
from .. import families
from ..base import RunOptions
from ..batch.sequence import BatchRun
from . import wire

SKIPPED = object()  # the client did not send this frame (claimed elsewhere, or unreadable there)
PROGRESS_EVERY_S = 0.1
FAULTS_ENV = "LEAN_IMAGE_AI_WORKER_FAULTS"  # tests only: lets the "fault" message crash this process


def measure() -> dict:
    """This process's memory now: what ending it gives back."""
    rss = memory.process_rss_bytes()
    vram = None
    if any((row := providers.row_of(h.providers)) is not None and row.vram_measurable
           for h in get_runtime().cached_sessions()):
        vram = memory.gpu_snapshot(0).get("process_used_bytes")
    return {"rss_bytes": rss, "vram_bytes": vram}


def _picklable(exc: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = str(exc) if isinstance(exc, LeanImageError) else f"{type(exc).__name__}: {exc}"
        return LeanImageError(text)


class Worker:
    def __init__(self, conn, folder: Path):
        self.conn, self.folder = conn, Path(folder)
        self._send_lock = threading.Lock()
        self._arrived: dict[int, object] = {}
        self._frames = threading.Condition()
        self._cancel = threading.Event()
        self._run: BatchRun | None = None
        self._job_name = ""
        self._failed_sent = 0
        self._last_progress = 0.0

    def send(self, *message) -> None:
        with self._send_lock:
            wire.send(self.conn, message, self.folder)

    # -- the connection ----------------------------------------------------------------------
    def serve(self) -> None:
        # the runtime's events (loads, runs, releases, warnings) go to the client as they happen:
        # the host's event log and panel tell what its worker did
        get_runtime().events.subscribe(lambda event: self.send("event", event))
        while True:
            try:
                message = wire.receive(self.conn, self.folder)
            except (EOFError, OSError):  # the client went away: nothing is left to answer
                break
            if not self.handle(message):
                break
        self._cancel.set()

    def handle(self, message) -> bool:
        kind = message[0]
        if kind == "job":
            self.start_job(message[1])
        elif kind == "leak":
            self._cancel = threading.Event()
            threading.Thread(target=self._leak_check, args=(message[1],), name="lean_image_ai:leak", daemon=True).start()
        elif kind == "frame":
            self._arrive(message[1], message[2])
        elif kind == "skip":
            self._arrive(message[1], SKIPPED)
        elif kind == "cancel":
            self._cancel.set()
            if self._run is not None:
                self._run.cancel()
        elif kind in ("release", "unload"):  # Release now / Unload all, on this process's runtime
            runtime = get_runtime()
            freed = runtime.release_now() if kind == "release" else runtime.unload()
            self.send("status", self.status())
            self.send("answer", freed, [])
        elif kind == "state":
            self.send("status", self.status())
        elif kind == "free":
            self.send("freed", measure())
            os._exit(0)  # the end of the process is what gives everything back; no teardown to wait for
        elif kind == "fault":
            self.fault(message[1])
        elif kind == "quit":
            return False
        return True

    def _arrive(self, number: int, value) -> None:
        with self._frames:
            self._arrived[number] = value
            self._frames.notify_all()

    def status(self, *, with_job: bool = False) -> dict:
        runtime = get_runtime()
        models = [h.model_name for h in runtime.cached_sessions()]
        ort = sys.modules.get("onnxruntime")  # which build this process runs: the doctor's and the tests' question
        status = {"pid": os.getpid(), "models": models, "job": self._job_name, **measure(),
                  "onnxruntime_file": getattr(ort, "__file__", None), "onnxruntime_version": getattr(ort, "__version__", None)}
        if with_job:  # the job's memory timeline and figures: the host's memory picture and panel
            status.update(timeline=runtime.last_timeline, job_memory=runtime.last_job_memory)
        return status

    @staticmethod
    def fault(how: str) -> None:
        """Test-only native faults, honoured only where the test's environment allows them."""
        if os.environ.get(FAULTS_ENV) != "1":
            return
        if how == "segfault":
            import ctypes

            ctypes.string_at(0)
        elif how == "abort":
            os.abort()
        elif how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)

    # -- one job -------------------------------------------------------------------------------
    def start_job(self, spec: dict) -> None:
        job = spec["job"]
        if spec.get("family") is not None and spec["family"].id not in families.IDS:
            families.register(spec["family"])
        with self._frames:
            self._arrived.clear()
        self._cancel = threading.Event()
        self._failed_sent = 0
        if spec.get("settings") is not None:
            get_runtime().configure(**vars(spec["settings"]))
        options = RunOptions(device=job.device, progress=self._progress, cancel=self._cancel)
        self._run = BatchRun(
            spec["refs"], job.infer, self._read, self._write, options=options,
            stop_on_error=spec.get("stop_on_error", False), depth=spec.get("depth", 2), claim=self._claim,
        )
        self._job_name = spec.get("name", "")
        threading.Thread(target=self._run_job, args=(self._run,), name="lean_image_ai:job", daemon=True).start()

    def _run_job(self, run: BatchRun) -> None:
        try:
            report = run.run()
        except BaseException as exc:  # the job could not run at all (the model, the device)
            self._job_name = ""
            # the status first: the host's after-job listeners read the job's memory from it
            self.send("status", self.status(with_job=True))
            self.send("error", _picklable(exc), self._new_failures())
        else:
            self._job_name = ""
            self.send("status", self.status(with_job=True))
            self.send("done", {"cancelled": report.cancelled}, self._new_failures())

    def _leak_check(self, spec: dict) -> None:
        """The leak check, here: it measures the process whose runtime runs the model."""
        from ...runtime.errors import OperationCancelled
        from ...runtime.measure.leak_check import leak_check
        from ..leak_request import family_job

        cancel, runs = self._cancel, spec["runs"]

        def after_run(index, _values):
            self.send("progress", index / runs, f"run {index}/{runs}")
            if cancel.is_set():
                raise OperationCancelled("The leak check was cancelled; nothing was changed.")

        try:
            get_runtime().configure(**vars(spec["settings"]))
            if cancel.is_set():
                raise OperationCancelled("The leak check was cancelled; nothing was changed.")
            request = family_job(spec["family"], device=spec["device"], folder=spec["folder"],
                                 budgets=spec["budgets"], cancel=cancel)
            result = leak_check(request, runs=runs, after_run=after_run)
        except BaseException as exc:  # noqa: BLE001 - the client raises it
            self.send("status", self.status(with_job=True))
            self.send("error", _picklable(exc), [])
        else:
            self.send("status", self.status(with_job=True))
            self.send("answer", result, [])

    def _new_failures(self) -> list:
        failed = self._run.report.failed if self._run is not None else []
        new, self._failed_sent = failed[self._failed_sent:], len(failed)
        return list(new)

    def _claim(self, ref) -> bool:
        with self._frames:
            while ref.number not in self._arrived:
                if self._cancel.is_set():
                    return False
                self._frames.wait(0.05)
            if self._arrived[ref.number] is SKIPPED:
                del self._arrived[ref.number]
                return False
            return True

    def _read(self, ref):
        with self._frames:
            return self._arrived.pop(ref.number)

    def _write(self, ref, result) -> None:
        self.send("result", ref.number, result, self._new_failures())

    def _progress(self, fraction: float, stage: str) -> None:
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_EVERY_S or fraction >= 1.0:
            self._last_progress = now
            self.send("progress", fraction, stage)
