"""Out of memory in the middle of a tiled upscale, in its own process (the capped CPU arena is
process-wide): RSS at each moment the factory is asked for a session, so a test can tell whether
the failed session (its weights and the arena it grew) was gone before its replacement loaded.

argv: model path, arena cap in bytes, image side. Prints one JSON line.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lean_image_ai.models.adapters import upscale  # noqa: E402
from lean_image_ai.models.base import RunOptions  # noqa: E402
from lean_image_ai.runtime import Runtime, RuntimeSettings  # noqa: E402
from lean_image_ai.runtime.core import default_session_factory  # noqa: E402
from lean_image_ai.runtime.measure.memory import process_rss_bytes  # noqa: E402

model, cap, side = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
loads = []  # per session the runtime asks for: RSS just before and just after it loads


def factory(path, options, providers):
    entry = {"before": process_rss_bytes()}
    session = default_session_factory(path, options, providers)
    entry["after"] = process_rss_bytes()
    loads.append(entry)
    return session


runtime = Runtime(RuntimeSettings(cpu_arena_max_bytes=cap), session_factory=factory)
image = np.random.default_rng(0).random((side, side, 3), dtype=np.float32)
result = upscale.run(image, model, options=RunOptions(device="cpu", runtime=runtime), tile_size=None)
print(
    json.dumps(
        {
            "loads": loads,
            "splits": len(runtime.events.recent("tile_split")),
            "oom_events": len(runtime.events.recent("out_of_memory")),
            "shape": list(result.image.shape),
            "finite": bool(np.isfinite(result.image).all()),
        }
    )
)
