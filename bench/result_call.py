"""The call that receives a Process Sequence frame's result and stages its write (issue #37 item 3),
before and after side by side: an upscale's RGBA float32 image (7680x4320: a 3840x2160 frame x2)
arrives as a private mapping of an exchange file (models/worker/wire.py _buffer), as in Blender,
and the runner's write of it (models/outputs.py JobOutput.write into operators/model_job.py
BlenderFrames staged) is timed in CPU seconds: with the clipped colours counted over the whole
image in that call (before), and counted in the bands the encoder pulls (after); then the longest
band call of the file's encode, and whether both files' bytes and notes are the same.

    python bench/result_call.py [--width 7680 --height 4320] [--suffix .png] [--input-kind 8-bit|16-bit|float]

Ends with one JSON line."""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import blender_helpers as bh  # noqa: E402

bh.import_package()

from lean_image_ai.models import file_formats  # noqa: E402
from lean_image_ai.models.adapters.upscale.result import UpscaleResult  # noqa: E402
from lean_image_ai.models.outputs import JobOutput  # noqa: E402
from lean_image_ai.operators.model_job import BlenderFrames  # noqa: E402


def received(folder: Path, height: int, width: int) -> np.ndarray:
    """A bicubic-like result (a few colours over 1) as Blender's side receives it: a private
    (copy-on-write) mapping of its file, no page of it touched yet."""
    rng = np.random.default_rng(0)
    image = np.empty((height, width, 4), np.float32)
    for start in range(0, height, 512):
        band = rng.random((min(512, height - start), width, 4), dtype=np.float32)
        band[..., :3] *= 1.02
        band[..., 3] = 1.0
        image[start:start + len(band)] = band
    path = folder / "result.bin"
    image.tofile(path)
    size = image.nbytes
    del image
    with open(path, "rb") as source:
        buffer = mmap.mmap(source.fileno(), size, access=mmap.ACCESS_COPY)
    os.unlink(path)
    return np.frombuffer(buffer, np.float32).reshape(height, width, 4)


def run(folder: Path, args, count_clipped: bool) -> dict:
    output = JobOutput.of("upscale", file_formats.BLENDER_WRITER)
    result = UpscaleResult(received(folder, args.height, args.width), 2, 512, input_kind=args.input_kind)
    frames = BlenderFrames(staged=True)
    path = folder / ("whole" if count_clipped else "banded") / f"frame_0001{args.suffix}"
    path.parent.mkdir()
    started = time.thread_time()
    notes, _ = output.write(path, result, {}, frames.write_image, count_clipped=count_clipped)
    call = time.thread_time() - started
    staged = frames.take_staged()
    spent = []
    while True:
        started = time.thread_time()
        done = staged.pump(0.05)
        spent.append(time.thread_time() - started)
        if done:
            break
    # the last call writes the encoded file whole (files.write_bytes): not a band
    longest, calls = max(spent[:-1], default=0.0), len(spent)
    return {"call_cpu_s": call, "longest_band_cpu_s": longest, "last_call_cpu_s": spent[-1], "band_calls": calls,
            "notes": list(notes),
            "bytes": path.read_bytes()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=7680)
    parser.add_argument("--height", type=int, default=4320)
    parser.add_argument("--suffix", default=".png")
    parser.add_argument("--input-kind", default="8-bit", choices=("8-bit", "16-bit", "float"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = run(Path(tmp), args, count_clipped=True)
        after = run(Path(tmp), args, count_clipped=False)
    same = before["bytes"] == after["bytes"] and before["notes"] == after["notes"]
    print(f"{args.width}x{args.height} RGBA float result -> {args.suffix} ({args.input_kind} input): the result's call "
          f"{before['call_cpu_s']:.3f} s CPU before, {after['call_cpu_s']:.3f} s after; the longest band call "
          f"{before['longest_band_cpu_s']:.3f} s before, {after['longest_band_cpu_s']:.3f} s after "
          f"({after['band_calls']} calls), the last (the file written whole) {before['last_call_cpu_s']:.3f} s before, "
          f"{after['last_call_cpu_s']:.3f} s after; same bytes and notes: {same}; notes: {after['notes']}")
    print(json.dumps({"width": args.width, "height": args.height, "suffix": args.suffix, "input_kind": args.input_kind,
                      "before_call_cpu_s": round(before["call_cpu_s"], 3),
                      "after_call_cpu_s": round(after["call_cpu_s"], 3),
                      "before_longest_band_cpu_s": round(before["longest_band_cpu_s"], 3),
                      "after_longest_band_cpu_s": round(after["longest_band_cpu_s"], 3),
                      "after_last_call_cpu_s": round(after["last_call_cpu_s"], 3),
                      "band_calls": after["band_calls"], "same_bytes_and_notes": same}))


if __name__ == "__main__":
    main()
