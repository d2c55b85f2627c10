"""The product's default upscale plan against its peers, on trained weights, interleaved in one run.

    .venv/bin/python bench/upscale_peers.py                        # small sizes: a few minutes here
    .venv/bin/python bench/upscale_peers.py --size 540x960          # 960x540 (x4plus: ~10 min per pass here)
    .venv/bin/python bench/upscale_peers.py --size 1080x1920 --only realesrgan-x4plus

Models: Real-ESRGAN's trained x4plus (RRDBNet) and compact x4 (realesr-animevideov3-x4), converted
from the official ncnn files by tools/ncnn_to_onnx.py (tests/trained_weights.py fetches and caches
them). Image: tests/trained_weights.py's natural-looking one (no photo data set ships here; its 1/f
spectrum, objects and grain make a trained net reach as it does on a photo).

Per model, in rounds (each round runs every variant once, in turn, so the load of a shared machine
falls on all alike), each variant in a fresh subprocess on the same threads:
- product: `upscale.run` with the default plan (for x4plus: staged, models/tiles/stages.py),
- ort: one bare onnxruntime whole-image run (the reference every seam is measured against),
- official: Real-ESRGAN's own tiler (inference_realesrgan.py's `tile_process`: tiles of
  --official-tile px (default 128) from the top-left, 10 px of pad each side clipped to the image, the pad
  cropped away) on a bare onnxruntime session,
- ncnn: ncnn's CPU runtime (the `ncnn` wheel) on the original .param/.bin, one whole-image run
  (fp32 throughout, as the ONNX graph computes).
Wall time is the job's (model load included, as a user waits for it), best of the rounds; peak RSS
is the subprocess's high-water mark; compute is window pixels over image pixels (the product's is
its plan's, each stage weighted by its share of the multiply-adds); seams are |variant - ort| in
8-bit levels after rounding (max), and in float levels (p99.9 and max). Prints a table and ends
with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from trained_weights import ANIME_X4, X4PLUS, converter, natural_image, trained_model  # noqa: E402

SIZES = {X4PLUS: (120, 160), ANIME_X4: (240, 320)}  # small: a few minutes on a shared 2-core machine
VARIANTS = ("product", "ort", "official", "ncnn")
OFFICIAL_PAD = 10


def _session(model: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def _nchw(image: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(image.transpose(2, 0, 1))[None]


def run_ort(model: Path, image: np.ndarray, threads: int) -> tuple[np.ndarray, float]:
    session = _session(model, threads)
    out = session.run(None, {session.get_inputs()[0].name: _nchw(image)})[0][0]
    return out.transpose(1, 2, 0), 1.0


def run_official(model: Path, image: np.ndarray, threads: int, tile: int) -> tuple[np.ndarray, float]:
    """Real-ESRGAN's `tile_process`: tiles from the top-left, each padded by OFFICIAL_PAD (clipped
    to the image), run, and the pad cropped from the output."""
    session = _session(model, threads)
    name = session.get_inputs()[0].name
    height, width = image.shape[:2]
    output, window_pixels = None, 0
    for y0 in range(0, height, tile):
        for x0 in range(0, width, tile):
            y1, x1 = min(y0 + tile, height), min(x0 + tile, width)
            py0, px0 = max(y0 - OFFICIAL_PAD, 0), max(x0 - OFFICIAL_PAD, 0)
            py1, px1 = min(y1 + OFFICIAL_PAD, height), min(x1 + OFFICIAL_PAD, width)
            window_pixels += (py1 - py0) * (px1 - px0)
            out = session.run(None, {name: _nchw(image[py0:py1, px0:px1])})[0][0].transpose(1, 2, 0)
            scale = out.shape[0] // (py1 - py0)
            if output is None:
                output = np.empty((height * scale, width * scale, 3), np.float32)
            oy, ox = (y0 - py0) * scale, (x0 - px0) * scale
            output[y0 * scale : y1 * scale, x0 * scale : x1 * scale] = out[
                oy : oy + (y1 - y0) * scale, ox : ox + (x1 - x0) * scale
            ]
    return output, window_pixels / float(height * width)


def run_ncnn(name: str, image: np.ndarray, threads: int) -> tuple[np.ndarray, float]:
    import ncnn

    folder = converter().ncnn_dir()
    net = ncnn.Net()
    net.opt.use_vulkan_compute = False
    net.opt.num_threads = threads
    net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
    net.opt.use_bf16_storage = False
    net.load_param(str(folder / f"{name}.param"))
    net.load_model(str(folder / f"{name}.bin"))
    planes = np.ascontiguousarray(image.transpose(2, 0, 1))  # kept alive: the Mat shares its memory
    extractor = net.create_extractor()
    extractor.input("data", ncnn.Mat(planes))
    _, out = extractor.extract("output")
    return np.array(out).transpose(1, 2, 0).copy(), 1.0


def run_product(model: Path, image: np.ndarray, threads: int) -> tuple[np.ndarray, float, dict]:
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions
    from lean_image_ai.runtime import Runtime
    from lean_image_ai.runtime.settings import RuntimeSettings

    runtime = Runtime(RuntimeSettings(intra_op_threads=threads))
    result = upscale.run(image, model, options=RunOptions(device="cpu", runtime=runtime))
    plan = dict(result.plan or {}, seams=result.seams)
    return result.image, float(result.plan["compute"]), plan


def child(args) -> None:
    """One variant in this fresh process: its output to --out, its figures as one JSON line."""
    size = tuple(int(v) for v in args.child_size.split("x"))
    image = natural_image(*size, seed=5)
    model = trained_model(args.only[0])
    started = time.perf_counter()
    plan = {}
    if args.child == "product":
        out, compute, plan = run_product(model, image, args.threads)
    elif args.child == "ort":
        out, compute = run_ort(model, image, args.threads)
    elif args.child == "official":
        out, compute = run_official(model, image, args.threads, args.official_tile)
    else:
        out, compute = run_ncnn(args.only[0], image, args.threads)
    seconds = time.perf_counter() - started
    np.save(args.out, np.asarray(out, np.float32))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    print(json.dumps({"seconds": seconds, "compute": compute, "peak_rss": peak, "plan": plan}))


def _spawn(variant: str, name: str, size, args, out: Path) -> dict:
    command = [
        sys.executable, __file__, "--child", variant, "--only", name, "--child-size", f"{size[0]}x{size[1]}",
        "--threads", str(args.threads), "--official-tile", str(args.official_tile), "--out", str(out),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"{variant} on {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def seams(out: np.ndarray, reference: np.ndarray) -> dict:
    """Against the whole-image run, both clipped to [0, 1] (the product clips what it writes; a bare
    run leaves ringing past the range, which is no seam)."""
    out, reference = np.clip(out, 0.0, 1.0).astype(np.float64), np.clip(reference, 0.0, 1.0).astype(np.float64)
    levels = np.abs(out - reference) * 255.0
    eight = np.abs(np.round(out * 255).astype(int) - np.round(reference * 255).astype(int))
    return {"max": int(eight.max()), "p99_9": float(np.percentile(levels, 99.9)), "float_max": float(levels.max())}


def bench_model(name: str, size, args, scratch: Path) -> list[dict]:
    best: dict[str, dict] = {}
    for _round in range(args.rounds):
        for variant in VARIANTS:
            figures = _spawn(variant, name, size, args, scratch / f"{name}.{variant}.npy")
            if variant not in best or figures["seconds"] < best[variant]["seconds"]:
                best[variant] = figures
    reference = np.load(scratch / f"{name}.ort.npy")
    rows = []
    for variant in VARIANTS:
        figures = best[variant]
        row = {"model": name, "size": list(size), "variant": variant, "seconds": round(figures["seconds"], 2),
               "compute": round(figures["compute"], 3), "peak_rss_mb": round(figures["peak_rss"] / 2**20),
               **seams(np.load(scratch / f"{name}.{variant}.npy"), reference)}  # fmt: skip
        if figures["plan"]:
            row["plan"] = figures["plan"]
        rows.append(row)
    ort_s = best["ort"]["seconds"]
    for row in rows:
        row["t_over_ort"] = round(row["seconds"] / ort_s, 3)
    product = best["product"]["seconds"]
    rows[0]["over_official"] = round(product / best["official"]["seconds"], 3)
    rows[0]["over_ncnn"] = round(product / best["ncnn"]["seconds"], 3)
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=[X4PLUS, ANIME_X4], choices=[X4PLUS, ANIME_X4])
    parser.add_argument("--size", help="HxW for every model (default: per model, small)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--official-tile", type=int, default=128,
        help="the official tiler's tile (its --tile; default 128: the default sizes are cut in 2-6 tiles)",
    )  # fmt: skip
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--child-size", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return []
    rows = []
    with tempfile.TemporaryDirectory(prefix="upscale_peers_") as scratch:
        # the stage files and reach record go to a scratch models folder (and are made before timing:
        # a user's second job finds them there)
        os.environ.setdefault("LEAN_IMAGE_AI_MODELS_DIR", str(Path(scratch) / "models"))
        for name in args.only:
            size = tuple(int(v) for v in args.size.split("x")) if args.size else SIZES[name]
            _spawn("product", name, size, args, Path(scratch) / "warm.npy")  # stage files, reach: made once
            rows += bench_model(name, size, args, Path(scratch))
    print(f"{'model':26} {'size':>9} {'variant':9} {'s':>7} {'t/ort':>6} {'compute':>7} {'RSS MB':>7} "
          f"{'max':>4} {'p99.9':>6} {'fmax':>7}")  # fmt: skip
    for r in rows:
        print(f"{r['model']:26} {r['size'][1]}x{r['size'][0]:<4} {r['variant']:9} {r['seconds']:7.2f} "
              f"{r['t_over_ort']:6.2f} {r['compute']:7.3f} {r['peak_rss_mb']:7d} {r['max']:4d} "
              f"{r['p99_9']:6.3f} {r['float_max']:7.3f}")  # fmt: skip
    print(json.dumps({"bench": "upscale_peers", "threads": args.threads, "rounds": args.rounds, "rows": rows}))
    return rows


if __name__ == "__main__":
    main()
