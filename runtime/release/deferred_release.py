"""RAM given back once jobs stop coming, instead of at each job's last run
(`RuntimeSettings.cpu_release_delay`, seconds; 0, the default, releases at the last run).

Why: the CPU release hands the shared arena's pages to the operating system, so the next job
faults every one of them in again. Measured in bench/overhead.py, that re-faulting is most of
what a job costs over a bare `InferenceSession.run` (about 190 000 page faults for a 1024 px x4
upscale). With a delay, jobs that follow each other (a script's loop, a farm worker's chunks)
find the arena warm, and the memory still goes back once no job has started for the delay, the
way jemalloc returns dirty pages after a decay time. CUDA arenas are still shrunk in the job's
last run: the spec asks for that, and a GPU shared with Blender's viewport needs it at once.

A job that fails or is cancelled still gives its memory back at once (operation.py).
"""

from __future__ import annotations

import atexit
import threading
import weakref

from ..settings import MAX_RELEASE_DELAY_S

_LIVE: weakref.WeakSet = weakref.WeakSet()
_TIMER_NAME = "lean-image-ai-deferred-release"


class DeferredRelease:
    """The runtime's one pending CPU release: started when the last running job ends, cancelled
    when another starts, run on a timer thread (it touches onnxruntime only, never bpy)."""

    def __init__(self, runtime):
        self._runtime = weakref.ref(runtime)  # a pending timer must not keep a dropped runtime alive
        self._lock = threading.Lock()
        self._running_jobs = 0
        self._owed = False  # a job grew the CPU arena and its release was put off
        self._timer: threading.Timer | None = None
        self._generation = 0
        self._releasing = 0
        _LIVE.add(self)

    @property
    def pending(self) -> bool:
        """A release is owed or under way."""
        with self._lock:
            return self._owed or bool(self._releasing)

    def job_started(self) -> None:
        with self._lock:
            self._running_jobs += 1
            self._stop_timer()

    def job_ended(self, *, owes_release: bool) -> None:
        runtime = self._runtime()
        with self._lock:
            self._running_jobs = max(0, self._running_jobs - 1)
            self._owed = self._owed or owes_release
            if not self._owed or self._running_jobs or runtime is None:
                return
            # RuntimeSettings keeps the delay in range; the clamp keeps a timer alive whatever it is given
            delay = min(max(0.0, float(runtime.settings.cpu_release_delay)), MAX_RELEASE_DELAY_S)
            self._stop_timer()
            timer = threading.Timer(delay, self._due, args=(self._generation,))
            timer.daemon = True
            timer.name = _TIMER_NAME
            self._timer = timer
        timer.start()

    def settle(self) -> bool:
        """Release now what is owed instead of waiting for the timer; True if anything was."""
        with self._lock:
            owed = self._owed
            self._owed = False
            self._stop_timer()
            self._releasing += owed
        if owed:
            self._release()
        return owed

    def paid(self) -> None:
        """The shared arena was just shrunk (by any release): nothing is owed any more."""
        with self._lock:
            if not self._running_jobs:
                self._owed = False
                self._stop_timer()

    def cancel(self) -> None:
        with self._lock:
            self._stop_timer()

    def _stop_timer(self) -> None:
        self._generation += 1  # a timer already past its wait sees it was superseded
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _due(self, generation: int) -> None:
        with self._lock:
            if generation != self._generation or self._running_jobs or not self._owed:
                return
            self._owed = False
            self._timer = None
            self._releasing += 1
        self._release()

    @staticmethod
    def _on_timer() -> bool:
        return threading.current_thread().name == _TIMER_NAME

    def _release(self) -> None:
        runtime = self._runtime()
        try:
            if runtime is not None:
                runtime.release_now("deferred release", collect=not self._on_timer())
        except Exception as exc:  # a timer thread has no caller to tell: the event log does
            runtime.events.emit("deferred_release_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._releasing -= 1


@atexit.register
def _cancel_all() -> None:
    """No release starts while the interpreter shuts down (the process gives everything back)."""
    for deferred in list(_LIVE):
        deferred.cancel()
