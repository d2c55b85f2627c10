"""lean_image_ai.process_sequence with real bpy 5.0.1 and the real onnxruntime: a 12-frame image
sequence through every family as one runtime operation, cancel, skip-existing, failed frames; and
the single-image operators' path and output rules."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
bh.import_package()

from builders_families import ben2_like_model, da3_like_model  # noqa: E402
from builders_moge2 import moge2_like_model  # noqa: E402
from lean_image_ai.models import families  # noqa: E402
from lean_image_ai.models.worker import host_record  # noqa: E402
from lean_image_ai.operators import batch_ops, geometry_ops, image_ops, jobs, model_job  # noqa: E402
from onnx_builders import sr_model  # noqa: E402

FRAMES = 12
W, H = 40, 30


@pytest.fixture(scope="module", autouse=True)
def registered():
    with bh.registered_classes([*jobs.classes, *image_ops.classes, *geometry_ops.classes, *batch_ops.classes]):
        yield


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    yield from bh.fresh_blender(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch_models")
    return {
        "ben2": ben2_like_model(root / "ben2.onnx", size=64),
        "da3": da3_like_model(root / "da3.onnx", fixed_hw=None),
        "moge2": moge2_like_model(root / "moge2.onnx"),
        "upscale": sr_model(root / "sr.onnx", scale=2, mid_channels=4),
    }


def write_sequence(folder: Path, count: int = FRAMES) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(1, count + 1):
        rng = np.random.default_rng(n)
        rgba = (rng.random((H, W, 4)) * 255).astype(np.uint8)
        rgba[..., 3] = 255
        PILImage.fromarray(rgba, "RGBA").save(folder / f"plate_{n:04d}.png")
    return folder / "plate_0001.png"


def releases(since: float = 0.0) -> int:
    """Release events at or after ``since`` (a count of the whole bounded buffer stalls once full)."""
    return len([e for e in host_record.events.recent("memory_release") if e["time"] >= since])


EXPECTED = {"ben2": "plate_cutout_{:04d}.png", "da3": "plate_depth_{:04d}.exr", "moge2": "plate_geometry_{:04d}.ply", "upscale": "plate_upscaled_{:04d}.png"}


def test_every_registered_family_is_expected_here():
    assert set(EXPECTED) == set(families.IDS)


@pytest.mark.parametrize("family", list(EXPECTED))
def test_a_sequence_image_through_every_family_is_one_operation(tmp_path, models, family):
    first = write_sequence(tmp_path / "in")
    image = bpy.data.images.load(str(first))
    image.source = "SEQUENCE"
    out = tmp_path / "out"
    out.mkdir()
    before = time.time()
    result = bpy.ops.lean_image_ai.process_sequence(
        family=family, image_name=image.name, output=str(out) + "/", model_path=str(models[family])
    )
    assert result == {"FINISHED"}
    names = sorted(p.name for p in out.iterdir())
    expected = {EXPECTED[family].format(n) for n in range(1, FRAMES + 1)}
    assert expected <= set(names) and not [n for n in names if ".tmp" in n]
    assert releases(before) == 1  # one operation, released once, after the last frame
    assert list(bpy.data.images) == [image]  # frames were read and written without leaving datablocks
    if family == "upscale":
        with PILImage.open(out / "plate_upscaled_0007.png") as written:
            assert written.size == (2 * W, 2 * H)


def test_cancel_after_frame_five_keeps_complete_frames_only(tmp_path, models, monkeypatch):
    write_sequence(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    real_write = model_job.FrameFile.pump  # a depth EXR: encoded a band per call, then written whole

    def write_then_cancel(frame_file, budget):
        done = real_write(frame_file, budget)
        if done and frame_file.path.name.endswith("_0005.exr"):
            jobs.manager.current.cancel()  # what Esc or the panel's Cancel does
        return done

    monkeypatch.setattr(model_job.FrameFile, "pump", write_then_cancel)
    before = time.time()
    result = bpy.ops.lean_image_ai.process_sequence(
        family="da3", source=str(tmp_path / "in" / "plate_####.png"), output=str(out / "d_####.exr"), model_path=str(models["da3"])
    )
    assert result == {"CANCELLED"}  # a warning, not an error: nothing went wrong
    written = sorted(p.name for p in out.iterdir())
    assert written == [f"d_{n:04d}.exr" for n in range(1, 6)]  # exactly 1-5, nothing else
    assert all(p.stat().st_size > 0 for p in out.iterdir())
    assert releases(before) == 1


def test_skip_existing_resumes_and_failed_frames_are_reported(tmp_path, models):
    write_sequence(tmp_path / "in", count=6)
    (tmp_path / "in" / "plate_0004.png").write_bytes(b"not an image")
    out = tmp_path / "out"
    out.mkdir()
    (out / "u_0001.png").write_bytes(b"kept")
    args = dict(family="upscale", source=str(tmp_path / "in"), output=str(out / "u_####.png"), model_path=str(models["upscale"]))
    with pytest.raises(RuntimeError, match="exists"):  # existing outputs are kept unless asked
        bpy.ops.lean_image_ai.process_sequence(**args)
    with pytest.raises(RuntimeError, match=r"4 written, 1 skipped, 1 failed of 6.*frame 4"):
        bpy.ops.lean_image_ai.process_sequence(**args, skip_existing=True)
    assert (out / "u_0001.png").read_bytes() == b"kept"
    assert sorted(p.name for p in out.iterdir()) == ["u_0001.png", "u_0002.png", "u_0003.png", "u_0005.png", "u_0006.png"]


def test_every_failed_frame_is_named_at_warning_or_error_level(tmp_path, models, capfd):
    """Issue 32 item 4: four damaged frames of six; the ERROR gave three and '(and 1 more)', so
    frame 5 was named nowhere. Now the first three come with their errors, the rest numbered, each
    with its error in a WARNING; nothing is left in bpy.data."""
    write_sequence(tmp_path / "in", count=6)
    for n in (2, 3, 4, 5):
        (tmp_path / "in" / f"plate_{n:04d}.png").write_bytes(b"not an image")
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match=r"2 written, 0 skipped, 4 failed of 6.*Failed: frame 2: .*; frame 3: .*; "
                       r"frame 4: .*; and 1 more \(frames 5: their errors are the warnings above\)"):
        bpy.ops.lean_image_ai.process_sequence(
            family="upscale", source=str(tmp_path / "in"), output=str(out / "u_####.png"), model_path=str(models["upscale"])
        )
    said = capfd.readouterr().out
    assert "Warning: Frame 5 failed: Blender cannot read" in said and "Warning: Frame 2 failed" not in said  # each once
    assert list(bpy.data.images) == []
    assert sorted(p.name for p in out.iterdir()) == ["u_0001.png", "u_0006.png"]


def test_skip_existing_leaves_a_frame_another_task_is_computing(tmp_path, models):
    """A frame claimed by another process (models/batch/frame_claims.py; flock conflicts between
    two opens in one process too) is skipped, as on the command line; the run's own claims go."""
    from lean_image_ai.models.batch.frame_claims import FrameClaims, claim_path

    write_sequence(tmp_path / "in", count=4)
    out = tmp_path / "out"
    out.mkdir()
    other_task = FrameClaims()
    assert other_task.take(out / "u_0003.png")
    try:
        result = bpy.ops.lean_image_ai.process_sequence(
            family="upscale", source=str(tmp_path / "in"), output=str(out / "u_####.png"),
            model_path=str(models["upscale"]), skip_existing=True,
        )
        assert result == {"FINISHED"}
        assert sorted(p.name for p in out.iterdir()) == [claim_path(out / "u_0003.png").name, "u_0001.png", "u_0002.png", "u_0004.png"]
    finally:
        other_task.release_all()
    assert sorted(p.name for p in out.iterdir()) == ["u_0001.png", "u_0002.png", "u_0004.png"]


