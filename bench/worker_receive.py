"""What receiving one result costs the host's main thread (issue #37 item 3), side by side in one
run: the exchange's large-array read that maps the file (POSIX) against the copy into an anonymous
mapping it did before (still Windows' way), on the same files.

    python bench/worker_receive.py [--size 2048] [--repeat 7]

A ``size`` x ``size`` float32 RGBA result (2048: 64 MiB, a 512 px frame upscaled x4) is written to
a fresh exchange (/dev/shm on Linux) as the worker writes it, then read as the client reads it; the
pixels are then summed, so the mapped pages are really brought in (the work a writer does next),
timed apart. Medians; ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import mmap
import statistics
import time

import numpy as np
from lean_image_ai.models.worker import wire


def copied(exchange: wire.Exchange, entry: dict):
    """The read before the mapping: a copy into an anonymous mapping."""
    path = exchange.folders[entry["where"]] / entry["file"]
    try:
        with open(path, "rb") as source:
            size = path.stat().st_size
            chunk = mmap.mmap(-1, size)
            source.readinto(memoryview(chunk))
        return np.frombuffer(chunk, dtype=np.dtype(entry["dtype"])).reshape(entry["shape"])
    finally:
        exchange.discard([entry])


def timed(read, exchange: wire.Exchange, image: np.ndarray) -> tuple[float, float]:
    written: list[dict] = []
    exchange.write(image, written)
    began = time.perf_counter()
    received = read(exchange, written[0]) if read is copied else exchange.read(written[0])
    receive_s = time.perf_counter() - began
    began = time.perf_counter()
    float(received.sum(dtype=np.float64))
    return receive_s, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    image = np.random.default_rng(0).random((args.size, args.size, 4), dtype=np.float32)
    exchange = wire.Exchange.create()
    rows = {"mapped": [], "copied": []}
    try:
        for _ in range(args.repeat):  # alternating, so a busy moment of the machine hits both
            rows["mapped"].append(timed(exchange.read, exchange, image))
            rows["copied"].append(timed(copied, exchange, image))
    finally:
        exchange.remove()
    medians = {name: [statistics.median(r[i] for r in runs) for i in (0, 1)] for name, runs in rows.items()}
    for name, (receive_s, touch_s) in medians.items():
        print(f"{name}: receive {receive_s * 1000:.2f} ms, then reading every pixel {touch_s * 1000:.1f} ms")
    print(json.dumps({
        "array_mib": image.nbytes / 2**20, "repeat": args.repeat, "exchange": str(exchange.folders["m"].parent),
        "receive_mapped_s": round(medians["mapped"][0], 5), "receive_copied_s": round(medians["copied"][0], 5),
        "receive_ratio_mapped_to_copied": round(medians["mapped"][0] / medians["copied"][0], 4),
        "receive_plus_read_ratio": round(sum(medians["mapped"]) / sum(medians["copied"]), 3),
    }))


if __name__ == "__main__":
    main()
