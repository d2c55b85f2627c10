"""Real out-of-memory on CPU, in its own process: the shared CPU arena is capped (the cap is
process-wide and fixed at first registration), then a large run fails inside BFCArena."""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lean_image_ai.runtime import InferenceOutOfMemoryError, Runtime, RuntimeSettings  # noqa: E402
from onnx_builders import conv_model  # noqa: E402

CAP = 64 << 20
runtime = Runtime(RuntimeSettings(cpu_arena_max_bytes=CAP))
model = conv_model(Path(tempfile.mkdtemp()) / "conv.onnx")
report = {}
first = runtime.session(model, "cpu")
try:
    with runtime.operation("too-big") as op:
        # a 32 x 1024 x 1024 float intermediate is 128 MiB, twice the cap
        op.run(first, {"x": np.ones((1, 3, 1024, 1024), np.float32)}, last=True)
    report["raised"] = None
except InferenceOutOfMemoryError as exc:
    report.update(
        raised=type(exc).__name__,
        message=str(exc),
        model=exc.model,
        device=exc.device,
        resource=exc.resource,
        detail=exc.detail[:300],
    )
report["evicted"] = first.evicted and first not in runtime.cached_sessions()
report["oom_events"] = len(runtime.events.recent("out_of_memory"))
second = runtime.session(model, "cpu")
with runtime.operation("normal") as op:
    out = op.run(second, {"x": np.ones((1, 3, 64, 64), np.float32)}, last=True)["y"]
report["second_ok"] = bool(out.shape == (1, 3, 64, 64) and np.isfinite(out).all())
report["new_session"] = second is not first
report["sessions_created"] = runtime.sessions_created
print(json.dumps(report))
