"""Real CPU InferenceSessions wrapped to record what the runtime hands to onnxruntime.

`Runtime(session_factory=RecordingFactory(...))`: every session is a real onnxruntime session;
the wrapper records the session options/providers it was created with and, for each run(), the
`memory.enable_memory_arena_shrinkage` entry and the feeds. `reported_providers` /
`reported_options` stand in for what cannot exist here (a CUDA, DirectML or CoreML device): the
session then *reports* that provider while computing on CPU.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from lean_image_ai.models.base import RunOptions

SHRINK_CONFIG_KEY = "memory.enable_memory_arena_shrinkage"
CPU = "CPUExecutionProvider"
_RECORDED_SESSION_CONFIG = ("session.use_env_allocators", "session.use_device_allocator_for_initializers")


def _config_entry(getter, key) -> str | None:
    try:
        return getter(key)
    except Exception:  # ORT raises for a key that was never set
        return None


class RecordingSession:
    def __init__(self, real, factory, reported_providers=None, reported_options=None):
        self.real = real
        self.factory = factory
        self.reported_providers = reported_providers
        self.reported_options = reported_options
        self.shrink_entries: list[str] = []  # "" when the run carried no entry
        self.feeds: list[dict[str, np.ndarray]] = []  # copies of each run's feeds

    def get_providers(self):
        return self.reported_providers or self.real.get_providers()

    def get_provider_options(self):
        return (
            self.reported_options if self.reported_options is not None else self.real.get_provider_options()
        )

    def get_inputs(self):
        return self.real.get_inputs()

    def get_outputs(self):
        return self.real.get_outputs()

    def _record(self, feeds, run_options) -> dict:
        entry = (
            _config_entry(run_options.get_run_config_entry, SHRINK_CONFIG_KEY) if run_options else None
        ) or ""
        copies = {k: np.array(v, copy=True) for k, v in feeds.items()}
        self.shrink_entries.append(entry)
        self.feeds.append(copies)
        record = {
            "session": self,
            "shrink": entry,
            "shape": list(next(iter(copies.values())).shape),
            "feeds": copies,
            "ok": False,
        }
        self.factory.log.append(record)
        return record

    def _options_for_real(self, run_options):
        # the real CPU session would reject e.g. a gpu: entry; what was recorded is the point
        if self.reported_providers and self.reported_providers[0] != CPU:
            return ort.RunOptions()
        return run_options

    def run(self, names, feeds, run_options=None):
        record = self._record(feeds, run_options)
        outputs = self.real.run(names, feeds, self._options_for_real(run_options))
        record["ok"] = True
        return outputs

    def io_binding(self):
        return RecordingBinding(self.real.io_binding())

    def run_with_iobinding(self, binding, run_options=None):
        record = self._record(binding.feeds, run_options)
        self.real.run_with_iobinding(binding.real, self._options_for_real(run_options))
        record["ok"] = True


class RecordingBinding:
    """The real IOBinding, remembering its inputs so the run can be recorded like run()'s."""

    def __init__(self, real):
        self.real = real
        self.feeds: dict[str, np.ndarray] = {}

    def bind_cpu_input(self, name, value):
        self.feeds[name] = value
        self.real.bind_cpu_input(name, value)

    def bind_output(self, *args, **kwargs):
        self.real.bind_output(*args, **kwargs)

    def copy_outputs_to_cpu(self):
        return self.real.copy_outputs_to_cpu()


class RecordingFactory:
    def __init__(self, reported_providers=None, reported_options=None):
        self.reported_providers = reported_providers
        self.reported_options = reported_options
        self.calls: list[dict] = []  # what InferenceSession() received
        self.sessions: list[RecordingSession] = []
        self.log: list[dict] = []  # every run of every session, in order

    def __call__(self, model_path, session_options, providers):
        config = {}
        for key in _RECORDED_SESSION_CONFIG:
            value = _config_entry(session_options.get_session_config_entry, key)
            if value:
                config[key] = value
        self.calls.append({"model": model_path, "providers": providers, "config": config})
        real = ort.InferenceSession(model_path, sess_options=session_options, providers=[CPU])
        session = RecordingSession(real, self, self.reported_providers, self.reported_options)
        self.sessions.append(session)
        return session

    @property
    def runs(self) -> list[dict]:
        return self.log

    @property
    def shrink_entries(self) -> list[str]:
        return [r["shrink"] for r in self.log]

    @property
    def fed(self) -> list[dict[str, tuple]]:
        """name -> (shape, dtype) of each run's feeds, in order."""
        return [{k: (tuple(v.shape), v.dtype) for k, v in r["feeds"].items()} for r in self.log]


def cpu_options(runtime, **kwargs) -> RunOptions:
    """Adapter options that run on CPU through the given (usually recording) runtime."""
    return RunOptions(device="cpu", runtime=runtime, **kwargs)
