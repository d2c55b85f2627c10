"""The Ray farm runner's throughput: 1 vs 2 workers, and its per-frame cost against the plain CLI.

Same PNG sequence, same model, measured side by side in one run on a local Ray instance
(loopback only, 2 CPUs), each case repeated and alternated so that drift hits all alike:
- cli: `python -m lean_image_ai upscale ...`'s main() in this process, its runtime at one
  intra-op thread (what each farm worker gets);
- farm 1 / farm 2: `python -m lean_image_ai farm upscale ... --workers 1|2` (one intra-op
  thread per worker, as the farm runs by default).

Frames/s is the steady rate: frames after the first over the time from the first frame written
to the last (from the CLI's `wrote:` lines and the farm's frame events), so process and actor
start-up and the model load, paid once per run or worker, are left out; the end-to-end seconds
(from the JSON lines) are printed beside it. Ratios: farm 2 over farm 1 frames/s (the scaling;
goal >= 1.6 on 2 cores) and farm 1 over cli seconds per frame (the Ray path's per-frame overhead;
goal <= 1.10). Prints a table and ends with one JSON line.

    .venv/bin/pip install -e '.[dev,farm]'
    .venv/bin/python bench/farm.py [--frames 24] [--size 160] [--mid-channels 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def make_plate(folder: Path, count: int, size: int) -> str:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for n in range(1, count + 1):
        rng = np.random.default_rng(n)
        Image.fromarray((rng.random((size, size, 3)) * 255).astype(np.uint8)).save(folder / f"plate_{n:04d}.png")
    return str(folder / "plate_####.png")


class _Stamped(io.TextIOBase):
    """stdout that notes when each `wrote:` line of the CLI arrives."""

    def __init__(self):
        self.times, self.text = [], []

    def write(self, text: str) -> int:
        if text.startswith("wrote: "):
            self.times.append(time.perf_counter())
        self.text.append(text)
        return len(text)


def steady_rate(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0])


def run_cli(pattern: str, model: Path, out: Path) -> tuple[float, float]:
    from lean_image_ai.ui.cli import main as cli

    stamped = _Stamped()
    with contextlib.redirect_stdout(stamped):
        code = cli.main(["upscale", pattern, str(out) + "/", "--model", str(model), "--device", "cpu", "--overwrite"])
    assert code == 0, "".join(stamped.text)
    line = json.loads("".join(stamped.text).strip().splitlines()[-1])
    return steady_rate(stamped.times), line["seconds"]


def run_farm(pattern: str, model: Path, out: Path, workers: int) -> tuple[float, float]:
    from lean_image_ai.ui.cli import farm_ray
    from lean_image_ai.ui.cli import main as cli

    times = []

    def on_event(event):
        if event["event"] == "frame":
            times.append(time.perf_counter())

    argv = ["farm", "upscale", pattern, str(out) + "/", "--model", str(model), "--device", "cpu", "--overwrite"]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        code = farm_ray.run(cli.build_parser().parse_args([*argv, "--workers", str(workers)]), on_event=on_event)
    line = json.loads(stdout.getvalue().strip().splitlines()[-1])
    assert code == 0 and line["written"] == len(times), line
    return steady_rate(sorted(times)), line["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--mid-channels", type=int, default=64, help="model width: its run time against the file I/O")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    # Ray decides its node address when imported: loopback, so nothing listens beyond 127.0.0.1
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from lean_image_ai.runtime import get_runtime
    from onnx_builders import sr_model

    get_runtime().configure(intra_op_threads=1)  # the CLI case: one thread, like each farm worker
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = {"cli": [], "farm_1": [], "farm_2": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            model = sr_model(tmp / "sr.onnx", scale=2, mid_channels=args.mid_channels)
            pattern = make_plate(tmp / "in", args.frames, args.size)
            for _ in range(args.repeats):  # alternated: drift on this shared machine hits every case
                rows["cli"].append(run_cli(pattern, model, _fresh(tmp / "cli")))
                rows["farm_1"].append(run_farm(pattern, model, _fresh(tmp / "f1"), 1))
                rows["farm_2"].append(run_farm(pattern, model, _fresh(tmp / "f2"), 2))
    finally:
        ray.shutdown()
    rate = {case: statistics.median(r for r, _ in runs) for case, runs in rows.items()}
    wall = {case: statistics.median(s for _, s in runs) for case, runs in rows.items()}
    # each ratio from one alternated round, so the load of the moment hits both sides of it
    scalings = [f2[0] / f1[0] for f1, f2 in zip(rows["farm_1"], rows["farm_2"], strict=True)]
    overheads = [c[0] / f1[0] for c, f1 in zip(rows["cli"], rows["farm_1"], strict=True)]
    scaling, overhead = statistics.median(scalings), statistics.median(overheads)
    print(f"{'case':<8} {'frames/s (steady)':>18} {'s/frame':>8} {'end-to-end s':>13}")
    for case in rows:
        print(f"{case:<8} {rate[case]:18.2f} {1 / rate[case]:8.3f} {wall[case]:13.2f}")
    print(f"(median of {args.repeats} alternated runs; {args.frames} frames of {args.size} px)")
    print(f"scaling, farm 2 workers over 1: {scaling:.2f}x (goal >= 1.6; rounds {_spread(scalings)})")
    print(f"per-frame cost, farm 1 worker over the plain CLI: {overhead:.2f}x (goal <= 1.10; rounds {_spread(overheads)})")
    print(
        json.dumps(
            {
                "bench": "farm",
                "frames": args.frames,
                "size": args.size,
                "mid_channels": args.mid_channels,
                "repeats": args.repeats,
                "frames_per_s": {case: round(value, 3) for case, value in rate.items()},
                "end_to_end_s": {case: round(value, 3) for case, value in wall.items()},
                "scaling_2_over_1": round(scaling, 3),
                "farm_1_over_cli_per_frame": round(overhead, 3),
                "rounds": {"scaling": [round(v, 3) for v in scalings], "per_frame": [round(v, 3) for v in overheads]},
            }
        )
    )


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f} to {max(values):.2f}"


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


if __name__ == "__main__":
    main()
