"""VRAM kept after a job on a real CUDA GPU, release on vs off (NVML per-process used memory).

The prepared device check: run it on a machine with an NVIDIA GPU, onnxruntime-gpu and its
CUDA/cuDNN libraries (`pip install 'onnxruntime-gpu[cuda,cudnn]'`). Each configuration runs in its
own process, because a CUDA arena lives as long as its session. Ends with one JSON line; on a
machine without a usable GPU it says so in that line and exits 0.

    python bench/gpu_release.py [--size 2048] [--mid-channels 32]
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def measure(release: str, ending: str, size: int, mid: int) -> dict:
    """One configuration, in this process: NVML process memory after load, peak, after the job."""
    from lean_image_ai.runtime import OperationCancelled, Runtime, RuntimeSettings, mark_last
    from lean_image_ai.runtime.memory import gpu_snapshot
    from onnx_builders import conv_model

    runtime = Runtime(RuntimeSettings(release_memory=release == "on"))
    model = conv_model(Path(tempfile.mkdtemp()) / "conv.onnx", mid_channels=mid)
    handle = runtime.session(model, "cuda:0")
    if handle.providers[0] != "CUDAExecutionProvider":
        return {
            "gpu_available": False,
            "reason": handle.fallback_warning or f"session got {handle.providers}",
        }

    def used():
        snap = gpu_snapshot(0)
        return snap.get("process_used_bytes") or 0, snap

    with runtime.operation("warm-up") as op:
        op.run(handle, {"x": np.zeros((1, 3, 16, 16), np.float32)}, last=True)
    baseline, snap = used()
    frames = [np.random.default_rng(i).random((1, 3, size, size), dtype=np.float32) for i in range(3)]
    cancel = {"after_first": ending == "cancel", "flag": False}
    started = time.perf_counter()
    peak = baseline
    try:
        with runtime.operation("measured", cancel=lambda: cancel["flag"]) as op:
            for frame, last in mark_last(frames):
                op.run(handle, {"x": frame}, last=last)
                peak = max(peak, used()[0])
                cancel["flag"] = cancel["after_first"]
    except OperationCancelled:
        pass
    seconds = time.perf_counter() - started
    after, _ = used()
    return {
        "gpu_available": True,
        "gpu": snap.get("name"),
        "release": release,
        "ending": ending,
        "baseline_mb": round(baseline / 2**20, 1),
        "peak_over_baseline_mb": round((peak - baseline) / 2**20, 1),
        "kept_over_baseline_mb": round((after - baseline) / 2**20, 1),
        "sessions_cached": len(runtime.cached_sessions()),
        "seconds": round(seconds, 3),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=2, metavar=("RELEASE", "ENDING"))
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--mid-channels", type=int, default=32)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args.size, args.mid_channels)))
        return
    results = {}
    for release, ending in (("off", "success"), ("on", "success"), ("off", "cancel"), ("on", "cancel")):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                release,
                ending,
                "--size",
                str(args.size),
                "--mid-channels",
                str(args.mid_channels),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            print(json.dumps({"gpu_available": None, "error": proc.stderr.strip().splitlines()[-1:]}))
            return
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if not result["gpu_available"]:
            print(json.dumps(result))
            return
        results[f"{release}_{ending}"] = result
        print(
            f"release {release:3s} {ending:8s}: peak +{result['peak_over_baseline_mb']} MiB, "
            f"kept +{result['kept_over_baseline_mb']} MiB, {result['seconds']} s"
        )
    figures = {"gpu_available": True, "gpu": results["on_success"]["gpu"]}
    for key, result in results.items():
        figures[f"vram_kept_mb_release_{key}"] = result["kept_over_baseline_mb"]
        figures[f"vram_peak_mb_release_{key}"] = result["peak_over_baseline_mb"]
    peak = results["off_success"]["peak_over_baseline_mb"] or 1
    figures["kept_ratio_release_on"] = round(results["on_success"]["kept_over_baseline_mb"] / peak, 4)
    figures["kept_ratio_release_off"] = round(results["off_success"]["kept_over_baseline_mb"] / peak, 4)
    figures["time_ratio_on_vs_off"] = round(
        results["on_success"]["seconds"] / results["off_success"]["seconds"], 3
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
