"""The farm driver's scheduling (ui/cli/farm_ray.py runs it): chunks of frames out to Ray workers,
frames back, faults handled.

Faults: a worker that dies (killed, out of memory, a crash) loses only the chunk it held. Ray
restarts the actor; the driver looks at that chunk's frames: a frame whose output changed since
the plan was finished (its report was lost with the worker), the others get their leftover
temporary files removed (the only writer of that frame is dead) and are queued again, one frame
per chunk, first in line, for whichever worker is free. A frame that fails (unreadable, the model
refuses it) or whose worker dies is tried at most ``max_tries`` times, then reported: every output
ends complete, written by one try, nothing retried forever.
"""

from __future__ import annotations

import collections
import math
import time
from pathlib import Path

from ...models import families, files
from ...models.batch import frame_lists

START_GRACE_S = 20.0  # after the first worker is up, how long the first chunks wait for the others


class FarmFrame:
    def __init__(self, ref, out: Path, family_id: str):
        self.ref, self.out = ref, out
        self.companions = families.get(family_id).output.companion_paths(out)
        self.before = file_signature(out)  # what was there at planning time (an old file, or nothing)
        self.tries = 0
        self.error = ""

    def written_since_plan(self) -> bool:
        """The atomic writer renames a new file into place, so a finished frame changed its inode."""
        now = file_signature(self.out)
        return now is not None and now != self.before

    def remove_temps(self) -> int:
        leftovers = [t for path in self.companions for t in files.leftover_temps(path)]
        for temp in leftovers:
            files.remove_if_present(temp)
        return len(leftovers)


def file_signature(path: Path):
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


