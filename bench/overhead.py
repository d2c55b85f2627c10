"""What the add-on costs on top of onnxruntime, side by side in one run (ratios only: DESIGN.md §5).

    .venv/bin/python bench/overhead.py [--pairs 7] [--threads 2]

(a) end-to-end `upscale.run` (HxWx3 float32 in, result out: preparation, receptive-radius plan,
    tiles, IOBinding into the job's buffer, paste, release) over a bare
    `InferenceSession.run` of the same model on the same, already prepared 1x3xHxW tensor with the
    same thread count; at 512 and 1024 px. Pairs alternate which side runs first; the figure is the
    median of the per-pair ratios (goal <= 1.10).
    The same with the runtime's memory release off separates what giving memory back costs (the
    next job faults its arena pages in again; a bare session keeps its arena warm).
(b) auto-tiled over untiled throughput at 1024 px (goal >= 0.95), pairs alternated likewise.

The model is built like Real-ESRGAN's SRVGGNetCompact (x4, 16 body convs, 16 features, random
weights). Prints a table, then exactly one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SIZES = (512, 1024)


def _image(size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((size, size, 3), dtype=np.float32)


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _paired(first, second, pairs: int) -> list[float]:
    """Per-pair ratios first/second, alternating which runs first."""
    ratios = []
    for index in range(pairs):
        if index % 2:
            b = _timed(second)
            a = _timed(first)
        else:
            a = _timed(first)
            b = _timed(second)
        ratios.append(a / b)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import onnxruntime as ort
    from builders_upscale import compact_model
    from lean_image_ai.models import upscale
    from lean_image_ai.models.base import JobOptions
    from lean_image_ai.models.imaging import to_nchw
    from lean_image_ai.runtime import Runtime
    from lean_image_ai.runtime.core import RuntimeSettings

    with tempfile.TemporaryDirectory() as folder:
        model = compact_model(Path(folder) / "compact_x4.onnx", num_conv=16, feat=16, scale=4)
        runtime = Runtime(RuntimeSettings(intra_op_threads=args.threads))
        options = JobOptions(device="cpu", runtime=runtime)
        kept = Runtime(RuntimeSettings(intra_op_threads=args.threads, release_memory=False))
        kept_options = JobOptions(device="cpu", runtime=kept)
        bare_options = ort.SessionOptions()
        bare_options.intra_op_num_threads = args.threads
        bare = ort.InferenceSession(str(model), bare_options, providers=["CPUExecutionProvider"])

        figures: dict = {"threads": args.threads, "pairs": args.pairs}
        rows = []
        for size in SIZES:
            image = _image(size, seed=size)
            tensor = to_nchw(image)
            bare.run(None, {"input": tensor})
            cases = (
                ("end_to_end_over_bare", "end-to-end / bare run,", options, "<= 1.10"),
                ("end_to_end_no_release_over_bare", "  the same, release off,", kept_options, ""),
            )
            for key, label, case_options, goal in cases:
                upscale.run(image, model, options=case_options)  # session, kernels and radius cache warmed
                ratios = _paired(
                    lambda image=image, o=case_options: upscale.run(image, model, options=o),
                    lambda tensor=tensor: bare.run(None, {"input": tensor}),
                    args.pairs,
                )
                median = statistics.median(ratios)
                figures[f"{key}_{size}"] = round(median, 4)
                rows.append((f"{label} {size} px", median, min(ratios), max(ratios), goal))

        image = _image(1024, seed=1)
        ratios = _paired(
            lambda: upscale.run(image, model, options=options, tile_size=None),
            lambda: upscale.run(image, model, options=options, tile_size="auto"),
            args.pairs,
        )  # untiled time / auto time = auto throughput / untiled throughput
        median = statistics.median(ratios)
        figures["auto_over_untiled_throughput_1024"] = round(median, 4)
        rows.append(("auto-tiled / untiled throughput, 1024 px", median, min(ratios), max(ratios), ">= 0.95"))
        runtime.clear()
        kept.clear()

    print(f"{'figure':44} {'median':>8} {'min':>8} {'max':>8}  goal")
    for name, median, low, high, goal in rows:
        print(f"{name:44} {median:8.3f} {low:8.3f} {high:8.3f}  {goal}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
