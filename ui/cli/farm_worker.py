"""What one farm worker process does (no Ray here: ui/cli/farm_ray.py makes this class a Ray actor).

A worker keeps the process-wide runtime, and so its cached session, across every chunk it is
given: the model loads once per worker process, not once per chunk or frame. Each chunk is one
:class:`~lean_image_ai.models.batch.sequence.BatchRun`, so one runtime operation that releases its
memory after the chunk's last model run, with the frames read and written exactly as the command
line does (ui/cli/cli_images.py, cli_job.write_result, models/files.py's atomic writer) on storage every
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
from pathlib import Path

from ...models.batch.frame_lists import FrameRef
from ...models.batch.sequence import BatchRun
from ...models.batch.shot_batch import ShotSettings
from ...models.job import FamilyJob
from ...runtime import get_runtime
from ...runtime.errors import LeanImageError
from ...runtime.measure.memory import peak_rss_bytes, reset_peak_rss
from . import cli_images, cli_job, cli_shot


class FrameWorker:
    """One worker: the driver's family job (models/job.py, the model named by its absolute path),
    ``threads`` intra-op threads per session."""

    def __init__(self, job: FamilyJob, threads: int = 1, shot: dict | None = None):
        self.job = job
        # the driver's shot options (cli_shot.ShotRun.options): a given depth range or field of view
        settings = ShotSettings(job.family_id, **(shot or {}), farm=True)
        self.write_result = cli_shot.shot_writer(settings, cli_job.write_result)
        self.runtime = get_runtime()
        if threads:  # sessions made from now on; a worker makes its one session after this
            self.runtime.configure(intra_op_threads=int(threads))
        self.frames_done = 0
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
        refs = [FrameRef(int(number), Path(source)) for number, source, _ in chunk]
        target = {ref: Path(out) for ref, (_, _, out) in zip(refs, chunk, strict=True)}
        since = time.time()
        options = self.job.options(runtime=self.runtime, cancel=threading.Event())

        def write(ref, result):
            return self.write(ref, target[ref], result)

        batch = BatchRun(refs, self.job.infer, lambda ref: cli_images.read_image(ref.path), write, options=options)
        report, over, outcome = batch.report, threading.Event(), {}

        def whole_chunk():  # exactly as the command line runs a batch: reader, model, writer threads
            try:
                batch.run()
            except BaseException as exc:  # noqa: BLE001 - handed to the generator below
                outcome["error"] = exc
            finally:
                over.set()

        threading.Thread(target=whole_chunk, name="lean_image_ai:farm-chunk", daemon=True).start()
        told_written = told_failed = 0
        while True:
            finished = over.wait(0.02)
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
        notes, _ = self.write_result(self.job.family_id, out, result, self.job.values)
        return notes