class Farm:
    """The driver's scheduling: chunks out, frames back, faults handled (see the module doc)."""

    def __init__(self, ray, actors, frames: list[FarmFrame], chunk_size: int, *, max_tries, stop_on_error, on_event=None):
        self.ray, self.frames, self.max_tries, self.stop_on_error = ray, frames, max_tries, stop_on_error
        self.on_event = on_event or (lambda event: None)
        count = len(frames)
        parts = math.ceil(count / chunk_size) if count else 0
        # the farm's one split rule, as for --shard: contiguous, sizes differing by at most one
        self.pending = collections.deque(
            list(range(count))[frame_lists.shard_slice(count, (i, parts))] for i in range(1, parts + 1)
        )
        self.actors = list(actors)
        self.idle: list[int] = []
        self.in_flight: dict = {}  # ObjectRefGenerator or ObjectRef -> (worker slot, chunk or None)
        self.start_failures = collections.Counter()
        self.written: list[int] = []  # frame indices
        self.failed: list[int] = []
        self.processes: dict[int, dict] = {}  # pid -> its figures
        self.pid_of: dict[int, int] = {}  # worker slot -> the process now behind it (restarts change it)
        self.warnings: list[str] = []
        self.deaths = self.redone = self.temps_removed = self.chunks_sent = 0
        self.fatal: str | None = None
        self.start_error = ""
        self.first_ready: float | None = None
        self.dispatching = False
        self.stopped = False
        for slot, actor in enumerate(self.actors):
            self.in_flight[actor.ready.remote()] = (slot, None)

    def run(self) -> None:
        # a worker coming back after a restart does not hold the run open once nothing is left
        while self._chunks_in_flight() or (self.pending and (self.idle or self.in_flight)):
            while self.idle and self.pending and self._may_dispatch():
                self._send(self.idle.pop(0), self.pending.popleft())
            ready, _ = self.ray.wait(list(self.in_flight), num_returns=1, timeout=1.0)
            for key in ready:
                self._answer(key)
        if self.pending and self.fatal is None:  # every worker failed to start, again and again
            self.fatal = f"no worker could start ({self.start_error})"
        for index in (i for chunk in self.pending for i in chunk):
            self._fail(index, self.fatal)
        self.pending.clear()

    def _answer(self, key) -> None:
        """One ready reference: a worker's ready(), the next item of a chunk, or how either ended."""
        errors = self.ray.exceptions
        slot, chunk = self.in_flight[key]
        try:
            if chunk is None:
                self._ready(slot, self.ray.get(key))
                del self.in_flight[key]
            else:
                self._item(slot, chunk, self.ray.get(next(key)))
        except StopIteration:  # the chunk's stream ended: the worker is free
            del self.in_flight[key]
            self._chunk_over(slot, chunk, died=False)
        except (errors.RayActorError, errors.WorkerCrashedError, errors.ObjectLostError) as exc:
            del self.in_flight[key]
            self._worker_lost(slot, chunk, exc)
        except errors.RayTaskError as exc:  # a bug in the worker, not a frame: same for all
            del self.in_flight[key]
            self._stop(f"worker error: {exc}")
            if chunk is not None:
                self._chunk_over(slot, chunk, died=False)

    # -- chunks out, items back ---------------------------------------------------------------
    def _chunks_in_flight(self) -> bool:
        return any(chunk is not None for _, chunk in self.in_flight.values())

    def _may_dispatch(self) -> bool:
        """The first chunks wait until every worker is up (or a grace period ran out), so one
        worker that starts a second late does not leave the other all the work."""
        if not self.dispatching:
            starting = any(chunk is None for _, chunk in self.in_flight.values())
            late = self.first_ready is not None and time.monotonic() - self.first_ready > START_GRACE_S
            self.dispatching = not starting or late
        return self.dispatching

    def _send(self, slot: int, chunk: list[int]) -> None:
        payload = [(f.ref.number, str(f.ref.path), str(f.out)) for f in (self.frames[i] for i in chunk)]
        left = {self.frames[i].ref.number: i for i in chunk}  # frame number -> index, till reported
        self.in_flight[self.actors[slot].process.remote(payload)] = (slot, {"left": left})
        self.chunks_sent += 1

    def _ready(self, slot: int, info: dict) -> None:
        self.start_failures[slot] = 0
        self.first_ready = self.first_ready or time.monotonic()
        self.pid_of[slot] = info["pid"]
        self.processes.setdefault(info["pid"], {"worker": slot, "pid": info["pid"], "host": info["host"], "frames": 0})
        self.idle.append(slot)

    def _written(self, slot: int, index: int, left: int, *, recovered: bool = False) -> None:
        self.written.append(index)
        pid = self.pid_of.get(slot)
        if pid in self.processes:
            self.processes[pid]["frames"] += 1
        number = self.frames[index].ref.number
        self.on_event({"event": "frame", "frame": number, "worker": slot, "pid": pid, "left": left, "recovered": recovered})

    def _item(self, slot: int, chunk: dict, item: dict) -> None:
        if "fatal" in item:
            self._stop(item["fatal"])
            return
        if "end" in item:
            figures = self.processes[self.pid_of[slot]]
            figures.update(sessions_created=item["sessions_created"], process_rss_peak=item["process_rss_peak"])
            self.warnings.extend(item["warnings"])
            return
        index = chunk["left"].pop(item["frame"])
        if "error" in item:
            self._fail(index, item["error"])
        else:
            self._written(slot, index, len(chunk["left"]))

    def _chunk_over(self, slot: int, chunk: dict, *, died: bool) -> None:
        for index in sorted(chunk["left"].values()):  # frames the worker never reported
            frame = self.frames[index]
            if frame.written_since_plan():  # finished: only its report was lost
                self._written(slot, index, 0, recovered=True)
                continue
            self.temps_removed += frame.remove_temps()
            self._fail(index, "its worker process died" if died else "the worker did not report it")
        if not died:
            self.idle.append(slot)

    def _worker_lost(self, slot: int, chunk: dict | None, exc: Exception) -> None:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if chunk is None:  # the actor could not start (or restart)
            self.start_failures[slot] += 1
            self.start_error = text
            if self.start_failures[slot] < self.max_tries:
                self.in_flight[self.actors[slot].ready.remote()] = (slot, None)
            return
        self.deaths += 1
        self.on_event({"event": "worker_died", "worker": slot, "frames": len(chunk["left"])})
        self._chunk_over(slot, chunk, died=True)
        # Ray restarts the actor; it takes work again once it answers ready() (meanwhile the
        # frames go to the others)
        self.in_flight[self.actors[slot].ready.remote()] = (slot, None)

    def _fail(self, index: int, error: str, *, final: bool = False) -> None:
        frame = self.frames[index]
        frame.tries += 1
        if self.fatal is not None:  # the job cannot run: said once, not retried
            frame.error = self.fatal
            self.failed.append(index)
            return
        if final or frame.tries >= self.max_tries or self.stopped:
            frame.error = error + (f" ({frame.tries} tries)" if frame.tries > 1 else "")
            self.failed.append(index)
            self.on_event({"event": "frame_failed", "frame": frame.ref.number, "error": frame.error})
            if self.stop_on_error:  # the chunks out finish; nothing more is sent or tried again
                self.stopped = True
                self.pending.clear()
            return
        self.redone += 1
        self.pending.appendleft([index])  # alone, so a frame that kills its worker is found out

    def _stop(self, message: str) -> None:
        if self.fatal is None:
            self.fatal = message
        self.pending.clear()

    def cancel(self) -> None:
        """Ctrl+C: the workers are killed; what they were writing is cleaned up like a death."""
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        for slot, chunk in list(self.in_flight.values()):
            if chunk is not None:
                for index in sorted(chunk["left"].values()):
                    frame = self.frames[index]
                    if frame.written_since_plan():
                        self._written(slot, index, 0, recovered=True)
                    else:
                        self.temps_removed += frame.remove_temps()
        self.in_flight.clear()
        self.pending.clear()
