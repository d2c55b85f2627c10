"""Render-farm shards (`--shard I/N`): the split rule, and the command line run as real processes
with the real onnxruntime: N shards write every frame exactly once, a task run twice at the same
time or retried leaves complete frames and no temporary files."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from lean_image_ai.models.adapters import moge2_mesh
from lean_image_ai.models.batch import frame_lists
from lean_image_ai.runtime.errors import LeanImageError
from PIL import Image


def cli(*args, cwd, timeout=180):
    command = [sys.executable, "-m", "lean_image_ai", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def summary(done) -> dict:
    return json.loads(done.stdout.strip().splitlines()[-1])


def frames_of(count: int, total: int) -> list[list[int]]:
    return [list(range(count))[frame_lists.shard_slice(count, (i, total))] for i in range(1, total + 1)]


@pytest.mark.parametrize("count", [0, 1, 2, 7, 12, 100, 2001])
@pytest.mark.parametrize("total", [1, 2, 3, 5, 8, 13, 64])
def test_n_shards_cover_every_frame_exactly_once_in_contiguous_parts(count, total):
    parts = frames_of(count, total)
    assert [n for part in parts for n in part] == list(range(count))  # in order, once each
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1
    assert parts == frames_of(count, total)  # deterministic


def test_shard_text_is_checked():
    assert frame_lists.parse_shard("") is None and frame_lists.parse_shard("  ") is None
    assert frame_lists.parse_shard("3/8") == (3, 8) and frame_lists.parse_shard(" 1 / 1 ") == (1, 1)
    for bad in ("0/4", "5/4", "1/0", "2", "a/b", "1-4", "-1/4"):
        with pytest.raises(LeanImageError, match="I/N"):
            frame_lists.parse_shard(bad)


def write_plate(folder, count, size=(48, 64)):
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(1, count + 1):
        rng = np.random.default_rng(n)
        Image.fromarray((rng.random((*size, 3)) * 255).astype(np.uint8)).save(folder / f"plate_{n:04d}.png")
    return str(folder / "plate_####.png")


def pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image).copy()


def no_temp_files(folder) -> bool:
    return not [p for p in folder.rglob("*") if ".tmp" in p.name]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The whole sequence in one unsharded run: what every sharded run must reproduce."""
    root = tmp_path_factory.mktemp("shard_reference")
    pattern = write_plate(root / "in", 10)
    (root / "out").mkdir()
    done = cli("upscale", pattern, str(root / "out") + "/", "--frames", "1-10", "--device", "cpu", cwd=root)
    assert done.returncode == 0, done.stderr
    return pattern, {p.name: pixels(p) for p in (root / "out").iterdir()}


def test_three_shards_write_every_frame_once_and_match_one_run(tmp_path, reference):
    pattern, expected = reference
    out = tmp_path / "out"
    out.mkdir()
    numbers = []
    for index in (1, 2, 3):
        done = cli("upscale", pattern, str(out) + "/", "--frames", "1-10", "--shard", f"{index}/3",
                   "--skip-existing", "--device", "cpu", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        report = summary(done)
        assert report["shard"] == f"{index}/3" and report["written"] == len(report["frame_numbers"])
        numbers += report["frame_numbers"]
    assert numbers == list(range(1, 11))  # 1-3, 4-6, 7-10: each frame by exactly one task
    assert sorted(p.name for p in out.iterdir()) == sorted(expected)  # the same names as one run
    for name, image in expected.items():
        assert np.array_equal(pixels(out / name), image)


def test_a_one_frame_shard_keeps_sequence_names_and_an_empty_shard_succeeds(tmp_path, reference):
    pattern, expected = reference
    out = tmp_path / "out"
    out.mkdir()
    done = cli("upscale", pattern, str(out) + "/", "--frames", "1-2", "--shard", "2/2", "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in out.iterdir()] == ["plate_upscaled_0002.png"]
    done = cli("upscale", pattern, str(out) + "/", "--frames", "1-2", "--shard", "2/5", "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr  # 5 tasks for 2 frames: task 2 has nothing to do
    assert (summary(done)["frames"], summary(done)["frame_numbers"]) == (0, [])
    done = cli("upscale", pattern, str(out) + "/", "--shard", "4/3", cwd=tmp_path)
    assert done.returncode == 2 and "I/N" in done.stderr


def test_the_same_shard_twice_at_once_then_retried_leaves_complete_frames_only(tmp_path, reference):
    pattern, expected = reference
    out = tmp_path / "out"
    out.mkdir()
    args = [sys.executable, "-m", "lean_image_ai", "upscale", pattern, str(out) + "/", "--frames", "1-10",
            "--shard", "1/2", "--skip-existing", "--device", "cpu"]
    # a farm that hands the same task to two workers (a retry racing a slow first try)
    runs = [subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [run.communicate(timeout=180) for run in runs]
    for run, (_stdout, stderr) in zip(runs, results, strict=True):
        assert run.returncode == 0, stderr
    shard = [f"plate_upscaled_{n:04d}.png" for n in range(1, 6)]
    assert sorted(p.name for p in out.iterdir()) == shard and no_temp_files(tmp_path)
    for name in shard:
        assert np.array_equal(pixels(out / name), expected[name])
    # a retry after both finished only skips
    done = cli("upscale", pattern, str(out) + "/", "--frames", "1-10", "--shard", "1/2", "--skip-existing",
               "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (summary(done)["written"], summary(done)["skipped"]) == (0, 5)


def test_geometry_writes_its_mesh_last_so_skip_existing_never_keeps_half_a_frame(tmp_path):
    height, width = 8, 10
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    result = SimpleNamespace(
        points=np.stack([x - 5, y - 4, np.full_like(x, 3.0)], axis=2),
        mask=np.ones((height, width), bool),
        normal=np.dstack([np.zeros_like(x), np.zeros_like(x), -np.ones_like(x)]),
        intrinsics=np.eye(3),
        fov_x=1.0,
        fov_y=0.8,
        metric_scale=1.0,
    )
    mesh = tmp_path / "frame_0001.ply"
    seen = []

    def write_normals(path, product):
        seen.append((path.name, mesh.exists(), mesh.with_suffix(".json").exists()))
        path.write_bytes(b"normals")

    written, normals = moge2_mesh.write_geometry(mesh, result, discontinuity=0.04, write_normals=write_normals)
    assert seen == [("frame_0001_normal.exr", False, True)] and normals is None
    assert written == [mesh, mesh.with_suffix(".json")] and mesh.is_file()
