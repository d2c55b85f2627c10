"""The end of a result's file (issue #37 item 3): the call that puts its bytes together
(models/file_bytes/ ``_close``) and the parts of the call that makes the result from them
(operators/results.py: ``image.pack(data=...)``; Save Result To and sequence frames:
models/files.py ``write_bytes``, i.e. the temporary file's write, its fsync, the rename), and,
where the code has it (``BandedFile.write_to``), the file written to disk as its bands come: its
longest band call and its last call (flush to disk, rename).

    .venv/bin/python bench/result_assembly.py [--side 4096] [--kind exr|png] [--runs 1]

The picture: smooth gradients with grain (what an upscaler gives), straight RGBA floats; EXR is the
32-bit float file a float result is packed from, PNG the 8-bit one of a byte result. The bands are
pumped with the job's 0.05 s budget. Each part is timed alone, wall and CPU time of the process (on a
loaded machine a long wall time with a short CPU time waited for a core or the disk). Prints each
run, then exactly one JSON line of the medians and the longest band call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lean_image_ai.models import files  # noqa: E402
from lean_image_ai.models.file_bytes import ExrFile, PngFile  # noqa: E402

BUDGET = 0.05  # what the modal job gives a timer call (operators/job_operator.py)


def picture(side: int) -> np.ndarray:
    rng = np.random.default_rng(side)
    y, x = np.mgrid[0:side, 0:side].astype(np.float32) / side
    rgb = np.stack([np.sin(6 * x) * 0.5 + 0.5, np.cos(5 * y) * 0.5 + 0.5, x * y], axis=-1)
    rgb += rng.normal(0, 0.03, rgb.shape).astype(np.float32)
    alpha = np.clip(x + y, 0, 1)[..., None]
    return np.concatenate([np.clip(rgb, 0, 1), alpha], axis=-1).astype(np.float32)


def timed(work):
    wall, cpu = time.perf_counter(), time.process_time()
    value = work()
    return value, round(time.perf_counter() - wall, 4), round(time.process_time() - cpu, 4)


def one_run(pixels: np.ndarray, kind: str, folder: Path) -> dict:
    made = (ExrFile if kind == "exr" else PngFile)(*pixels.shape[:2], lambda start, stop: pixels[start:stop])
    longest = longest_cpu = 0.0
    while made._next < made.height:
        _, wall, cpu = timed(lambda: made.pump(BUDGET))
        longest, longest_cpu = max(longest, wall), max(longest_cpu, cpu)
    _, join_s, join_cpu = timed(lambda: made.pump(BUDGET))  # no row left: the bytes put together
    data = made.data
    row = {"file_mb": round(len(data) / 2**20, 1), "longest_band_call_s": round(longest, 4),
           "longest_band_call_cpu_s": round(longest_cpu, 4),
           "assemble_s": join_s, "assemble_cpu_s": join_cpu}
    _, row["bytes_copy_s"], row["bytes_copy_cpu_s"] = timed(lambda: bytes(bytearray(data)))  # one whole copy, for scale
    row.update(_pack(data))
    target = folder / f"result.{kind}"
    _, row["write_bytes_s"], row["write_bytes_cpu_s"] = timed(lambda: files.write_bytes(target, data))
    raw = folder / "raw.bin"  # the same write's parts, apart: to the page cache, then to the disk
    with open(raw, "wb") as handle:
        _, row["write_s"], row["write_cpu_s"] = timed(lambda: handle.write(data))
        handle.flush()
        _, row["fsync_s"], row["fsync_cpu_s"] = timed(lambda: os.fsync(handle.fileno()))
    raw.unlink()
    target.unlink()
    if hasattr(made, "write_to"):
        row.update(_written_across_calls(pixels, kind, target))
    return row


def _written_across_calls(pixels: np.ndarray, kind: str, target: Path) -> dict:
    """Save Result To's and a sequence frame's way: the file written to disk as its bands come
    (BandedFile.write_to), the last call flushing it to disk and renaming it."""
    made = (ExrFile if kind == "exr" else PngFile)(*pixels.shape[:2], lambda start, stop: pixels[start:stop])
    made.write_to(target)
    longest = longest_cpu = 0.0
    while made._next < made.height:
        _, wall, cpu = timed(lambda: made.pump(BUDGET))
        longest, longest_cpu = max(longest, wall), max(longest_cpu, cpu)
    _, last, last_cpu = timed(lambda: made.pump(BUDGET))
    target.unlink()
    return {"to_disk_longest_band_call_s": round(longest, 4), "to_disk_longest_band_call_cpu_s": round(longest_cpu, 4),
            "to_disk_last_call_s": last, "to_disk_last_call_cpu_s": last_cpu}


def _pack(data: bytes) -> dict:
    try:
        import bpy
    except ImportError:
        return {}
    image = bpy.data.images.new("assembled", 1, 1, float_buffer=True)
    _, wall, cpu = timed(lambda: image.pack(data=data, data_len=len(data)))
    bpy.data.images.remove(image)
    return {"pack_s": wall, "pack_cpu_s": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=4096)
    parser.add_argument("--kind", choices=("exr", "png"), default="exr")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    pixels = picture(args.side)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.runs):
            rows.append(one_run(pixels, args.kind, Path(folder)))
            print(rows[-1], flush=True)
    summary = {"kind": args.kind, "side": args.side}
    for key in rows[0]:
        values = [row[key] for row in rows]
        summary[key] = max(values) if key.startswith("longest") else round(statistics.median(values), 4)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
