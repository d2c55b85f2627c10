"""Tiling benchmark, side by side in one run (ratios, not absolute times).

    .venv/bin/python bench/tiling.py

(a) throughput of a tiled upscale vs the untiled one, same model, same image (goal >= 0.85);
(b) peak RSS of untiled vs auto-tiled upscales at two image sizes, each in its own process
    (the kernel's peak mark VmHWM, reset after warm-up; ru_maxrss where there is none): untiled
    grows with the image, auto-tiled is bounded by the tile;
(c) pre/post-processing cost per megapixel (prepare_image, tile cut, to_nchw, from_nchw, paste)
    against a plain numpy copy of the same float32 data.

Prints a table, then exactly one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

MiB = 1 << 20
THROUGHPUT_SIZE = 1024
THROUGHPUT_TILE = 512
PEAK_SIZES = (1024, 2048)
PEAK_BUDGET = 256 * MiB  # given to tile_size="auto", so the result does not depend on this machine's RAM
PLUMBING_SIZE = 2048
OVERLAP = 16


def _model(folder: Path, mid_channels: int) -> Path:
    from onnx_builders import sr_model

    return sr_model(folder / f"sr_x2_{mid_channels}.onnx", scale=2, mid_channels=mid_channels, seed=0)


def _image(size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((size, size, 3), dtype=np.float32)


# ---- (a) ------------------------------------------------------------------------------------------


def throughput(model: Path, repeats: int = 3) -> dict:
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions
    from lean_image_ai.runtime import Runtime

    runtime = Runtime()
    options = RunOptions(device="cpu", runtime=runtime)
    image = _image(THROUGHPUT_SIZE)
    upscale.run(_image(64), model, options=options, tile_size=None)  # session + kernels warmed up
    best = {"untiled": float("inf"), "tiled": float("inf")}
    tiles = {"untiled": None, "tiled": THROUGHPUT_TILE}
    for _ in range(repeats):  # interleaved, so drifting machine load hits both alike
        for name, tile in tiles.items():
            started = time.perf_counter()
            upscale.run(image, model, options=options, tile_size=tile, overlap=OVERLAP)
            best[name] = min(best[name], time.perf_counter() - started)
    runtime.clear("bench")
    megapixels = THROUGHPUT_SIZE * THROUGHPUT_SIZE / 1e6
    return {
        "untiled_s": best["untiled"],
        "tiled_s": best["tiled"],
        "untiled_mp_per_s": megapixels / best["untiled"],
        "tiled_mp_per_s": megapixels / best["tiled"],
        "ratio": best["untiled"] / best["tiled"],
    }


# ---- (b) ------------------------------------------------------------------------------------------


def child_peak(model: str, size: int, mode: str) -> dict:
    """One upscale in this (fresh) process; RSS figures relative to the post-warm-up baseline."""
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions
    from lean_image_ai.runtime import Runtime
    from lean_image_ai.runtime.measure.memory import peak_rss_bytes, process_rss_bytes, reset_peak_rss

    runtime = Runtime()
    options = RunOptions(device="cpu", runtime=runtime)
    image = (_image(size) * 255).astype(np.uint8)  # what a file gives; float copies are the job's own
    upscale.run(image[:32, :32], model, options=options, tile_size=None)  # session, arena, kernels
    baseline = process_rss_bytes()
    peak_source = "VmHWM" if reset_peak_rss() else "ru_maxrss"
    started = time.perf_counter()
    if mode == "untiled":
        result = upscale.run(image, model, options=options, tile_size=None, overlap=OVERLAP)
    else:
        result = upscale.run(
            image, model, options=options, tile_size="auto", overlap=OVERLAP, memory_budget_bytes=PEAK_BUDGET
        )
    seconds = time.perf_counter() - started
    peak = peak_rss_bytes()
    output_bytes = result.image.nbytes
    input_bytes = size * size * 3 * 4  # the float32 copy every job makes of its input (prepare_image)
    return {
        "mode": mode,
        "size": size,
        "tile": result.tile_size_used,
        "seconds": seconds,
        "peak_rss_mb": peak / MiB,
        "peak_over_baseline_mb": (peak - baseline) / MiB,
        # beyond the two image-sized buffers every job holds (float input copy, the result):
        # the inference working memory, the part tiling bounds
        "working_mb": (peak - baseline - output_bytes - input_bytes) / MiB,
        "output_mb": output_bytes / MiB,
        "peak_source": peak_source,
    }


def peaks(model: Path) -> dict:
    figures = {}
    for mode in ("untiled", "auto"):
        for size in PEAK_SIZES:
            done = subprocess.run(
                [sys.executable, __file__, "--child", str(model), str(size), mode],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"peak child {mode} {size} failed:\n{done.stderr[-2000:]}")
            figures[(mode, size)] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


# ---- (c) ------------------------------------------------------------------------------------------


def plumbing(repeats: int = 3) -> dict:
    from lean_image_ai.models.imaging import from_nchw, prepare_image, to_nchw
    from lean_image_ai.models.tiles.tile_plan import TilePlan
    from lean_image_ai.models.tiles.tiling import TiledRun, run_tiled

    source = (_image(PLUMBING_SIZE) * 255).astype(np.uint8)

    def identity(window, last):  # the model's place: only the tensor conversions around it
        return from_nchw(to_nchw(window))

    def pipeline():
        prepared = prepare_image(source)
        return run_tiled(prepared.rgb, TiledRun(identity, TilePlan(THROUGHPUT_TILE, OVERLAP), scale=1)).image

    as_float = prepare_image(source).rgb
    assert np.array_equal(pipeline(), as_float)  # the plumbing alone changes nothing
    best_pipeline = best_copy = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        pipeline()
        best_pipeline = min(best_pipeline, time.perf_counter() - started)
        started = time.perf_counter()
        np.copy(as_float)
        best_copy = min(best_copy, time.perf_counter() - started)
    megapixels = PLUMBING_SIZE * PLUMBING_SIZE / 1e6
    return {
        "pipeline_ms_per_mp": 1000 * best_pipeline / megapixels,
        "copy_ms_per_mp": 1000 * best_copy / megapixels,
        "ratio": best_pipeline / best_copy,
    }


# ---- report ---------------------------------------------------------------------------------------


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "SIZE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        model, size, mode = args.child
        figures = child_peak(model, int(size), mode)
        print(json.dumps(figures))
        return figures

    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="bench-tiling-"))
    model = _model(folder, mid_channels=32)
    a = throughput(model)
    b = peaks(model)
    c = plumbing()

    print(f"(a) throughput, {THROUGHPUT_SIZE}x{THROUGHPUT_SIZE} x2, conv SR net (32 channels), CPU")
    print(f"    untiled (one window)        {a['untiled_s']:7.3f} s  {a['untiled_mp_per_s']:6.2f} MP/s")
    print(
        f"    tiled {THROUGHPUT_TILE} px, overlap {OVERLAP}   {a['tiled_s']:7.3f} s  {a['tiled_mp_per_s']:6.2f} MP/s"
    )
    print(f"    tiled / untiled throughput  {a['ratio']:.3f}  (goal >= 0.85)")
    print(f"(b) peak RSS per upscale, own process each; auto tiles from a {PEAK_BUDGET // MiB} MiB budget")
    print("    mode     image       tile   seconds  peak RSS  over baseline  working*")
    for (mode, size), f in b.items():
        print(
            f"    {mode:8} {size:4}x{size:<4}  {f['tile']:5}  {f['seconds']:7.2f}  {f['peak_rss_mb']:6.0f} MB"
            f"  {f['peak_over_baseline_mb']:8.0f} MB  {f['working_mb']:8.0f} MB"
        )
    small, large = PEAK_SIZES
    untiled_growth = b[("untiled", large)]["working_mb"] / max(b[("untiled", small)]["working_mb"], 1.0)
    tiled_growth = b[("auto", large)]["working_mb"] / max(b[("auto", small)]["working_mb"], 1.0)
    print("    * peak - baseline - result - float32 input copy: the inference working memory")
    print(
        f"    working memory growth for 4x the pixels: untiled {untiled_growth:.2f}x, auto-tiled {tiled_growth:.2f}x"
    )
    print(f"(c) pre/post-processing, {PLUMBING_SIZE}x{PLUMBING_SIZE} uint8 RGB, {THROUGHPUT_TILE} px tiles")
    print(f"    prepare + cut + to_nchw + from_nchw + paste  {c['pipeline_ms_per_mp']:7.2f} ms/MP")
    print(f"    plain numpy copy of the float32 image        {c['copy_ms_per_mp']:7.2f} ms/MP")
    print(f"    ratio                                        {c['ratio']:7.2f}x")
    figures = {
        "tiled_vs_untiled_throughput": round(a["ratio"], 3),
        "untiled_mp_per_s": round(a["untiled_mp_per_s"], 3),
        "tiled_mp_per_s": round(a["tiled_mp_per_s"], 3),
        "throughput_tile_px": THROUGHPUT_TILE,
        "auto_tile_px": b[("auto", large)]["tile"],
        "auto_tile_budget_mb": PEAK_BUDGET // MiB,
        "peak_rss_source": b[("auto", large)]["peak_source"],
    }
    for (mode, size), f in b.items():
        label = "untiled" if mode == "untiled" else "auto_tiled"
        figures[f"peak_rss_{label}_mb_{size}"] = round(f["peak_rss_mb"], 1)
        figures[f"working_mem_{label}_mb_{size}"] = round(f["working_mb"], 1)
    figures.update(
        {
            "working_mem_growth_untiled_4x_pixels": round(untiled_growth, 2),
            "working_mem_growth_auto_tiled_4x_pixels": round(tiled_growth, 2),
            "prepost_ms_per_mp": round(c["pipeline_ms_per_mp"], 2),
            "numpy_copy_ms_per_mp": round(c["copy_ms_per_mp"], 2),
            "prepost_vs_copy_ratio": round(c["ratio"], 2),
            "bench_seconds": round(time.perf_counter() - started, 1),
        }
    )
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
