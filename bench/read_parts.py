"""A sequence frame's read on Blender's main thread (issue #37 item 3), in one call and in steps, side by side.

    .venv/bin/python bench/read_parts.py [--sizes 1920x1080 3840x2160] [--repeats 3]

This process plays Blender's (the bpy 5.0.1 wheel of the dev venv). For each size, a file of each
kind a sequence holds: an 8-bit RGBA PNG and a float RGBA EXR written by Blender, a 16-bit grey PNG
written by Pillow (Blender reads it into a float buffer). Per repeat, the frame read afresh twice:
in one call (``sources.read_frame``: the read before branch ``seqread``, load + decode, the pixels'
copy-out, the conversion for the model, the datablock removed) and in steps as the batch pumps it
(``sources.frame_read``: one ``pump(0.05)`` a timer call, the modal job's budget), each call timed,
wall and CPU. Medians over the repeats; prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _timed(fn):
    started, cpu = time.perf_counter(), time.thread_time()
    value = fn()
    return time.perf_counter() - started, time.thread_time() - cpu, value


def _frame(bpy, folder: Path, width: int, height: int, kind: str) -> Path:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.stack([x / width, y / height, (x + y) / (width + height), 0.5 + 0.5 * (x > y)], axis=-1)
    if kind == "16-bit PNG":
        from PIL import Image

        path = folder / f"f16_{width}x{height}.png"
        Image.fromarray((pixels[..., 0] * 65535).astype(np.uint16)).save(path)
        return path
    is_float = kind == "float EXR"
    path = folder / f"f_{width}x{height}.{'exr' if is_float else 'png'}"
    image = bpy.data.images.new("frame", width, height, alpha=True, float_buffer=is_float)
    image.pixels.foreach_set(pixels[::-1].astype(np.float32).ravel())
    image.filepath_raw, image.file_format = str(path), "OPEN_EXR" if is_float else "PNG"
    image.save()
    bpy.data.images.remove(image)
    return path


def _one_read(sources, ref) -> dict:
    one_wall, one_cpu, whole = _timed(lambda: sources.read_frame(ref))
    steps = sources.frame_read(ref)
    calls = []
    while True:
        wall, cpu, done = _timed(lambda: steps.pump(0.05))
        calls.append((wall, cpu))
        if done:
            break
    assert np.array_equal(steps.pixels, whole)  # the same pixels either way
    return {"one call wall": one_wall, "one call CPU": one_cpu,
            "steps: decode call wall": calls[0][0], "steps: decode call CPU": calls[0][1],
            "steps: take call wall": calls[1][0], "steps: take call CPU": calls[1][1],
            "steps: longest conversion call wall": max(wall for wall, _ in calls[2:]),
            "steps: longest conversion call CPU": max(cpu for _, cpu in calls[2:]),
            "steps: calls": len(calls)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1920x1080", "3840x2160"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import blender_helpers as bh
    import bpy

    sources = bh.import_submodule("operators.sources")
    frame_lists = bh.import_submodule("models.batch.frame_lists")
    folder = Path(tempfile.mkdtemp(prefix="bench_read_parts_"))
    figures = {}
    for size in args.sizes:
        width, height = (int(v) for v in size.split("x"))
        for kind in ("8-bit PNG", "16-bit PNG", "float EXR"):
            ref = frame_lists.FrameRef(1, _frame(bpy, folder, width, height, kind))
            runs = [_one_read(sources, ref) for _ in range(args.repeats)]
            medians = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
            print(f"\n{size} {kind} (median of {args.repeats} fresh reads)")
            for name, value in medians.items():
                print(f"  {name:<40} {value:7.4f}")
            key = f"{size}_{kind.split()[0]}"
            for name, value in medians.items():
                figures[f"{key}_{name.replace('steps: ', '').replace(' ', '_')}"] = round(value, 4)
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
