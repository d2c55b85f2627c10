"""What the host asks of an idle model worker about its memory (bpy-free), a part of the worker
client (models/worker/client.py's WorkerClient mixes it in): the panel's one line of its state,
Release now / Unload all in it, Free Memory Now (its end, with what it held just before), and the
idle end and liveness the host's timer checks. Every answer is waited for at most
:data:`FREE_WAIT_S` (a bounded wait on a button), the timer's never; nothing here starts a thread.
"""

from __future__ import annotations

import os
import time

from ...runtime.errors import LeanImageError
from . import host_record
from . import protocol as p
from .deadlines import heartbeat_deadline

FREE_WAIT_S = 2.0  # Free memory now waits this long for the worker's own figures, then ends it anyway


class MemoryRequests:
    """The memory side of WorkerClient (it provides running, job_name, status, peer, process,
    idle_since, messages, send, stop, kill and _tidy)."""

    def state(self) -> str:
        """One line for the panel: not running / ready, model X, N MiB / running job Y."""
        if not self.running:
            return "Worker: not running (nothing kept)"
        if self.job_name:
            return f"Worker: running {self.job_name}"
        try:
            self.messages()
            if self.peer is not None:  # a worker still starting has nothing to tell yet
                self.send(p.Ask("state"))
        except (LeanImageError, OSError):
            return "Worker: not running (nothing kept)"
        models = ", ".join(self.status.get("models", ())) or "no model loaded"
        rss = self.status.get("rss_bytes")
        size = f", {rss / 2**20:.0f} MiB" if rss else ""
        return f"Worker: ready, {models}{size}"

    def free_now(self) -> dict:
        """End the worker now; what it held just before (``rss_bytes``, ``vram_bytes`` where NVML
        sees it), measured by the worker itself, or by this side where the worker cannot answer."""
        if not self.running:
            self._tidy()
            host_record.worker_ended()
            return {"rss_bytes": 0, "vram_bytes": None, "was_running": False}
        figures = self._await(p.Free(), p.Freed)
        figures = figures.figures if figures is not None else {"rss_bytes": _rss_of(self.process.pid), "vram_bytes": None}
        self.kill()
        host_record.worker_ended()
        return {**figures, "was_running": True}

    def ask(self, what: str) -> dict | None:
        """Release now / Unload all in an idle worker: its answer (what was freed), or None when
        it does not run or gives none within :data:`FREE_WAIT_S`."""
        if not self.running or self.job_name:
            return None
        answer = self._await(p.Ask(what), p.Answer)
        return answer.value if answer is not None else None

    def _await(self, message: p.Message, kind: type) -> p.Message | None:
        deadline = time.monotonic() + FREE_WAIT_S
        try:
            self.messages()
            self.send(message)
            while time.monotonic() < deadline:
                for found in self.messages():
                    if isinstance(found, kind):
                        return found
                time.sleep(0.01)
        except (LeanImageError, OSError):
            pass
        return None

    def check_idle(self, idle_seconds: float, *, now: float | None = None) -> bool:
        """The host's timer: end a worker idle for ``idle_seconds`` (0: never); True when it did."""
        wait = self.idle_wait(idle_seconds, now=now)
        if wait is None or wait > 0:
            return False
        self.stop()
        host_record.worker_ended()
        return True

    def check_alive(self, *, now: float | None = None) -> bool:
        """The host's timer, at each tick, on an idle worker (no wait): the state it asks for at
        one tick must have come by a later one; a worker silent for the heartbeat deadline since
        (stopped or hung while idle) is ended, and the next job starts a new one without first
        waiting that deadline out. False when it is not running (now)."""
        if not self.running or self.job_name or self.peer is None:
            return self.running
        now = time.monotonic() if now is None else now
        try:
            self.messages()
        except (LeanImageError, OSError):
            return False
        asked = self._asked_alive_at
        if asked is not None and self._heard_at < asked:  # nothing heard since it was asked
            if now - asked <= heartbeat_deadline():
                return True
            self._note("worker_restart", reason=f"the idle model process did not answer for {now - asked:.0f} s "
                                                "(stopped or hung); it was ended, the next job starts a new one")
            self.kill()
            host_record.worker_ended()
            return False
        try:
            self.send(p.Ask("state"))
        except (LeanImageError, OSError):
            return False
        self._asked_alive_at = now
        return True

    def idle_wait(self, idle_seconds: float, *, now: float | None = None) -> float | None:
        """Seconds until :meth:`check_idle` ends the worker (None: it will not: none runs, it has
        a job, or idle ending is off)."""
        if idle_seconds <= 0 or not self.running or self.job_name:
            return None
        now = time.monotonic() if now is None else now
        return idle_seconds - (now - self.idle_since)


def _rss_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
