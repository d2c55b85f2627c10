"""Memory given back on request (bpy-free), a part of the shared runtime (runtime/core.py's Runtime
mixes it in): the shared CPU arena's free regions by a probe run, Release now (sessions kept),
Unload all / one device's sessions, the idle unload, each measured before and after
(``memory_freed``: what the figures went down by).
"""

from __future__ import annotations

import gc
import time

import numpy as np

from ..measure.memory import figures, memory_snapshot, trim_process_heap
from ..providers import CPU, SHRINK_CONFIG_KEY
from ..session import SessionHandle, onnxruntime_module
from .cpu_arena import RELEASE_PROBE_MODEL, env_cpu_arena_config


class ReleaseOnRequest:
    """The release side of Runtime (it provides scratch, deferred, events, _lock, _probe,
    cached_sessions and evict)."""

    def release_cpu_arena(self) -> bool:
        """Free every unused region of the shared CPU arena (a run that allocates nothing)."""
        self.scratch.drop()  # kept buffers go back with the arena's regions
        if env_cpu_arena_config() is None:
            return False
        ort = onnxruntime_module()
        with self._lock:
            if self._probe is None:
                options = ort.SessionOptions()
                options.add_session_config_entry("session.use_env_allocators", "1")
                self._probe = ort.InferenceSession(RELEASE_PROBE_MODEL, options, providers=[CPU])
            probe = self._probe
        run_options = ort.RunOptions()
        run_options.add_run_config_entry(SHRINK_CONFIG_KEY, "cpu:0")
        probe.run(None, {"x": np.zeros(1, np.float32)}, run_options)
        trim_process_heap()  # and what the job's numpy temporaries left in the C heap
        self.deferred.paid()
        return True

    # ---- on request: Release now / Unload all / idle unload -------------------------------
    def _measured(self, action: str, gpu_ids, work, *, collect: bool = True) -> dict:
        if collect:  # off for the deferred release's timer thread: it must not finalize bpy objects
            gc.collect()
        before = {g: figures(memory_snapshot(g)) for g in gpu_ids}
        sessions = work()
        if collect:
            gc.collect()
        after = {g: figures(memory_snapshot(g)) for g in gpu_ids}
        by = {"ram": _drop(before[None]["ram"], after[None]["ram"])}
        for g in gpu_ids:
            if g is not None:
                by[f"vram:{g}"] = _drop(before[g]["vram"], after[g]["vram"])
        freed = {"action": action, "sessions": sessions, "by": by}
        self.events.emit("memory_freed", **freed)
        return freed

    def _gpu_ids(self, handles) -> list:
        return [None, *sorted({h.gpu_device_id for h in handles if h.gpu_device_id is not None})]

    def release_now(self, action: str = "release now", *, collect: bool = True) -> dict:
        """Give back arena memory now, keeping every session (weights stay loaded).

        The shared CPU arena is shrunk by a probe run. A CUDA arena can only be shrunk inside a
        run of its own session, which every job's last run already does: nothing is left there.
        """
        handles = self.cached_sessions()
        return self._measured(
            action, self._gpu_ids(handles), lambda: (self.release_cpu_arena(), 0)[1], collect=collect
        )

    def unload(self, device: str | None = None, reason: str = "unload all") -> dict:
        """Drop the cached sessions (all, or only those on ``device``, a device label such as
        ``CUDA:1`` or ``CPU``): weights and arenas go with them; other devices are untouched."""
        handles = [h for h in self.cached_sessions() if device is None or h.device_label == device]
        return self.unload_sessions(handles, reason, arena=device is None)

    def unload_sessions(self, handles: list[SessionHandle], reason: str, *, arena: bool = False) -> dict:
        """Drop these sessions now and measure what that gave back (``memory_freed``); the shared
        CPU arena's free regions go too when one of them used it (or ``arena``)."""

        def work():
            for handle in handles:
                self.evict(handle, reason)
            if arena or any(h.cpu_arena for h in handles):
                self.release_cpu_arena()
            else:  # what the sessions' own allocators freed, out of the C heap
                trim_process_heap()
            return len(handles)

        return self._measured(reason, self._gpu_ids(handles), work)

    def unload_idle(self, idle_seconds: float, *, now: float | None = None) -> list[SessionHandle]:
        """Unload the sessions unused for ``idle_seconds`` or more (0 keeps everything)."""
        if idle_seconds <= 0:
            return []
        now = time.time() if now is None else now
        idle = [h for h in self.cached_sessions() if now - h.last_used >= idle_seconds]
        for handle in idle:
            self.evict(handle, "idle")
        if any(h.cpu_arena for h in idle):
            self.release_cpu_arena()
        return idle


def _drop(before, after):
    return None if before is None or after is None else before - after
