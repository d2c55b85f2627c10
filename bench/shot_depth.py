"""Shot-consistent depth on the generated test shot (tests/builders_shot.py), side by side in one run:

- flicker of a still background in 16-bit PNGs: per-frame range vs one range for the shot
  (largest grey-level spread of a background pixel over the shot, of 65535);
- frame-to-frame change of the background in raw depth under per-frame scale/shift drift: as the
  model gave it vs aligned (--align-depth); the ratio is the factor the test asserts with margin;
- memory of the two-pass mode: the command line (`depth --depth-range auto-shot`) on 50 and on
  200 frames, each in a fresh process; peak RSS from its JSON line (both passes);
- with ``--strip FILE``: a before/after picture, frames side by side, per-frame range on top, the
  shot range below.

Ends with one JSON line.

    .venv/bin/python bench/shot_depth.py [--strip docs/shot-depth-strip.png] [--size 224x336]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from builders_shot import SIZE, background_mask, drifting_depth_model, shot_frame  # noqa: E402


def _grey16(depth: np.ndarray, low: float, high: float) -> np.ndarray:
    return (np.clip((depth - low) / (high - low), 0.0, 1.0) * 65535.0 + 0.5).astype(np.int64)


def flicker_and_alignment(model: Path, count: int = 24) -> dict:
    from lean_image_ai.models.adapters import da3, shot_depth

    background = background_mask(count)
    steady = [r.depth for r in da3.run([shot_frame(i, count, noise=False) for i in range(count)], model, process_res=84)]
    per_frame = [_grey16(d, float(d.min()), float(d.max())) for d in steady]
    shot = shot_depth.ShotDepth(shot_depth.DepthRangeChoice(shot_depth.AUTO_SHOT))
    for depth in steady:
        shot.record(depth)
    low, high = shot.finish_first_pass()
    one_range = [_grey16(d, low, high) for d in steady]

    def spread(frames):
        return int(np.ptp([f[background] for f in frames], axis=0).max())

    drifting = [r.depth for r in da3.run([shot_frame(i, count) for i in range(count)], model, process_res=84)]
    aligner = shot_depth.DepthAligner()
    aligned = [aligner(d)[0] for d in drifting]

    def change(frames):
        return float(np.mean([np.abs(frames[i][background] - frames[i - 1][background]).mean() for i in range(1, count)]))

    return {
        "frames": count,
        "grey_spread_per_frame": spread(per_frame),
        "grey_spread_shot": spread(one_range),
        "background_change_raw": change(drifting),
        "background_change_aligned": change(aligned),
        "align_factor": change(drifting) / change(aligned),
        "steady": steady,
        "shot_range": (low, high),
    }


def two_pass_memory(model: Path, count: int, size: tuple[int, int]) -> dict:
    """The command line's two-pass mode over ``count`` frames in a fresh process."""
    from PIL import Image

    with tempfile.TemporaryDirectory() as folder:
        shot = Path(folder) / "in"
        shot.mkdir()
        for index in range(count):
            Image.fromarray(shot_frame(index, count, size=size)).save(shot / f"s_{index + 1:04d}.png", compress_level=1)
        command = [sys.executable, "-m", "lean_image_ai", "depth", str(shot), str(Path(folder) / "out" / "d_####.png")]
        command += ["--model", str(model), "--device", "cpu", "--depth-range", "auto-shot", "--align-depth"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(done.stderr)
        summary = json.loads(done.stdout.strip().splitlines()[-1])
    memory = summary["memory"]
    return {"frames": count, "written": summary["written"], "rss_peak_mb": round(memory["process_rss_peak"] / 2**20, 1),
            "rss_before_mb": round(memory["rss_before"] / 2**20, 1), "seconds": summary["seconds"]}


def write_strip(path: Path, steady: list, shot_range, columns: int = 6, zoom: int = 2) -> None:
    from PIL import Image, ImageDraw

    picks = np.linspace(0, len(steady) - 1, columns).round().astype(int)
    rows = []
    for label, ranges in (("per-frame range", [(float(steady[i].min()), float(steady[i].max())) for i in picks]),
                          ("one range for the shot (auto-shot)", [shot_range] * columns)):
        tiles = [np.clip((steady[i] - lo) / (hi - lo), 0, 1) for i, (lo, hi) in zip(picks, ranges, strict=True)]
        rows.append((label, np.concatenate([np.pad(t, 2, constant_values=1.0) for t in tiles], axis=1)))
    height = rows[0][1].shape[0] * zoom
    width = rows[0][1].shape[1] * zoom
    canvas = Image.new("L", (width, 2 * (height + 16)), 255)
    draw = ImageDraw.Draw(canvas)
    for index, (label, row) in enumerate(rows):
        top = index * (height + 16)
        draw.text((4, top + 2), label, fill=0)
        tile = Image.fromarray((row * 255 + 0.5).astype(np.uint8)).resize((width, height), Image.NEAREST)
        canvas.paste(tile, (0, top + 16))
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strip", type=Path, help="write the before/after strip PNG here")
    parser.add_argument("--size", default="224x336", help="frame HxW for the memory runs")
    parser.add_argument("--counts", default="50,200", help="shot lengths for the memory runs")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as folder:
        model = drifting_depth_model(Path(folder) / "drift.onnx")
        quality = flicker_and_alignment(model)
        print(f"still background, 16-bit grey spread over {quality['frames']} frames (of 65535): "
              f"per-frame {quality['grey_spread_per_frame']}, auto-shot {quality['grey_spread_shot']}")
        print(f"background frame-to-frame change (depth units): raw {quality['background_change_raw']:.4g}, "
              f"aligned {quality['background_change_aligned']:.4g}, factor {quality['align_factor']:.1f}x")
        if args.strip:
            write_strip(args.strip, quality["steady"], quality["shot_range"])
            print(f"strip: {args.strip} (frames {SIZE[1]}x{SIZE[0]}, per-frame on top, shot range below)")
        memory = []
        for count in (int(c) for c in args.counts.split(",")):
            memory.append(two_pass_memory(model, count, size))
            m = memory[-1]
            print(f"two-pass (auto-shot + align) {count} frames {size[1]}x{size[0]}: peak RSS {m['rss_peak_mb']} MB "
                  f"(process start {m['rss_before_mb']} MB), {m['seconds']} s")
    frame_mb = size[0] * size[1] * 4 / 2**20
    result = {k: v for k, v in quality.items() if k not in ("steady", "shot_range")}
    result["two_pass"] = memory
    result["depth_frame_mb"] = round(frame_mb, 3)
    if len(memory) == 2:
        result["peak_ratio"] = round(memory[1]["rss_peak_mb"] / memory[0]["rss_peak_mb"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
