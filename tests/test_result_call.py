"""Issue #37 item 3: the timer call that receives a Process Sequence frame's result and stages its
write reads none of the result's pixels. Before, the family's product counted the colours above 1
(the note "N pixel(s) above 1 were clipped") over the whole image in that call: 0.2 s of CPU for a
7680x4320 RGBA float result (a 3840x2160 frame upscaled x2, bench/result_call.py). Now the encoder
counts them in the bands it pulls, a band per timer call, and the frame's notes are completed when
its file is written; the files and the notes are the same as when counted in one go.

The real runner's write (models/batch/runner.py write_file), the real JobOutput and Blender's staged
frame IO (operators/model_job.py BlenderFrames, bpy 5.0.1), the real banded encoders."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

pytest.importorskip("bpy")
bh.import_package()

from lean_image_ai.models import file_formats  # noqa: E402
from lean_image_ai.models.adapters.upscale.result import UpscaleResult  # noqa: E402
from lean_image_ai.models.batch.frame_lists import FrameRef  # noqa: E402
from lean_image_ai.models.batch.runner import Runner  # noqa: E402
from lean_image_ai.models.file_bytes import bands  # noqa: E402
from lean_image_ai.models.outputs import JobOutput  # noqa: E402
from lean_image_ai.operators.model_job import BlenderFrames  # noqa: E402

HEIGHT, WIDTH = 96, 128


class RowsRead:
    """A result image that records what is read of it: row slices, or all of it at once."""

    def __init__(self, pixels: np.ndarray):
        self.pixels, self.shape, self.dtype = pixels, pixels.shape, pixels.dtype
        self.rows: list[tuple[int, int]] = []
        self.whole = 0

    def __getitem__(self, key):
        if not isinstance(key, slice):
            self.whole += 1
            return self.pixels[key]
        start, stop, _ = key.indices(len(self.pixels))
        self.rows.append((start, stop))
        return self.pixels[key]

    def __array__(self, dtype=None, copy=None):
        self.whole += 1
        return self.pixels if dtype is None else self.pixels.astype(dtype)

    def __len__(self):
        return len(self.pixels)


def overshooting_result(input_kind: str) -> np.ndarray:
    """A bicubic-like upscale: a few colours above 1 (the note's subject), opaque."""
    pixels = np.random.default_rng(7).random((HEIGHT, WIDTH, 4)).astype(np.float32)
    pixels[..., :3] *= 1.05
    pixels[..., 3] = 1.0
    return pixels


def runner_write(path: Path, image, input_kind: str, *, staged: bool):
    """Runner.write_file of one frame, as the sequence's batch calls it, with Blender's frame IO."""
    frames = BlenderFrames(staged=staged)
    output = JobOutput.of("upscale", file_formats.BLENDER_WRITER)
    ref = FrameRef(1, path.with_name("in_0001.png"))
    output.adopt([ref], [path])
    runner = SimpleNamespace(output=output, io=frames, model_run=SimpleNamespace(values={}),
                             shot=SimpleNamespace(output_image=None), events=SimpleNamespace(written=None))
    notes = Runner.write_file(runner, ref, UpscaleResult(image, 2, 64, input_kind=input_kind))
    return notes, frames.take_staged() if staged else None


def _finish(frames: BlenderFrames) -> None:
    steps = frames.take_staged()
    while not steps.pump(1e9):
        pass


CASES = [(".png", "8-bit"), (".png", "16-bit"), (".exr", "float")]


@pytest.mark.parametrize(("suffix", "input_kind"), CASES, ids=["8-bit-png", "16-bit-png", "float-exr"])
def test_the_results_call_reads_no_pixel_and_its_file_and_notes_are_as_before(tmp_path, monkeypatch, suffix,
                                                                               input_kind):
    monkeypatch.setattr(bands, "MAX_PIXELS_PER_CALL", 4096)  # a 96x128 result takes several calls
    pixels = overshooting_result(input_kind)
    image = RowsRead(pixels)
    (tmp_path / "staged").mkdir()
    notes, steps = runner_write(tmp_path / "staged" / f"f_0001{suffix}", image, input_kind, staged=True)
    assert image.whole == 0 and image.rows == [], "the result's own call read its pixels"
    calls = 0
    while not steps.pump(0.05):
        calls += 1
    assert calls > 1 and image.whole == 0
    assert sorted(image.rows) == image.rows and image.rows[0][0] == 0 and image.rows[-1][1] == HEIGHT
    assert all(a[1] == b[0] for a, b in zip(image.rows, image.rows[1:], strict=False)), "each row read once"

    # as before: the colours above 1 counted over the whole product in the result's call, the same encoder
    (tmp_path / "whole").mkdir()
    frames = BlenderFrames(staged=True)
    whole_notes, _ = JobOutput.of("upscale", file_formats.BLENDER_WRITER).write(
        tmp_path / "whole" / f"f_0001{suffix}", UpscaleResult(pixels.copy(), 2, 64, input_kind=input_kind), {},
        frames.write_image)
    _finish(frames)
    assert (tmp_path / "staged" / f"f_0001{suffix}").read_bytes() == (tmp_path / "whole" / f"f_0001{suffix}").read_bytes()
    assert notes == whole_notes
    clipped = [note for note in notes if "were clipped to 1" in note]
    assert bool(clipped) == (suffix == ".png"), notes  # a float EXR keeps them
