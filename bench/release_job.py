"""One memory-release measurement in a fresh process (the CPU arena is process-wide, so every
configuration needs its own process for a clean baseline). Used by bench/release.py and tests.

Prints one JSON line: RSS over the post-load baseline after the operation, and the peak.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--release", choices=["on", "off"], default="on")
    parser.add_argument("--ending", choices=["success", "cancel", "error"], default="success")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--frames", type=int, default=1)
    parser.add_argument("--mid-channels", type=int, default=32)
    args = parser.parse_args(argv)

    from lean_image_ai.runtime import OperationCancelled, Runtime, RuntimeSettings, mark_last
    from lean_image_ai.runtime.errors import InferenceError
    from lean_image_ai.runtime.measure.memory import peak_rss_bytes, process_rss_bytes, reset_peak_rss
    from onnx_builders import conv_model

    tmp = Path(tempfile.mkdtemp())
    model = conv_model(tmp / "conv.onnx", mid_channels=args.mid_channels)
    runtime = Runtime(RuntimeSettings(release_memory=args.release == "on"))
    handle = runtime.session(model, "cpu")
    with runtime.operation("warm-up") as op:  # first tiny run: allocator and kernels initialised
        op.run(handle, {"x": np.zeros((1, 3, 8, 8), np.float32)}, last=True)
    frames = [
        np.random.default_rng(i).random((1, 3, args.size, args.size), dtype=np.float32)
        for i in range(args.frames)
    ]
    baseline = process_rss_bytes()
    reset_peak_rss()
    cancel = threading.Event()
    outputs = []
    outcome = "success"
    try:
        with runtime.operation("measured", cancel=cancel) as op:
            for index, (frame, last) in enumerate(mark_last(frames)):
                if args.ending == "error" and index == 1:
                    frame = np.zeros((1, 5, 8, 8), np.float32)  # wrong channel count: the run fails
                outputs.append(op.run(handle, {"x": frame}, last=last)["y"])
                if args.ending == "cancel" and index == 0:
                    cancel.set()
    except OperationCancelled:
        outcome = "cancelled"
    except InferenceError:
        outcome = "error"
    after = process_rss_bytes()
    peak = peak_rss_bytes()
    output_bytes = sum(o.nbytes for o in outputs)
    result = {
        "release": args.release,
        "ending": args.ending,
        "outcome": outcome,
        "baseline_rss_bytes": baseline,
        "retained_bytes": after - baseline,
        "retained_beyond_outputs_bytes": after - baseline - output_bytes,
        "output_bytes": output_bytes,
        "peak_transient_bytes": peak - baseline,
        "sessions_cached": len(runtime.cached_sessions()),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
