"""One job's output as one object (#29 item 2): it plans names, claims frames, writes each result
all or nothing and records what it wrote; format rows hold their writers' abilities and the data
files' writers; the shot's depth is written through it. Real files, the real command-line writers."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from lean_image_ai.models import file_formats, files, outputs
from lean_image_ai.models.adapters import shot_depth
from lean_image_ai.models.batch import frame_claims, image_files
from lean_image_ai.models.batch.frame_lists import FrameRef, resolve_input
from lean_image_ai.models.batch.shot_batch import ShotSettings
from lean_image_ai.models.outputs import JobOutput
from lean_image_ai.runtime.errors import LeanImageError
from PIL import Image

PACKAGE = Path(outputs.__file__).resolve().parents[1]


@dataclass
class DepthResult:  # what the depth family's adapter returns: plain data
    depth: np.ndarray
    warnings: list


def depth_of(seed: int, size=(6, 8)) -> DepthResult:
    return DepthResult(np.random.default_rng(seed).uniform(0.5, 9.0, size).astype(np.float32), [])


def plates(folder: Path, count: int) -> list[FrameRef]:
    folder.mkdir()
    for n in range(1, count + 1):
        Image.new("RGB", (8, 6), (n, 2 * n, 3 * n)).save(folder / f"plate_{n}.png")
    return resolve_input(folder, None, None)


def plan(output: JobOutput, refs, target, **flags):
    settings = {"overwrite": False, "skip_existing": False, **flags}
    return output.plan(refs, target, in_sequence=True, shard=None, check_format=image_files.check_writable_format,
                       suffix=output.default_suffix(), **settings)


def test_one_output_plans_names_writes_and_records_what_it_wrote(tmp_path):
    refs = plates(tmp_path / "plates", 3)
    output = JobOutput.of("da3")
    frames, outputs, skip = plan(output, refs, None)
    assert [p.name for p in outputs] == ["plate_depth_0001.exr", "plate_depth_0002.exr", "plate_depth_0003.exr"]
    assert outputs[0].parent == tmp_path / "plates_depth" and outputs[0].parent.is_dir() and not skip
    assert output.targets == dict(zip(frames, outputs, strict=True))
    for ref in frames[:2]:
        notes, product = output.write(output.targets[ref], depth_of(ref.number), {}, image_files.write_image)
        assert product.bits == "float" and notes == []
    assert output.written == outputs[:2]
    assert not files.leftover_temps(outputs[0])  # all or nothing: no temporary file stays

    # a second plan of the same job: the written frames are kept with skip-existing, refused without it
    again = JobOutput.of("da3")
    with pytest.raises(LeanImageError, match="exists. Ask to overwrite it"):
        plan(again, refs, None)
    assert plan(again, refs, None, skip_existing=True)[2] == set(frames[:2])
    assert again.claim_hooks(False) == {} and set(again.claim_hooks(True)) == {"claim", "release"}
    again.claims.release_all()


def test_tidy_removes_what_a_killed_run_left_at_the_planned_outputs_only(tmp_path):
    refs = plates(tmp_path / "plates", 2)
    output = JobOutput.of("upscale")
    outputs = plan(output, refs, None)[1]
    old = time.time() - 3600
    left = [files.temp_path_for(outputs[0]), frame_claims.claim_path(outputs[1])]
    other = files.temp_path_for(outputs[0].with_name("not_ours.png"))  # no output of this job
    for path in (left[0], other):
        path.write_bytes(b"half")
        os.utime(path, (old, old))
    left[1].write_bytes(frame_claims.MARK)  # a claim whose holder died: its lock went with it
    held = frame_claims.FrameClaims()  # a claim a live task holds now stays
    assert held.take(outputs[0])
    try:
        assert output.tidy() == ([], [left[1]])  # no time given: temporary files are not judged
        assert output.tidy(temps_older_than=time.time()) == ([left[0]], [])
        assert other.exists() and frame_claims.claim_path(outputs[0]).exists()
    finally:
        held.release_all()


def test_a_result_of_several_files_records_each_companion_it_wrote(tmp_path):
    """A family writing its own files (MoGe-2: mesh, camera, normals) is recorded file by file."""
    @dataclass
    class Mesh:
        vertices: np.ndarray

    def write_mesh(path, result, values, write_image):
        file_formats.find(".json").write(path.with_suffix(".json"), {"vertices": len(result.vertices)})
        file_formats.find(".ply").write(path, result.vertices, np.zeros((0, 4), np.int32),
                                        np.zeros((len(result.vertices), 2), np.float32), comment="test")
        return ["meshed"]

    record = replace(JobOutput.of("moge2").record, write=write_mesh)
    output = JobOutput(record, "mesh")
    target = tmp_path / "m.ply"
    notes, product = output.write(target, Mesh(np.ones((3, 3), np.float32)), {}, image_files.write_image)
    assert (notes, product) == (["meshed"], None)
    assert output.written == [target, tmp_path / "m.json"]  # no normal map: the writer made none
    assert json.loads((tmp_path / "m.json").read_text()) == {"vertices": 3}
    assert target.read_bytes().startswith(b"ply\nformat binary_little_endian 1.0\ncomment test\nelement vertex 3\n")


def test_writes_from_two_threads_are_all_recorded():
    """The worker and the caller's thread may both write through one output: no record is lost."""
    output = JobOutput.of("da3")
    for attempt in range(20):
        output.written.clear()
        barrier = threading.Barrier(2)

        def write(name, out=output, barrier=barrier):
            barrier.wait()
            for n in range(200):
                out._wrote(Path(f"{name}{n}.exr"), Path(f"{name}{n}.exr"))

        threads = [threading.Thread(target=write, args=(name,)) for name in "ab"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(output.written) == 400, attempt


def test_the_shots_depth_is_written_through_the_job_output(tmp_path):
    """The shot writers no longer bypass the output: one range for the shot, kept in the file, and
    the file recorded; the runner's write (every front-end's) writes the same bytes."""
    assert ShotSettings("da3").output_image is None  # per-frame depth: the family's own image
    settings = ShotSettings("da3", depth_range="auto-shot")
    results = [depth_of(n) for n in (1, 2)]
    for result in results:
        settings.record(None, result)
    low, high = settings.finish_first_pass().split(": ")[1].split(" over")[0].split("..")
    output = JobOutput.of("da3")
    direct = tmp_path / "direct.png"
    notes, product = output.write(direct, results[0], {}, image_files.write_image, image=settings.output_image)
    assert output.written == [direct] and product.value_range == pytest.approx((float(low), float(high)), rel=1e-5)
    with Image.open(direct) as image:
        assert image.text["lean_image_ai:depth_range_mode"] == shot_depth.AUTO_SHOT

    settings.depth.start_pass()  # the writing pass again, from the first frame
    through_runner = tmp_path / "runner.png"  # what models/batch/runner.py's write_file calls
    runner_notes, _ = JobOutput.of("da3").write(
        through_runner, results[0], {}, image_files.write_image, image=settings.output_image
    )
    assert through_runner.read_bytes() == direct.read_bytes()
    assert runner_notes == [note.replace("direct.png", "runner.png") for note in notes]


def test_format_rows_hold_their_writers_abilities_and_data_writers(tmp_path):
    rows = {row.label: row for row in file_formats.FORMATS}
    assert rows["PNG"].bit_depths == ("8-bit", "16-bit") and rows["EXR"].bit_depths == ("8-bit", "float")
    assert (rows["PNG"].metadata, rows["EXR"].metadata, rows["JPEG"].metadata) == (
        file_formats.TEXT_CHUNKS, file_formats.HEADER, file_formats.COMMENT)
    for row in file_formats.FORMATS:  # a data file the add-on writes has its writer in its row
        assert (row.write is not None) == (file_formats.ADDON in row.writers), row.label
    target = file_formats.find(".json").write(tmp_path / "camera.json", {"fov_x_deg": 50.0})
    assert target.read_text() == json.dumps({"fov_x_deg": 50.0}, indent=2)


def test_where_an_8_bit_file_keeps_text_is_its_rows_metadata_column(tmp_path, monkeypatch):
    """The command line's writer asks the row, not the format's name: a JPEG row without a
    comment column writes no value range."""
    product = outputs.OutputPolicy.of("da3").image(depth_of(3), ".jpg")
    image_files.write_image(tmp_path / "kept.jpg", product)
    with Image.open(tmp_path / "kept.jpg") as image:
        assert image.info["comment"].startswith(b"lean_image_ai:value_range")

    jpeg = file_formats.find(".jpg")
    table = {**file_formats._BY_SUFFIX, ".jpg": replace(jpeg, metadata="")}
    monkeypatch.setattr(file_formats, "_BY_SUFFIX", table)
    image_files.write_image(tmp_path / "plain.jpg", product)
    with Image.open(tmp_path / "plain.jpg") as image:
        assert "comment" not in image.info


OUTPUT_MODULES = ("models/outputs.py", "models/result_images.py", "models/file_formats.py",
                  "models/batch/shot_batch.py", "models/batch/image_files.py", "models/batch/frame_io.py", "ui/cli/cli_shot.py", "operators/results.py",
                  "operators/options.py")


@pytest.mark.parametrize("module", OUTPUT_MODULES)
def test_no_output_module_names_a_family(module):
    """What is written is decided by the family's record, never by asking which family it is."""
    from lean_image_ai.models import families

    ids = {family.id for family in families.ALL}
    tree = ast.parse((PACKAGE / module).read_text())
    named = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in ids]
    assert named == [], f"{module} names the families {named}"


