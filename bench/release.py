"""Memory release, measured side by side in one run (CPU arena; no GPU on the dev machines).

1. RSS kept after an operation over the post-load baseline, release off vs on (each in a fresh
   process: the CPU arena is process-wide). Goal: on keeps <= 10% of the peak transient memory.
2. Time overhead of release on a 16-run operation (alternating on/off, median of repeats).
   Goal <= 3%.
3. Second operation's session setup time vs the first's (cache reuse). Goal <= 5%.

Ends with one JSON line of the figures.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def release_job(*args) -> dict:
    out = subprocess.run(
        [sys.executable, str(HERE / "release_job.py"), *args], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_operation(runtime, handle, frames) -> float:
    from lean_image_ai.runtime import mark_last

    started = time.perf_counter()
    with runtime.operation("bench") as op:
        for frame, last in mark_last(frames):
            op.run(handle, {"x": frame}, last=last)
    return time.perf_counter() - started


def main() -> dict:
    from lean_image_ai.runtime import Runtime
    from onnx_builders import conv_model, weights_model

    figures = {}
    print("1) RSS retained after one operation (1024x1024 conv, 32 mid channels), fresh process each")
    for ending in ("success", "cancel"):
        off = release_job("--release", "off", "--ending", ending, "--frames", "3")
        on = release_job("--release", "on", "--ending", ending, "--frames", "3")
        for label, job in (("off", off), ("on", on)):
            ratio = job["retained_beyond_outputs_bytes"] / job["peak_transient_bytes"]
            figures[f"retained_ratio_{ending}_release_{label}"] = round(ratio, 4)
            print(
                f"   {ending:8s} release {label:3s}: peak transient {job['peak_transient_bytes'] / 2**20:7.1f} MiB, "
                f"kept beyond outputs {job['retained_beyond_outputs_bytes'] / 2**20:7.1f} MiB ({ratio:.1%})"
            )
    figures["retained_mb_release_off"] = round(
        release_job("--release", "off")["retained_beyond_outputs_bytes"] / 2**20, 1
    )
    figures["retained_mb_release_on"] = round(
        release_job("--release", "on")["retained_beyond_outputs_bytes"] / 2**20, 1
    )

    print("2) time of a 16-run operation (256x256 frames), release on vs off, alternating")
    tmp = Path(tempfile.mkdtemp())
    model = conv_model(tmp / "conv.onnx", mid_channels=32)
    runtime = Runtime()
    handle = runtime.session(model, "cpu")
    frames = [np.random.default_rng(i).random((1, 3, 256, 256), dtype=np.float32) for i in range(16)]
    time_operation(runtime, handle, frames)  # warm-up
    on_times, off_times = [], []
    for index in range(15):
        # alternate which goes first, so neither always runs on a just-warmed cache
        for release in (True, False) if index % 2 == 0 else (False, True):
            runtime.configure(release_memory=release)
            (on_times if release else off_times).append(time_operation(runtime, handle, frames))
    pair_ratios = [on / off for on, off in zip(on_times, off_times, strict=True)]
    overhead = statistics.median(pair_ratios) - 1
    figures["release_time_overhead_16_runs"] = round(overhead, 4)
    print(
        f"   median on {statistics.median(on_times) * 1e3:.1f} ms, off {statistics.median(off_times) * 1e3:.1f} ms: "
        f"overhead {overhead:+.1%} (median of 15 paired ratios)"
    )

    print("3) session setup: first operation (creates, 64 MiB of weights) vs second (reuses)")
    heavy = weights_model(tmp / "weights.onnx", n=4096)
    fresh = Runtime()
    started = time.perf_counter()
    fresh.session(heavy, "cpu")
    first = time.perf_counter() - started
    reuse_times = []
    for _ in range(5):
        started = time.perf_counter()
        fresh.session(heavy, "cpu")
        reuse_times.append(time.perf_counter() - started)
    second = statistics.median(reuse_times)
    figures["second_setup_vs_first"] = round(second / first, 6)
    figures["sessions_created"] = fresh.sessions_created
    print(f"   first {first * 1e3:.1f} ms, second {second * 1e3:.3f} ms: ratio {second / first:.5f}")
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
