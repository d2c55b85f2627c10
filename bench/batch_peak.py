"""Peak memory during a multi-frame tiled upscale batch (CPU arena; no GPU on the dev machines).

Question (issue #10, item 6): frames before the last do not shrink (only the job's final run
does), so how much does the arena hold during a batch, frame after frame? Each configuration runs
in a fresh process (the CPU arena is process-wide) with RSS sampled every 2 ms:

- ``one job``: all frames in one operation, the default: only the last tile of the last frame
  releases;
- ``job per frame``: the cheap alternative, one operation per frame, so each frame's last tile
  carries the shrink entry (on CUDA too: it is the same run entry); what it costs in time;
- ``ORT default arena``: one job on onnxruntime's own CPU arena (kNextPowerOfTwo, what the
  preference *Release CPU memory* off gives), for the extend strategy side by side.

Per frame: peak RSS over the post-load baseline, beyond the earlier frames' results (held in
both modes), as a multiple of frame 1's peak; "kept after" is beyond all results. Ends with one
JSON line. ``python bench/batch_peak.py [--frames 6] [--size 512] [--tile 256 (0: untiled)]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def child(mode: str, frames: int, size: int, tile: int, mid: int) -> dict:
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions
    from lean_image_ai.runtime import Runtime, RuntimeSettings
    from lean_image_ai.runtime.measure.memory import process_rss_bytes
    from onnx_builders import sr_model

    model = sr_model(Path(tempfile.mkdtemp()) / "sr.onnx", scale=2, mid_channels=mid)
    runtime = Runtime(RuntimeSettings(cpu_arena=mode != "ort_default_arena"))
    images = [np.random.default_rng(i).random((size, size, 3), dtype=np.float32) for i in range(frames)]
    upscale.run(images[0][:32, :32], model, options=RunOptions(device="cpu", runtime=runtime), tile_size=None)
    samples: list[tuple[float, int]] = []
    marks: list[float] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((time.perf_counter(), process_rss_bytes()))
            time.sleep(0.002)

    baseline = process_rss_bytes()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    marks.append(started)
    if mode in ("one_job", "ort_default_arena"):

        def progress(fraction, _text):
            # a frame ends when the fraction crosses k / frames
            if len(marks) <= frames and fraction >= len(marks) / frames - 1e-9:
                marks.append(time.perf_counter())

        results = upscale.run(
            images, model, options=RunOptions(device="cpu", runtime=runtime, progress=progress), tile_size=tile or None
        )
    else:
        results = []  # kept, as the one job keeps every frame's result until it returns
        for image in images:
            results.append(upscale.run(image, model, options=RunOptions(device="cpu", runtime=runtime), tile_size=tile or None))
            marks.append(time.perf_counter())
    seconds = time.perf_counter() - started
    time.sleep(0.02)
    stop.set()
    sampler.join()
    after = process_rss_bytes()
    marks = marks[: frames + 1]
    while len(marks) < frames + 1:
        marks.append(time.perf_counter())
    output_bytes = results[0].image.nbytes  # every frame's result has the same size
    peaks = []
    for index, (begin, end) in enumerate(zip(marks[:-1], marks[1:], strict=True)):
        window = [rss for t, rss in samples if begin <= t <= end] or [after]
        # beyond the results of the frames before this one, which the caller holds either way
        peaks.append(max(window) - baseline - index * output_bytes)
    kept = after - baseline - frames * output_bytes
    return {"mode": mode, "peaks": peaks, "kept_after": kept, "seconds": seconds}


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=["one_job", "job_per_frame", "ort_default_arena"])
    parser.add_argument("--frames", type=int, default=6)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--tile", type=int, default=256)
    parser.add_argument("--mid-channels", type=int, default=64)
    args = parser.parse_args()
    shape = (args.frames, args.size, args.tile, args.mid_channels)
    if args.child:
        print(json.dumps(child(args.child, *shape)))
        return {}
    results = {}
    for mode in ("one_job", "job_per_frame", "ort_default_arena"):
        command = [sys.executable, __file__, "--child", mode, "--frames", str(args.frames), "--size", str(args.size)]
        command += ["--tile", str(args.tile), "--mid-channels", str(args.mid_channels)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    first = results["one_job"]["peaks"][0] or 1
    figures = {"frames": args.frames, "size": args.size, "tile": args.tile, "mid_channels": args.mid_channels}
    for mode, result in results.items():
        ratios = [round(p / first, 2) for p in result["peaks"]]
        print(
            f"{mode:13s}: peak per frame (MiB over baseline) {[round(p / 2**20) for p in result['peaks']]}"
            f" = {ratios} x frame 1; kept after {result['kept_after'] / 2**20:.1f} MiB; {result['seconds']:.2f} s"
        )
        figures[f"{mode}_peak_ratios"] = ratios
        figures[f"{mode}_max_peak_ratio"] = max(ratios)
        figures[f"{mode}_kept_after_ratio"] = round(result["kept_after"] / first, 3)
    figures["time_ratio_job_per_frame_vs_one_job"] = round(
        results["job_per_frame"]["seconds"] / results["one_job"]["seconds"], 3
    )
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
