"""MoGe-2 on a large frame: the export fed at the picture's size (the adapter's way since issue 42,
`moge2.at_source_size`: its outputs come at the picture's size, as MoGe's forward() gives them)
against fed at the heads' size (the way before: 16 px a token, the outputs resized here after
the export's normalisation). Peak RSS, wall and the difference between the two results.

    .venv/bin/python bench/moge2_feed_size.py [--size 2160x3840] [--threads 2] [--tokens 3600] [--repeat 1]

The seeded ViT-S export (tools/reference_models.py, `~/.cache/lean_image_ai/reference_models`)
on scikit-image's coffee enlarged to the frame (Pillow LANCZOS), a shot's focal given (seeded
weights give no camera the solver accepts). Each way runs in its own fresh process, one after the
other; peak RSS is the process's VmHWM (runtime/measure/memory.py) after the run, `grew` the
peak over the RSS before the run (the picture already decoded). Ends with one JSON line.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from reference_models import load_manifest, reference_dir  # noqa: E402

MOGE2_FOCAL_WIDTH = 0.8  # fx / width, as bench/real_models.py
HEAD_PIXELS_PER_TOKEN = 16  # the neck's four 2x upsamplings of the token grid


def _picture(height: int, width: int) -> np.ndarray:
    import skimage.data
    from PIL import Image

    return np.asarray(Image.fromarray(skimage.data.coffee()).resize((width, height), Image.LANCZOS))


def _at_heads_size(picture, encoder_size):
    """The feed before issue 42's change: the encoder's input's preimage at the heads' size."""
    from lean_image_ai.models.adapters.resampling import bilinear_preimage, torch_bilinear

    rows, cols = encoder_size[0] // 14, encoder_size[1] // 14
    encoder = torch_bilinear(picture, encoder_size, antialias=True)
    return bilinear_preimage(encoder, (HEAD_PIXELS_PER_TOKEN * rows, HEAD_PIXELS_PER_TOKEN * cols))


def child(args) -> None:
    from lean_image_ai.models.adapters import moge2
    from lean_image_ai.models.base import RunOptions
    from lean_image_ai.runtime import Runtime
    from lean_image_ai.runtime.core import RuntimeSettings
    from lean_image_ai.runtime.measure.memory import peak_rss_bytes, process_rss_bytes

    if args.way == "heads":
        moge2.at_source_size = _at_heads_size
    picture = _picture(args.height, args.width)
    runtime = Runtime(settings=RuntimeSettings(intra_op_threads=args.threads))
    before = process_rss_bytes()
    started = time.perf_counter()
    result = moge2.run(
        picture,
        args.model,
        options=RunOptions(device="cpu", runtime=runtime),
        num_tokens=args.tokens,
        focal_width=MOGE2_FOCAL_WIDTH,
    )
    wall = time.perf_counter() - started
    peak = peak_rss_bytes()
    np.savez(args.out, normal=result.normal, mask=result.mask, depth=result.depth)
    print(json.dumps({"peak": peak, "grew": peak - before, "wall_s": wall}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="2160x3840")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=3600)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--child", choices=("source", "heads"), dest="way")
    parser.add_argument("--model")
    parser.add_argument("--out")
    args = parser.parse_args()
    args.height, args.width = (int(v) for v in args.size.split("x"))
    if args.way:
        child(args)
        return
    folder = reference_dir()
    model = folder / load_manifest(folder)["models"]["moge2-vits"]["file"]
    rows, results = {}, {}
    with tempfile.TemporaryDirectory() as work:
        for attempt in range(args.repeat):  # alternated; the fastest wall and the highest peak kept
            for way in ("source", "heads") if attempt % 2 == 0 else ("heads", "source"):
                out = Path(work) / f"{way}.npz"
                command = [sys.executable, __file__, "--child", way, "--model", str(model), "--out", str(out)]
                command += ["--size", args.size, "--threads", str(args.threads), "--tokens", str(args.tokens)]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
                kept = rows.setdefault(way, row)
                kept.update(
                    peak=max(kept["peak"], row["peak"]),
                    grew=max(kept["grew"], row["grew"]),
                    wall_s=min(kept["wall_s"], row["wall_s"]),
                )
                with np.load(out) as saved:
                    results[way] = {k: saved[k] for k in saved.files}
    source, heads = results["source"], results["heads"]
    both = source["mask"] & heads["mask"]
    cosine = np.clip((source["normal"][both] * heads["normal"][both]).sum(-1), -1.0, 1.0)
    angles = np.degrees(np.arccos(cosine))
    union = max(int((source["mask"] | heads["mask"]).sum()), 1)
    summary = {
        "size": args.size,
        "tokens": args.tokens,
        "threads": args.threads,
        "repeat": args.repeat,
        "peak_mib": {w: round(r["peak"] / 2**20) for w, r in rows.items()},
        "grew_mib": {w: round(r["grew"] / 2**20) for w, r in rows.items()},
        "wall_s": {w: round(r["wall_s"], 2) for w, r in rows.items()},
        "peak_ratio": round(rows["source"]["peak"] / rows["heads"]["peak"], 3),
        "grew_ratio": round(rows["source"]["grew"] / rows["heads"]["grew"], 3),
        "normals_deg_mean_between": round(float(angles.mean()), 3),
        "mask_iou_between": round(int(both.sum()) / union, 4),
    }
    for way, row in rows.items():
        print(f"{way:>6}: peak {row['peak'] / 2**20:7.0f} MiB, grew {row['grew'] / 2**20:7.0f} MiB, {row['wall_s']:.1f} s")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
