"""Save Result To's file (an 8-bit PNG of a byte source, a float EXR of a float one) goes to disk as
the pump encodes its bands (issue #37 item 3: the whole file written in the call that made the image
took 0.2-0.5 s for a 4096x4096 float EXR): into the atomic writer's temporary file beside it, renamed
whole by the last call; the image then reads it. A cancel leaves neither the temporary nor the file.
Driven by timer events as tests/test_apply_steps.py (real bpy 5.0.1, the built-in bicubic x2)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).parent))
bpy = pytest.importorskip("bpy")

from lean_image_ai.models import files  # noqa: E402
from test_apply_steps import Deflate, byte_source, clean, float_source, registered, run_modal  # noqa: E402, F401


def watching(out: Path, seen: list):
    """A check run after every timer call (run_modal's ``stop_when``) that records the temporary
    files beside ``out`` and whether ``out`` is there yet; never stops the job."""

    def look() -> bool:
        seen.append((len(files.leftover_temps(out)), out.exists()))
        return False

    return look


@pytest.mark.parametrize(("source", "suffix"), [(byte_source, ".png"), (float_source, ".exr")])
def test_save_result_to_is_written_across_timer_calls_and_renamed_whole(tmp_path, monkeypatch, source, suffix):
    path = source(tmp_path)
    out = tmp_path / f"saved{suffix}"
    written_whole = []
    real_write = files.write_bytes
    monkeypatch.setattr(files, "write_bytes", lambda target, data: written_whole.append(target) or real_write(target, data))
    calls = []
    seen = run_modal(path, Deflate(monkeypatch), output_path=str(out), stop_when=watching(out, calls))
    assert seen["state"] == {"FINISHED"}
    assert out not in written_whole  # no call wrote the whole file
    assert sum(1 for temporaries, there in calls if temporaries == 1 and not there) >= 2  # on disk over calls
    assert calls[-1] == (0, True) and files.leftover_temps(out) == []
    image = bpy.data.images[seen["images"][-1][0]]
    assert image.packed_file is None and Path(bpy.path.abspath(image.filepath)) == out
    if suffix == ".png":
        expected = np.floor(np.clip(seen["result"] * 255.0 + 0.5, 0, 255)).astype(np.uint8)
        np.testing.assert_array_equal(np.asarray(PILImage.open(out))[..., :3], expected[..., :3])


def test_esc_while_save_result_to_is_written_leaves_no_file(tmp_path, monkeypatch):
    path = byte_source(tmp_path)
    out = tmp_path / "saved.png"
    deflate = Deflate(monkeypatch)
    seen = run_modal(path, deflate, output_path=str(out), cancel_when=lambda: len(deflate.fed) >= 2)
    assert "cancelled_at" in seen and seen["state"] == {"CANCELLED"}
    assert not out.exists() and files.leftover_temps(out) == []
    assert all(images == [] for images in seen["images"])


def test_save_result_to_in_another_format_is_written_across_timer_calls(tmp_path, monkeypatch):
    """A file at Save Result To other than the image's own (results.OutputFile: a byte source's
    result as .jpg) goes to its temporary file as its bands come too; the image stays packed."""
    path = byte_source(tmp_path)
    out = tmp_path / "saved.jpg"
    written_whole = []
    real_write = files.write_bytes
    monkeypatch.setattr(files, "write_bytes", lambda target, data: written_whole.append(target) or real_write(target, data))
    calls = []
    seen = run_modal(path, Deflate(monkeypatch), output_path=str(out), stop_when=watching(out, calls))
    assert seen["state"] == {"FINISHED"}
    assert out not in written_whole  # no call wrote the whole file
    assert sum(1 for temporaries, there in calls if temporaries == 1 and not there) >= 2  # on disk over calls
    assert calls[-1] == (0, True) and files.leftover_temps(out) == []
    image = bpy.data.images[seen["images"][-1][0]]
    assert image.packed_file is not None
    with PILImage.open(out) as saved:
        assert saved.format == "JPEG" and saved.size == tuple(image.size)
