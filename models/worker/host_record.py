"""What the host process keeps of the model worker's jobs (bpy-free; no thread, no onnxruntime):
the last job's memory report and memory timeline as the worker sent them (plain dicts: the Memory
panel, the memory picture and the preferences read them), and the host's event log, into which
the worker's events are replayed and the client's own decisions are said (the event file on disk
listens to it, runtime/log/event_file.py).

Blender's process never makes a Runtime (runtime/core.py): the models are the worker's, so what
the host shows of them comes from here. A job run in the host's own process
(``LEAN_IMAGE_AI_IN_PROCESS``, models/worker/remote_batch.py) hands its figures here too.
"""

from __future__ import annotations

from ...runtime.log.events import EventLog

events = EventLog()
last_job_memory: dict | None = None  # runtime/measure/memory_report.py's report of the last job
last_timeline: dict | None = None  # its memory timeline (runtime/measure/timeline.py Timeline.as_dict)


def job_figures(timeline: dict | None, job_memory: dict | None) -> None:
    """The last job's figures, as the worker (or an in-process job) reported them."""
    global last_job_memory, last_timeline
    last_timeline, last_job_memory = timeline, job_memory


def worker_ended() -> None:
    """The worker is gone, and with it what the Memory panel said it kept."""
    global last_job_memory
    if last_job_memory is not None:
        last_job_memory = {**last_job_memory, "worker_ended": True}


def note(event: str, **fields) -> dict:
    """One of the host's own decisions about the worker (a restart, a spill) into the event log."""
    return events.emit(event, **fields)


def replay(event: dict) -> dict:
    """A worker's runtime event into the host's event log (and its listeners: the event file)."""
    payload = {k: v for k, v in event.items() if k not in ("event", "time")}
    return events.emit(event["event"], **payload)
