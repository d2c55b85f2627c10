"""The process-wide CPU arena CPU sessions share, so RAM comes back after a job too (bpy-free).

ONNX Runtime registers it once per process (``create_and_register_allocator``) with
``kSameAsRequested``, so every region it grows can be freed again by a run carrying ``cpu:0``.
"""

from __future__ import annotations

import threading

from ..session import onnxruntime_module

# A passthrough graph (input "x" float[1] is also the output, no nodes). Its run allocates
# nothing from the arena, so a run of it carrying `cpu:0` can free every region of the shared
# CPU arena that is no longer in use. Built with onnx.helper; tests/test_runtime.py rebuilds it
# and checks these bytes.
RELEASE_PROBE_MODEL = bytes.fromhex(
    "0808120d6c65616e5f696d6167655f61693a31120d72656c656173655f70726f62655a0f0a0178120a0a0808"
    "0112040a020801620f0a0178120a0a08080112040a02080142040a001011"
)

_ENV_CPU_ARENA_LOCK = threading.Lock()
_env_cpu_arena: dict | None = None  # the config it was registered with; once per process


def register_env_cpu_arena(max_bytes: int | None) -> bool:
    """Register the shared kSameAsRequested CPU arena once; True when it is usable."""
    global _env_cpu_arena
    with _ENV_CPU_ARENA_LOCK:
        if _env_cpu_arena is None:
            ort = onnxruntime_module()
            config = {"arena_extend_strategy": 1}  # kSameAsRequested: every region can be freed
            if max_bytes:
                config["max_mem"] = int(max_bytes)
            info = ort.OrtMemoryInfo(
                "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
            )
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(config))
            _env_cpu_arena = config
        return True


def env_cpu_arena_config() -> dict | None:
    return None if _env_cpu_arena is None else dict(_env_cpu_arena)
