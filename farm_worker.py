"""What one farm worker process does (no Ray here: farm_ray.py makes this class a Ray actor).

A worker keeps the process-wide runtime, and so its cached session, across every chunk it is
given: the model loads once per worker process, not once per chunk or frame. Each chunk is one
:class:`~lean_image_ai.models.sequence.BatchRun`, so one runtime operation that releases its
memory after the chunk's last model run, with the frames read and written exactly as the command
line does (cli_images.py, cli_job.write_result, models/files.py's atomic writer) on storage every
worker and the driver share.

:meth:`FrameWorker.process` is a generator: Ray streams each item to the driver as it is
yielded, so the driver learns of every frame written (progress, and which frames a worker that
dies had already finished) without waiting for the chunk's end.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

from . import cli_images, cli_job, cli_shot
from .models import families, files
from .models.base import JobOptions
from .models.frame_lists import FrameRef
from .models.sequence import BatchRun
from .models.shot_batch import ShotSettings
from .runtime import get_runtime
from .runtime.errors import LeanImageError
from .runtime.memory import peak_rss_bytes, reset_peak_rss


class FrameWorker:
    """One worker: ``family_id``'s adapter on ``model_path``, with ``kwargs`` (the model's
    settings) and ``values`` (the job options), ``threads`` intra-op threads per session.

    ``crash_on_write`` is for tests only: ``(frame number, marker file)`` makes the first worker
    that writes that frame die by SIGKILL half-way through writing it (its temporary file is on
    disk), a real process death; the marker file, created exclusively, makes it happen once.
    """

    def __init__(self, family_id, model_path, kwargs, values, device="auto", threads=1, crash_on_write=None, shot=None):
        self.family = families.get(family_id)
        # the driver's shot options (cli_shot.ShotRun.options): a given depth range or field of view
        self.write_result = cli_shot.shot_writer(ShotSettings(family_id, **(shot or {}), farm=True), cli_job.write_result)
        self.model_path, self.kwargs, self.values = str(model_path), dict(kwargs), dict(values)
        self.device = device
        self.runtime = get_runtime()
        if threads:  # sessions made from now on; a worker makes its one session after this
            self.runtime.configure(intra_op_threads=int(threads))
        self.crash_on_write = crash_on_write
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
        options = JobOptions(device=self.device, runtime=self.runtime, cancel=threading.Event())

        def infer(frames, job_options):
            return self.family.run(frames, self.model_path, options=job_options, **self.kwargs)

        def write(ref, result):
            self._maybe_crash(ref, target[ref])
            notes, _ = self.write_result(self.family.id, target[ref], result, self.values)
            return notes

        batch = BatchRun(refs, infer, lambda ref: cli_images.read_image(ref.path), write, options=options)
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
            "rss_peak": peak_rss_bytes(),
            "warnings": list(dict.fromkeys(fallbacks + report.warnings)),
        }

    def _maybe_crash(self, ref: FrameRef, out: Path) -> None:
        if self.crash_on_write is None or ref.number != self.crash_on_write[0]:
            return
        try:  # exclusive creation: only the first worker to get here dies, and only once
            os.close(os.open(self.crash_on_write[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        with files.atomic_path(out) as temp:
            temp.write_bytes(b"half a frame")
            os.kill(os.getpid(), signal.SIGKILL)  # no finally runs: the temp file stays behind
