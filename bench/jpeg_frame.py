"""A Process Sequence frame saved as .jpg: the add-on's numpy encoder (models/file_bytes/jpeg.py,
pumped as the job pumps it: 0.05 s budgets) against Blender's writer (operators/results.py
save_product, one call), side by side in one run (issue #37 item 3).

    .venv/bin/python bench/jpeg_frame.py [--width 3840 --height 2160] [--runs 3]

The picture: smooth gradients with grain (what an upscaler gives). Prints each run, then exactly one
JSON line: medians of the encoder's total time and of Blender's call, the encoder's longest call and
the most CPU time one took, over all runs (CPU time of the process: numpy's BLAS may use threads of
its own; on a loaded machine a long wall time with a short CPU time waited for a core), the file
sizes and whether both files decode to the same pixels.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

BUDGET = 0.05  # what the modal job gives a timer call (operators/job_operator.py)


def _picture(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([x / width, y / height, 0.5 + 0.4 * np.sin((x + y) / 97)], axis=-1)
    rgb += np.random.default_rng(0).normal(0, 0.02, rgb.shape).astype(np.float32)
    return np.clip(rgb, 0, 1).astype(np.float32)


def _ours(pixels: np.ndarray):
    from lean_image_ai.models.file_bytes import JpegFile
    from lean_image_ai.operators import image_io

    made = JpegFile(*pixels.shape[:2], lambda start, stop: image_io.to_rgba(pixels[start:stop]))
    calls = []
    started, started_cpu = time.perf_counter(), time.process_time()
    while True:
        wall, cpu = time.perf_counter(), time.process_time()
        done = made.pump(BUDGET)
        calls.append((time.perf_counter() - wall, time.process_time() - cpu))
        if done:
            break
    return made.data, time.perf_counter() - started, time.process_time() - started_cpu, calls


def _blenders(pixels: np.ndarray, folder: Path):
    from lean_image_ai.models.result_images import ImageProduct
    from lean_image_ai.operators import results

    path = folder / "blender.jpg"
    wall, cpu = time.perf_counter(), time.process_time()
    results.save_product(path, ImageProduct(pixels, is_data=False))
    return path.read_bytes(), time.perf_counter() - wall, time.process_time() - cpu


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=3840)
    parser.add_argument("--height", type=int, default=2160)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    import blender_helpers as bh
    import bpy  # noqa: F401  (Blender's writer)

    bh.import_package()
    from PIL import Image

    pixels = _picture(args.height, args.width)
    totals, total_cpus, blender_walls, blender_cpus, longest, longest_cpu, calls = [], [], [], [], 0.0, 0.0, 0
    with tempfile.TemporaryDirectory() as folder:
        for run in range(args.runs):
            ours, total, total_cpu, per_call = _ours(pixels)
            theirs, blender_wall, blender_cpu = _blenders(pixels, Path(folder))
            totals.append(total)
            total_cpus.append(total_cpu)
            blender_walls.append(blender_wall)
            blender_cpus.append(blender_cpu)
            run_longest, run_most_cpu = max(wall for wall, _ in per_call), max(cpu for _, cpu in per_call)
            longest, longest_cpu, calls = max(longest, run_longest), max(longest_cpu, run_most_cpu), len(per_call)
            print(f"run {run + 1}: ours {total:.3f} s (CPU {total_cpu:.3f} s) in {len(per_call)} calls, longest {run_longest:.3f} s "
                  f"(the most CPU in a call {run_most_cpu:.3f} s), {len(ours)} bytes; Blender's writer one call {blender_wall:.3f} s "
                  f"(CPU {blender_cpu:.3f} s), {len(theirs)} bytes")
        same = np.array_equal(np.asarray(Image.open(io.BytesIO(ours))), np.asarray(Image.open(io.BytesIO(theirs))))
    figures = {
        "size": f"{args.width}x{args.height}",
        "ours_total_s": round(statistics.median(totals), 3),
        "ours_total_cpu_s": round(statistics.median(total_cpus), 3),
        "ours_longest_call_s": round(longest, 3),
        "ours_most_cpu_in_a_call_s": round(longest_cpu, 3),
        "ours_calls": calls,
        "blender_writer_call_s": round(statistics.median(blender_walls), 3),
        "blender_writer_call_cpu_s": round(statistics.median(blender_cpus), 3),
        "cpu_ratio_ours_to_blender": round(statistics.median(total_cpus) / statistics.median(blender_cpus), 2),
        "bytes_ours": len(ours),
        "bytes_blender": len(theirs),
        "same_decoded_pixels": bool(same),
    }
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