def test_depth_to_png_is_normalised_and_says_from_which_range(tmp_path, models):
    src = write_sequence(tmp_path / "in", count=1)
    out = tmp_path / "depth.png"
    assert bpy.ops.lean_image_ai.estimate_depth(filepath=str(src), output_path=str(out), model_path=str(models["da3"])) == {"FINISHED"}
    with PILImage.open(out) as png:
        values = np.asarray(png.convert("L"))
    assert values.min() == 0 and values.max() == 255  # the whole range, not clipped at 1.0


# ---- single-image operators: paths and outputs ------------------------------------------------------


def test_relative_and_home_paths_resolve_before_the_model_runs(tmp_path, models, monkeypatch):
    src = write_sequence(tmp_path / "in", count=1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert bpy.ops.lean_image_ai.upscale(filepath="~/in/plate_0001.png", output_path="up.png", model_path=str(models["upscale"])) == {"FINISHED"}
    assert (tmp_path / "up.png").is_file() and src.is_file()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(filepath="{folder}"), "is a folder, not an image file; to process every frame use Process Sequence"),
        (dict(output_path="{folder}"), "it is a folder, not a file name"),
        (dict(output_path="{src}"), "it is the input image"),
        (dict(output_path="{existing}"), "exists. Set overwrite=True"),
    ],
)
def test_bad_paths_are_refused_before_the_model_runs(tmp_path, models, kwargs, message):
    src = write_sequence(tmp_path / "in", count=1)
    existing = tmp_path / "old.png"
    existing.write_bytes(b"old")
    values = {k: v.format(folder=tmp_path / "in", src=src, existing=existing) for k, v in kwargs.items()}
    values.setdefault("filepath", str(src))
    before = time.time()
    with pytest.raises(RuntimeError, match=message):
        bpy.ops.lean_image_ai.upscale(model_path=str(models["upscale"]), overwrite=False, **values)
    assert releases(before) == 0 and existing.read_bytes() == b"old"


