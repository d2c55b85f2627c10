"""Blender image <-> numpy: ``operators.image_io`` (foreach_get/foreach_set into float32 buffers)
against the naive ``image.pixels[:]`` / ``image.pixels = list``, side by side in one run.

    .venv/bin/python bench/blender_io.py [--size 2048] [--repeats 5] [--float]

Both sides produce the same thing: a float32 (H, W, 4) array, top row first, and back. Prints a
table, then exactly one JSON line with the speed-ups (ratios of medians; absolute times on these
machines are noisy, ratios measured in the same run are not).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _time(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048, help="width and height in pixels")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--naive-repeats", type=int, default=3, help="repeats of the slow naive path")
    parser.add_argument("--float", action="store_true", help="float image instead of a byte (sRGB) image")
    args = parser.parse_args(argv)

    import blender_helpers as bh
    import bpy

    io = bh.import_submodule("operators.image_io")
    size = args.size
    src = np.random.default_rng(0).random((size, size, 4), dtype=np.float32)
    image = io.array_to_new_image("bench", src, float_buffer=args.float)
    megapixels = size * size / 1e6

    def fast_read():
        return io.image_to_array(image)

    def naive_read():
        flat = np.array(image.pixels[:], dtype=np.float32)
        return flat.reshape(size, size, 4)[::-1]

    def fast_write():
        io.write_array_to_image(image, src)

    def naive_write():
        image.pixels = src[::-1].ravel().tolist()

    # Same results both ways (also warms up the buffers).
    assert np.array_equal(fast_read(), naive_read())
    naive_write()
    after_naive = fast_read()
    fast_write()
    assert np.array_equal(fast_read(), after_naive)

    rows = []
    timings = {}
    for label, fn, repeats in (
        ("image -> numpy  image_io.image_to_array", fast_read, args.repeats),
        ("image -> numpy  np.array(image.pixels[:])", naive_read, args.naive_repeats),
        ("numpy -> image  image_io.write_array_to_image", fast_write, args.repeats),
        ("numpy -> image  image.pixels = list", naive_write, args.naive_repeats),
    ):
        times = _time(fn, repeats)
        timings[label] = statistics.median(times)
        rows.append((label, statistics.median(times), min(times), repeats))

    kind = "float" if args.float else "byte (sRGB)"
    print(f"Blender {bpy.app.version_string}, {size}x{size} {kind} image ({megapixels:.2f} MP, RGBA)")
    print(f"{'path':<50} {'median s':>10} {'min s':>10} {'runs':>5}")
    for label, med, best, repeats in rows:
        print(f"{label:<50} {med:>10.4f} {best:>10.4f} {repeats:>5}")
    labels = list(timings)
    read_speedup = timings[labels[1]] / timings[labels[0]]
    write_speedup = timings[labels[3]] / timings[labels[2]]
    print(f"speed-up read: {read_speedup:.1f}x   write: {write_speedup:.1f}x")
    result = {
        "image_to_array_speedup_vs_pixels_slice": round(read_speedup, 1),
        "array_to_image_speedup_vs_pixels_assign": round(write_speedup, 1),
        "megapixels": round(megapixels, 2),
        "float_buffer": bool(args.float),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
