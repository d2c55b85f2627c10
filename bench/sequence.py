"""Sequence throughput and memory: frames read and written while the model runs vs strictly serial.

Same frames, same model, same files, measured side by side in one run:
- pipelined: models/batch/sequence.py's BatchRun (the caller reads the next frame and writes the last
  result while the worker runs the model, 2 frames buffered each way);
- serial: the same adapter over the same frames, each read just before its run and written just
  after it on the same thread (still one runtime operation).
Both read and write PNGs with Pillow, so file I/O is a real share of the time. Two storage cases:
local files (encoding is CPU work that competes with the model for the same cores), and storage
with a fixed latency per file access (``--latency-ms``, a network share: time spent waiting, which
the pipeline can hide). Then the pipelined batch at 12 and at 48 frames, each in a fresh process: peak RSS must not grow
with the length. Prints a table and ends with one JSON line.

    .venv/bin/python bench/sequence.py [--frames 16] [--size 384] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def make_frames(folder: Path, count: int, size: int) -> list:
    from lean_image_ai.models.batch.frame_lists import FrameRef
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    base = (rng.random((size, size, 3)) * 255).astype(np.uint8)
    refs = []
    for n in range(1, count + 1):
        path = folder / f"f_{n:04d}.png"
        Image.fromarray(np.roll(base, n * 7, axis=1)).save(path, compress_level=6)
        refs.append(FrameRef(n, path))
    return refs


LATENCY = {"seconds": 0.0}  # per file access: what a network share adds


def read(ref):
    from PIL import Image

    time.sleep(LATENCY["seconds"])
    with Image.open(ref.path) as image:
        return np.asarray(image.convert("RGB"))


def writer(folder: Path):
    from lean_image_ai.models import files
    from PIL import Image

    def write(ref, result):
        time.sleep(LATENCY["seconds"])
        pixels = (np.clip(result.image, 0, 1) * 255 + 0.5).astype(np.uint8)
        with files.atomic_path(folder / f"o_{ref.number:04d}.png") as temp:
            Image.fromarray(pixels).save(temp, format="PNG", compress_level=6)

    return write


def pipelined(refs, model, out: Path, runtime) -> float:
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions
    from lean_image_ai.models.batch.sequence import BatchRun

    options = RunOptions(device="cpu", runtime=runtime, cancel=threading.Event())
    started = time.perf_counter()
    report = BatchRun(
        refs, lambda frames, o: upscale.run(frames, model, options=o, tile_size=None), read, writer(out), options=options
    ).run()
    assert len(report.written) == len(refs), report.failed
    return time.perf_counter() - started


class SerialFrames:
    """Each frame read when the adapter asks for it, on the adapter's own thread."""

    def __init__(self, refs):
        self.refs = refs

    def __len__(self):
        return len(self.refs)

    def __iter__(self):
        return (read(ref) for ref in self.refs)


def serial(refs, model, out: Path, runtime) -> float:
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions

    write, numbers = writer(out), iter(refs)
    options = RunOptions(device="cpu", runtime=runtime, on_result=lambda result: write(next(numbers), result))
    started = time.perf_counter()
    upscale.run(SerialFrames(refs), model, options=options, tile_size=None)
    return time.perf_counter() - started


def peak_child(frames: int, size: int, model: Path) -> int:
    code = f"""
import sys, json, tempfile, threading
from pathlib import Path
sys.path.insert(0, {str(ROOT / 'bench')!r})
import sequence as bench
from lean_image_ai.runtime import Runtime
from lean_image_ai.runtime.measure.memory import peak_rss_bytes
with tempfile.TemporaryDirectory() as tmp:
    refs = bench.make_frames(Path(tmp) / "in", {frames}, {size})
    out = Path(tmp) / "out"; out.mkdir()
    runtime = Runtime()
    bench.pipelined(refs, Path({str(model)!r}), out, runtime)
    print(json.dumps({{"peak": peak_rss_bytes()}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["peak"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-ms", type=int, default=100, help="per file access, for the network-share case")
    parser.add_argument("--mid-channels", type=int, default=96, help="model width: its run time against the file I/O")
    args = parser.parse_args()
    from lean_image_ai.runtime import Runtime
    from onnx_builders import sr_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = sr_model(tmp / "sr.onnx", scale=2, mid_channels=args.mid_channels)
        refs = make_frames(tmp / "in", args.frames, args.size)
        runtime = Runtime()
        pipelined(refs[:2], model, _fresh(tmp / "warm"), runtime)  # session created once, outside the timing
        figures = {}
        for case, latency in (("local", 0.0), (f"latency_{args.latency_ms}ms", args.latency_ms / 1000)):
            LATENCY["seconds"] = latency
            ratios, times = [], {"pipelined": [], "serial": []}
            for _ in range(args.repeats):  # alternating, so drift hits both alike
                s = serial(refs, model, _fresh(tmp / "s"), runtime)
                p = pipelined(refs, model, _fresh(tmp / "p"), runtime)
                times["serial"].append(s)
                times["pipelined"].append(p)
                ratios.append(s / p)
            figures[case] = {
                "frames_per_s": {k: round(args.frames / statistics.median(v), 3) for k, v in times.items()},
                "pipelined_over_serial": round(statistics.median(ratios), 3),
            }
        LATENCY["seconds"] = 0.0
        peak_12 = peak_child(12, args.size, model)
        peak_48 = peak_child(48, args.size, model)
    print(f"{'storage':<16} {'serial f/s':>10} {'pipelined f/s':>14} {'ratio':>6}")
    for case, row in figures.items():
        fps = row["frames_per_s"]
        print(f"{case:<16} {fps['serial']:10.2f} {fps['pipelined']:14.2f} {row['pipelined_over_serial']:6.2f}")
    print(f"(median of {args.repeats} paired runs each)")
    print(f"peak RSS, 48 vs 12 frames: {peak_48 / 2**20:.0f} MiB / {peak_12 / 2**20:.0f} MiB = {peak_48 / peak_12:.3f}")
    print(
        json.dumps(
            {
                "bench": "sequence",
                "frames": args.frames,
                "size": args.size,
                **figures,
                "peak_rss_48_over_12": round(peak_48 / peak_12, 3),
            }
        )
    )


def _fresh(folder: Path) -> Path:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


if __name__ == "__main__":
    main()
