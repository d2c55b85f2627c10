"""What a long job's memory timeline costs Blender's main thread to receive (issue #37, wire), side
by side in one run: the whole timeline as the worker sent it before, against the thinned one it
sends now (runtime/measure/timeline.py's ``thinned``), plus what thinning costs the worker.

    python bench/worker_timeline.py [--hours 10] [--runs 20000] [--repeat 3]

A timeline of ``hours`` at the sampler's 20 samples a second (RSS only, as on a CPU job) with a run
mark per frame of a ``runs``-frame sequence crosses in a Status message as the worker sends it (a file of the exchange: it is longer
than a frame) and is received as the client receives it (read, parse, decode), timed. Medians;
ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from multiprocessing import Pipe

import numpy as np
from lean_image_ai.models.worker import protocol as p
from lean_image_ai.models.worker import wire
from lean_image_ai.runtime.measure import timeline as timelines


def long_timeline(hours: float, runs: int) -> dict:
    count = int(hours * 3600 / timelines.SAMPLE_INTERVAL_S)
    t = np.arange(count) * timelines.SAMPLE_INTERVAL_S
    ram = 1e9 + 4e8 * (np.sin(t / 30.0) > 0) + np.random.default_rng(0).normal(0, 2e7, count)
    samples = [(round(float(a), 4), {"ram": int(b), "vram": None}) for a, b in zip(t, ram, strict=True)]
    marks = [(samples[i][0], f"run {n}", dict(samples[i][1])) for n, i in enumerate(range(0, count, max(1, count // runs)), 1)]
    return {"samples": samples, "marks": marks, "operation": "upscale", "outcome": "done"}


def received(message: p.Status, exchange: wire.Exchange) -> tuple[float, int]:
    """(seconds the client's receive took, the bytes of the message's JSON)."""
    a, b = Pipe()
    sizes = []
    real = wire._carried
    wire._carried = lambda data, *rest: (sizes.append(len(data)), real(data, *rest))[1]
    try:
        wire.send(a, message, exchange)
    finally:
        wire._carried = real
    started = time.perf_counter()
    back = wire.receive(b, exchange)
    spent = time.perf_counter() - started
    assert back == message
    return spent, (sizes[0] if sizes else 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hours", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    full = long_timeline(args.hours, args.runs)
    thinning = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        thin = timelines.thinned(full)
        thinning.append(time.perf_counter() - started)
    exchange = wire.Exchange.create()
    rows = {"whole": [], "thinned": []}
    try:
        for _ in range(args.repeat):  # alternating, so a busy moment of the machine hits both
            rows["whole"].append(received(p.Status({"timeline": full}), exchange))
            rows["thinned"].append(received(p.Status({"timeline": thin}), exchange))
    finally:
        exchange.remove()
    seconds = {name: statistics.median(s for s, _ in runs) for name, runs in rows.items()}
    size = {name: runs[0][1] for name, runs in rows.items()}
    for name in rows:
        shown = full if name == "whole" else thin
        print(f"{name}: {len(shown['samples'])} samples, {len(shown['marks'])} marks, {size[name] / 2**20:.1f} MiB "
              f"of JSON, the host's receive {seconds[name] * 1000:.1f} ms")
    print(f"thinning in the worker: {statistics.median(thinning) * 1000:.0f} ms")
    print(json.dumps({
        "hours": args.hours, "runs": args.runs, "repeat": args.repeat, "samples_whole": len(full["samples"]),
        "samples_thinned": len(thin["samples"]), "marks_whole": len(full["marks"]), "marks_thinned": len(thin["marks"]), "json_bytes_whole": size["whole"], "json_bytes_thinned": size["thinned"],
        "receive_whole_s": round(seconds["whole"], 4), "receive_thinned_s": round(seconds["thinned"], 5),
        "receive_ratio_thinned_to_whole": round(seconds["thinned"] / seconds["whole"], 5),
        "worker_thinning_s": round(statistics.median(thinning), 4),
    }))


if __name__ == "__main__":
    main()
