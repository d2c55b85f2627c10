"""The parts of a model operator's start on a large source (issue #37 item 3), side by side in one run.

    .venv/bin/python bench/start_parts.py [--sizes 2048x2048 3840x2160] [--repeats 3]

This process plays Blender's (the bpy 5.0.1 wheel of the dev venv). For each size, an 8-bit RGBA PNG
(a byte image) and a float RGBA EXR (a float image) written once by Blender, then, per repeat, the
file loaded afresh (``bpy.data.images.load``: Blender only notes the path) and the start's parts
timed one after the other: Blender's decode (the first ``image.size``), ``image_io.image_info``,
``pixels.foreach_get`` into float32 (cold: the first after the decode; warm: again; a byte image's
bytes become floats inside Blender here), the whole top-row-first copy the start made before this
branch (``np.ascontiguousarray`` of the flipped rows), the start's read as it is now
(``image_io.read_image``: a flipped view) and as it was (``image_to_array``: that view copied),
both on the decoded image (as for an image the Image Editor shows), and the model input's banded
conversion (the job's pump, ``operators/model_job.py``'s ``_model_input``): its longest band and
its whole. Medians over the repeats; prints a table, then one JSON line.
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
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def _source(bpy, folder: Path, width: int, height: int, is_float: bool) -> str:
    path = folder / f"source_{width}x{height}.{'exr' if is_float else 'png'}"
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.stack([x / width, y / height, (x + y) / (width + height), 0.5 + 0.5 * (x > y)], axis=-1).astype(np.float32)
    image = bpy.data.images.new("source", width, height, alpha=True, float_buffer=is_float)
    image.pixels.foreach_set(pixels.ravel())
    image.filepath_raw, image.file_format = str(path), "OPEN_EXR" if is_float else "PNG"
    image.save()
    bpy.data.images.remove(image)
    return str(path)


def _one_start(bpy, io, model_job, path: str) -> dict:
    """One fresh load of ``path``, its parts timed in the order the start meets them."""
    parts = {}
    parts["load"], image = _timed(lambda: bpy.data.images.load(path, check_existing=False))
    parts["decode (first image.size)"], _ = _timed(lambda: tuple(image.size))
    parts["image_info"], info = _timed(lambda: io.image_info(image))
    width, height = info.width, info.height
    flat = np.empty(width * height * 4, np.float32)
    parts["foreach_get cold"], _ = _timed(lambda: image.pixels.foreach_get(flat))
    parts["foreach_get warm"], _ = _timed(lambda: image.pixels.foreach_get(flat))
    rows = flat.reshape(height, width, 4)[::-1]
    parts["whole flipped copy (before)"], _ = _timed(lambda: np.ascontiguousarray(rows))
    parts["read before: image_to_array"], _ = _timed(lambda: io.image_to_array(image))
    parts["read now: read_image"], (rgba, info) = _timed(lambda: io.read_image(image))
    converted = model_job._model_input(rgba, info)
    band_times = []
    while True:
        seconds, over = _timed(lambda: converted.pump(0.05))
        if over:
            break
        band_times.append(seconds)
    parts["model input, longest band"] = max(band_times)
    parts["model input, all bands"] = sum(band_times)
    bpy.data.images.remove(image)
    return parts


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["2048x2048", "3840x2160"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import blender_helpers as bh
    import bpy

    io = bh.import_submodule("operators.image_io")
    model_job = bh.import_submodule("operators.model_job")
    folder = Path(tempfile.mkdtemp(prefix="bench_start_parts_"))
    figures = {}
    for size in args.sizes:
        width, height = (int(v) for v in size.split("x"))
        for is_float in (False, True):
            kind = "float EXR" if is_float else "byte PNG"
            path = _source(bpy, folder, width, height, is_float)
            runs = [_one_start(bpy, io, model_job, path) for _ in range(args.repeats)]
            medians = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
            print(f"\n{size} {kind} (median of {args.repeats} fresh loads)")
            for name, seconds in medians.items():
                print(f"  {name:<32} {seconds:7.4f} s")
            key = f"{size}_{'float' if is_float else 'byte'}"
            figures[f"{key}_decode_s"] = round(medians["decode (first image.size)"], 4)
            figures[f"{key}_read_before_s"] = round(medians["read before: image_to_array"], 4)
            figures[f"{key}_read_now_s"] = round(medians["read now: read_image"], 4)
            figures[f"{key}_longest_band_s"] = round(medians["model input, longest band"], 4)
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
