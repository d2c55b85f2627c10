"""What one farm worker process does (no Ray here: ui/cli/farm_ray.py makes this class a Ray actor).

A worker keeps the process-wide runtime, and so its cached session, across every chunk it is
given: the model loads once per worker process, not once per chunk or frame. Each chunk is one run of
models/batch/runner.py (one BatchRun), so one runtime operation that releases its
memory after the chunk's last model run, with the frames read and written exactly as the command
line does (models/batch/image_files.py, the runner's writer, models/files.py's atomic writer) on storage every
worker and the driver share.

:meth:`FrameWorker.process` is a generator: Ray streams each item to the driver as it is
yielded, so the driver learns of every frame written (progress, and which frames a worker that
dies had already finished) without waiting for the chunk's end.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

from ...models.batch.frame_io import ImageFileFrames
from ...models.batch.frame_lists import FrameRef
from ...models.batch.runner import RunEvents, Runner
from ...models.job_spec import JobSpec
from ...models.model_run import ModelRun
from ...runtime import get_runtime
from ...runtime.errors import LeanImageError
from ...runtime.measure.memory import peak_rss_bytes, reset_peak_rss


class FrameWorker:
    """One worker: the driver's family job (models/model_run.py, the model named by its absolute path),
    ``threads`` intra-op threads per session, and the driver's job (models/job_spec.py: the shot's
    given values, stop on error); each chunk runs through models/batch/runner.py as the command
    line's jobs do."""

    def __init__(self, job: ModelRun, threads: int = 1, spec: JobSpec | None = None):
        self.job = job
        self.spec = spec or JobSpec(job.family_id, values=dict(job.values), device=job.device, farm=True)
        self.runtime = get_runtime()
        if threads:  # sessions made from now on; a worker makes its one session after this
            self.runtime.configure(intra_op_threads=int(threads))
        self.frames_done = 0
        self._runner: Runner | None = None
        reset_peak_rss()

    def ready(self) -> dict:
        """Called first by the driver: the worker is up (a restarted one too)."""
        return {"pid": os.getpid(), "host": socket.gethostname()}

    def process(self, chunk):
        """Run one chunk: ``[(frame number, input path, output path), ...]``.

        Yields ``{"frame": n}`` once frame n is written (whole, under its final name),
        ``{"frame": n, "error": text}`` when it failed, then one ``{"end": ...}`` with this
        process's figures; ``{"fatal": text}`` (then nothing more) when the job cannot run at all
        here (the model or the device), which no retry elsewhere would fix either.
        """
        part = replace(self.spec, frame_list=[(int(n), str(source)) for n, source, _ in chunk],
                       output_list=[str(out) for _, _, out in chunk], shard=None, stop_on_error=False)
        since = time.time()
        runner = self._runner = Runner(
            part, ImageFileFrames(), model_run=self.job, runtime=self.runtime,
            events=RunEvents(take=lambda ref, result: self.write(ref, runner.output.targets[ref], result)),
        )
        over, outcome = threading.Event(), {}

        def whole_chunk():  # exactly as the command line runs a job: reader, model, writer threads
            try:
                runner.run()
            except BaseException as exc:  # noqa: BLE001 - handed to the generator below
                outcome["error"] = exc
            finally:
                over.set()

        threading.Thread(target=whole_chunk, name="lean_image_ai:farm-chunk", daemon=True).start()
        told_written = told_failed = 0
        while True:
            finished = over.wait(0.02)
            report = runner.report
            for number in report.written[told_written:]:
                yield {"frame": number}
            for number, error in report.failed[told_failed:]:
                yield {"frame": number, "error": error}
            told_written, told_failed = len(report.written), len(report.failed)
            if finished:
                break
        error = outcome.get("error")
        if isinstance(error, LeanImageError):  # not about one frame: the model or the device
            yield {"fatal": str(error)}
            return
        if error is not None:
            raise error
        self.frames_done += len(report.written)
        fallbacks = [e["message"] for e in self.runtime.events.recent("provider_fallback") if e["time"] >= since]
        yield {
            "end": True,
            "pid": os.getpid(),
            "sessions_created": self.runtime.sessions_created,
            "frames_done": self.frames_done,
            "process_rss_peak": peak_rss_bytes(),
            "warnings": list(dict.fromkeys(fallbacks + report.warnings)),
        }

    def write(self, ref: FrameRef, out: Path, result) -> list[str]:
        """Write one frame as the command line does; returns the notes for the user."""
        return self._runner.write_file(ref, result)