def test_a_cutout_is_never_written_without_alpha(tmp_path, models):
    src = write_sequence(tmp_path / "in", count=1)
    with pytest.raises(RuntimeError, match="has no alpha channel"):
        bpy.ops.lean_image_ai.remove_background(filepath=str(src), output_path=str(tmp_path / "c.jpg"), model_path=str(models["ben2"]))
    assert not (tmp_path / "c.jpg").exists()


# ---- the README's headless script, as a render node runs it -----------------------------------------

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "farm_sequence.py"


def run_farm_script(*args, cwd):
    import subprocess

    # bpy as a module stands in for `blender --background --python farm_sequence.py -- ...`
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['blender', '--', *{list(args)!r}]\n"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=cwd)


def test_farm_script_processes_a_range_and_exits_non_zero_on_a_failed_frame(tmp_path, models):
    write_sequence(tmp_path / "in", count=5)
    out = tmp_path / "out"
    out.mkdir()
    pattern = str(tmp_path / "in" / "plate_####.png")
    done = run_farm_script("depth", pattern, str(out) + "/", "--frames", "2-4", "--model-path", str(models["da3"]), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"plate_depth_{n:04d}.exr" for n in (2, 3, 4)]
    (tmp_path / "in" / "plate_0005.png").write_bytes(b"broken frame")
    done = run_farm_script("depth", pattern, str(out) + "/", "--skip-existing", "--model-path", str(models["da3"]), cwd=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in said
    assert said.count("Failed: frame 5") == 1, said  # one line per failure, not Blender's and the script's
    assert (out / "plate_depth_0001.exr").is_file() and not (out / "plate_depth_0005.exr").exists()


def test_farm_script_refuses_a_model_id_that_is_a_path_once(tmp_path, models):
    write_sequence(tmp_path / "in", count=1)
    (tmp_path / "x").write_bytes(b"not a model")  # `../../x` from the frames' folder: a file is there
    pattern = str(tmp_path / "in" / "plate_####.png")
    done = run_farm_script("upscale", pattern, str(tmp_path / "out") + "/", "--model-id", "../../x", cwd=tmp_path / "in")
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in said
    assert said.count("'../../x' is not a model id") == 1, said
    assert "model_path" not in said and "not found" not in said
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model_id", ["../../x", "sub\\model"])
def test_an_id_with_a_folder_separator_is_never_looked_up_as_a_file(tmp_path, model_id):
    write_sequence(tmp_path / "in", count=1)
    for call in (
        lambda: bpy.ops.lean_image_ai.upscale(filepath=str(tmp_path / "in" / "plate_0001.png"), model_id=model_id),
        lambda: bpy.ops.lean_image_ai.process_sequence(family="upscale", source=str(tmp_path / "in"), model_id=model_id),
    ):
        with pytest.raises(RuntimeError, match="is not a model id") as caught:
            call()
        assert "model_path" not in str(caught.value)


def test_farm_script_shards_split_the_frames_and_a_retry_only_skips(tmp_path, models):
    write_sequence(tmp_path / "in", count=7)
    out = tmp_path / "out"
    out.mkdir()
    pattern = str(tmp_path / "in" / "plate_####.png")
    common = ("upscale", pattern, str(out) + "/", "--frames", "1-7", "--skip-existing", "--model-path", str(models["upscale"]))
    done = run_farm_script(*common, "--shard", "2/3", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["plate_upscaled_0003.png", "plate_upscaled_0004.png"]
    for index in (1, 3, 2):  # the other tasks, then task 2 again (a retry)
        done = run_farm_script(*common, "--shard", f"{index}/3", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"plate_upscaled_{n:04d}.png" for n in range(1, 8)]
    assert "0 written, 2 skipped" in done.stdout + done.stderr


def test_the_operator_refuses_a_bad_shard_before_the_model_runs(tmp_path, models):
    write_sequence(tmp_path / "in", count=2)
    before = time.time()
    with pytest.raises(RuntimeError, match="I/N"):
        bpy.ops.lean_image_ai.process_sequence(
            family="upscale", source=str(tmp_path / "in"), output=str(tmp_path) + "/", shard="3/2", model_path=str(models["upscale"])
        )
    assert releases(before) == 0