def test_adding_a_format_is_one_row(tmp_path):
    """A copy of the add-on whose only change is one row in models/file_formats.py reads a folder
    of frames in the new format and writes its results in it from the command line."""
    copy = tmp_path / "site" / "lean_image_ai"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns(".git", "__pycache__", "tests", "docs", "bench"))
    table = copy / "models" / "file_formats.py"
    row = '    FileFormat((".ppm",), "PPM", writers=frozenset({PILLOW}), frames=True),\n'
    text = table.read_text()
    anchor = "    # read by Blender (an image datablock's file), never written here\n"
    table.write_text(text.replace(anchor, row + anchor, 1))
    frames = tmp_path / "plates"
    frames.mkdir()
    rng = np.random.default_rng(5)
    pictures = [(rng.random((6, 8, 3)) * 255).astype(np.uint8) for _ in range(2)]
    for number, picture in enumerate(pictures, 1):
        Image.fromarray(picture).save(frames / f"plate_{number}.ppm")
    env = {**os.environ, "PYTHONPATH": str(copy.parent), "PYTHONDONTWRITEBYTECODE": "1"}
    for suffix in ("ppm", "png"):  # the same job in a format the add-on had before: the same pixels
        done = subprocess.run(
            [sys.executable, "-m", "lean_image_ai", "upscale", str(frames), str(tmp_path / f"out_####.{suffix}"),
             "--device", "cpu"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
        )
        assert done.returncode == 0, done.stderr
    for number in (1, 2):
        with Image.open(tmp_path / f"out_{number:04d}.ppm") as image, Image.open(tmp_path / f"out_{number:04d}.png") as png:
            assert image.format == "PPM" and image.size == (16, 12)
            assert np.array_equal(np.asarray(image), np.asarray(png.convert("RGB")))


def test_a_family_says_what_its_product_is_and_gets_that_kinds_files(tmp_path):
    """A depth family's output is its tag and its kind: the kind gives the float EXR, the value image
    and the checks; a field the family gives wins; no kind and no format is refused at once."""
    from lean_image_ai.models.family import Output
    from lean_image_ai.models.result_images import DEPTH, MASK

    depth = JobOutput(Output(tag="disparity", what="disparity", product=DEPTH))
    assert (depth.default_suffix("8-bit"), depth.default_suffix("float")) == (".exr", ".exr")
    assert depth.image(depth_of(1), ".exr").bits == "float"
    assert depth.default_name("plate", 7) == "plate_disparity_0007.exr"
    mask = JobOutput(Output(tag="matte", what="a matte", product=MASK, suffix=".tif"))
    assert (mask.default_suffix(), mask.default_suffix("float")) == (".tif", ".exr")
    with pytest.raises(LeanImageError, match="has no alpha channel"):
        mask.check(tmp_path / "matte.jpg")
    with pytest.raises(ValueError, match="give its product"):
        Output(tag="nothing", what="nothing")


def geometry_of(seed: int, height: int, width: int):
    """A MoGe-2 result of a bumpy surface with holes and depth jumps (plain data, as the adapter's)."""
    from lean_image_ai.models.adapters.moge2 import GeometryResult

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    depth = 2.0 + 0.3 * np.sin(x / 7) + np.where(rng.random((height, width)) < 0.05, 3.0, 0.0).astype(np.float32)
    points = np.stack([(x - width / 2) / width * depth, (y - height / 2) / width * depth, depth], axis=-1)
    normal = rng.normal(size=(height, width, 3)).astype(np.float32)
    normal /= np.linalg.norm(normal, axis=-1, keepdims=True)
    mask = rng.random((height, width)) < 0.9
    intrinsics = np.array([[width, 0, width / 2], [0, width, height / 2], [0, 0, 1]], np.float32)
    return GeometryResult(points.astype(np.float32), depth, normal, mask, intrinsics, 0.9, 0.6, 1.5, (height, width))


@pytest.mark.parametrize("size", [(37, 1100), (300, 410)], ids=["strided", "every-pixel"])
def test_geometry_files_made_a_band_per_call_are_the_one_call_writes(tmp_path, monkeypatch, size):
    """Process Sequence's MoGe-2 frame files (issue #37 item 3): mesh and normal map made a band per
    call, at most MAX_PIXELS_PER_CALL each, then written together in the last call: the PLY and JSON
    bytes write_geometry writes, and the normal map's floats."""
    from lean_image_ai.models.adapters import moge2_mesh
    from lean_image_ai.models.file_bytes import bands

    monkeypatch.setattr(bands, "MAX_PIXELS_PER_CALL", 32768)  # an EXR band is 16 rows at least
    result = geometry_of(1, *size)
    (tmp_path / "one").mkdir(), (tmp_path / "banded").mkdir()
    _, normals = moge2_mesh.write_geometry(tmp_path / "one" / "f.ply", result, discontinuity=0.04)
    made = moge2_mesh.GeometryFiles(tmp_path / "banded" / "f.ply", result, discontinuity=0.04)
    calls = 0
    while not made.pump(0.001):
        calls += 1
        assert not any(p.exists() for p in made.paths)  # nothing on disk before the last call
    assert calls >= 4 and max(made.mesh.calls + made.normals.calls) <= 32768
    for name in ("f.ply", "f.json"):
        assert (tmp_path / "banded" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    grid = moge2_mesh.mesh_arrays(result.points, result.mask, discontinuity=0.04)
    assert len(grid.quads) > 1000 and grid.stride == (3 if size[1] > 1024 else 1)
    exr = pytest.importorskip("OpenEXR")
    with exr.File(str(tmp_path / "banded" / "f_normal.exr")) as file:
        rgba = file.channels()["RGBA"].pixels
    assert rgba.dtype == np.float32 and np.array_equal(rgba[..., :3], normals.pixels) and (rgba[..., 3] == 1).all()


def test_a_geometry_frame_whose_mesh_cannot_be_written_leaves_none_of_its_files(tmp_path):
    from lean_image_ai.models.adapters import moge2_mesh

    made = moge2_mesh.GeometryFiles(tmp_path / "f.ply", geometry_of(2, 40, 50), discontinuity=0.04)
    (tmp_path / "f.ply").mkdir()  # the mesh's name taken by a folder: its write fails, the last of the three
    with pytest.raises(LeanImageError, match="Could not save .*f.ply"):
        while not made.pump(1.0):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.ply"]  # the folder only: no camera, no normal map
