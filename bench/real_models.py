"""The real upscale architectures through the product vs a bare onnxruntime session (DESIGN.md §5-6).

    .venv/bin/python bench/real_models.py [--models compact-x4,rrdb-x4plus] [--sizes 512x512,1080x1920]
                                          [--threads 2] [--folder ~/.cache/lean_image_ai/reference_models]

The models are the seeded exports of the upstream code that `tools/reference_models.py` writes
(its manifest names the files). For each model and input size, two fresh processes, one after
the other: the product (`upscale.run` on an HxWx3 uint8 array, auto tiles, deep-net policy) and
a bare `InferenceSession.run` (same threads, same model) over exactly the windows the product's
plan ran, on the already prepared float tensor. Each reports its wall and CPU seconds, peak RSS
(ru_maxrss, the process alone) and RSS before and after; the product also its tile plan (window,
overlap, seams, how the size was chosen) and what it kept after its release as a share of its
peak growth. The product's figure includes preparation, the measuring run (the first job on a
never-measured model), pasting and the release; the bare one is the runs alone. Prints a table,
then exactly one JSON line. RRDBNet at 1920x1080 takes most of an hour of 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_FOLDER = Path.home() / ".cache" / "lean_image_ai" / "reference_models"
RADIUS = {"rrdb-x4plus": 349, "compact-x4": 34}  # what the graph walk reads (issue 20)


def _image(height: int, width: int):
    import numpy as np

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:height, 0:width] / max(height, width)
    image = np.stack([0.5 + 0.3 * np.sin(6 * xx + c) * np.cos(4 * yy - c) for c in range(3)], axis=2)
    return (np.clip(image + rng.normal(0, 0.03, image.shape), 0, 1) * 255).astype(np.uint8)


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child_product(args) -> dict:
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import JobOptions
    from lean_image_ai.runtime import Runtime
    from lean_image_ai.runtime.core import RuntimeSettings

    image = _image(args.height, args.width)
    runtime = Runtime(settings=RuntimeSettings(intra_op_threads=args.threads))
    before, peak_before = _rss(), _peak()
    wall, cpu = time.perf_counter(), time.process_time()
    result = upscale.run(image, args.model, options=JobOptions(device="cpu", runtime=runtime), model_overlap=args.radius)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    (ram,) = runtime.last_job_memory["figures"]
    plans = runtime.events.recent("tile_plan")
    return {
        "seconds": wall, "cpu_seconds": cpu, "rss_before": before, "peak_before": peak_before, "peak": _peak(),
        "rss_after": _rss(), "grew": ram["grew"], "runtime_kept": ram["runtime_kept"], "results_held": ram["results"],
        "window": result.tile_size_used, "overlap": result.overlap, "feather": result.feather, "seams": result.seams,
        "tile_size": plans[-1]["tile_size"] if plans else None, "how": plans[-1]["how"] if plans else "",
    }


def child_bare(args) -> dict:
    import numpy as np
    import onnxruntime as ort
    from lean_image_ai.models.tiles.tiling import plan_tiles

    image = _image(args.height, args.width).astype(np.float32) / 255
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    tile, overlap = args.tile_size, args.overlap  # the product's auto windows: one shape (uniform)
    pair = tuple(tile if tile < side else side + 2 * overlap for side in (args.height, args.width))
    tiles = plan_tiles(args.height, args.width, pair, overlap, uniform=True)
    windows = [np.ascontiguousarray(image[t.wy0 : t.wy1, t.wx0 : t.wx1].transpose(2, 0, 1)[None]) for t in tiles]
    before = _rss()
    wall, cpu = time.perf_counter(), time.process_time()
    for window in windows:
        session.run(None, {session.get_inputs()[0].name: window})
    return {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu, "rss_before": before,
            "peak": _peak(), "windows": len(windows)}


def _child(kind: str, model: Path, height: int, width: int, args, extra=()) -> dict:
    command = [sys.executable, __file__, "--child", kind, "--model", str(model), "--height", str(height),
               "--width", str(width), "--threads", str(args.threads), *extra]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kind} child failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="compact-x4,rrdb-x4plus")
    parser.add_argument("--sizes", default="512x512,1080x1920")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER)
    parser.add_argument("--child", choices=("product", "bare"))
    parser.add_argument("--model")
    parser.add_argument("--height", type=int)
    parser.add_argument("--width", type=int)
    parser.add_argument("--radius", type=int)
    parser.add_argument("--tile-size", type=int)
    parser.add_argument("--overlap", type=int)
    args = parser.parse_args()
    if args.child:
        print(json.dumps((child_product if args.child == "product" else child_bare)(args)))
        return 0
    manifest = json.loads((args.folder / "manifest.json").read_text())["models"]
    rows = []
    print(f"{'model':<14} {'size':>10} {'window':>7} {'seams':<22} {'ratio':>6} {'cpu':>6} {'peak MB':>8} "
          f"{'bare MB':>8} {'kept %':>7}")
    for name in args.models.split(","):
        model = args.folder / manifest[name]["file"]
        for size in args.sizes.split(","):
            height, width = (int(v) for v in size.split("x"))
            radius = ["--radius", str(RADIUS[name])] if name in RADIUS else []
            product = _child("product", model, height, width, args, radius)
            tile = product["tile_size"] or max(height, width) + 2 * product["overlap"]
            bare = _child("bare", model, height, width, args, ["--tile-size", str(tile), "--overlap", str(product["overlap"])])
            grown = max(1, product["peak"] - product["rss_before"])
            row = {
                "model": name, "size": size, "window": product["window"], "overlap": product["overlap"],
                "seams": product["seams"], "how": product["how"], "windows": bare["windows"],
                "ratio": round(product["seconds"] / bare["seconds"], 3),
                "cpu_ratio": round(product["cpu_seconds"] / bare["cpu_seconds"], 3),
                "product_s": round(product["seconds"], 2), "bare_s": round(bare["seconds"], 2),
                "peak_mb": product["peak"] >> 20, "bare_peak_mb": bare["peak"] >> 20,
                "runtime_kept_mb": (product["runtime_kept"] or 0) >> 20, "results_held_mb": product["results_held"] >> 20,
                "kept_share_of_growth": round((product["runtime_kept"] or 0) / grown, 4),
            }
            rows.append(row)
            print(f"{name:<14} {size:>10} {row['window']:>7} {row['seams']:<22} {row['ratio']:>6} {row['cpu_ratio']:>6} "
                  f"{row['peak_mb']:>8} {row['bare_peak_mb']:>8} {100 * row['kept_share_of_growth']:>6.1f}%", flush=True)
    print(json.dumps({"bench": "real_models", "threads": args.threads, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
