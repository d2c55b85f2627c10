"""One camera per MoGe-2 shot (models/adapters/shot_camera.py): a focal for the shot, each frame's shift
for that focal, and the command line's --camera shot / --fov on a real-onnxruntime stand-in."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from builders_moge2 import moge2_like_model
from lean_image_ai.models.adapters import moge2, moge2_solver, shot_camera
from lean_image_ai.models.base import RunOptions
from lean_image_ai.runtime.errors import LeanImageError
from lean_image_ai.ui.cli.main import main
from PIL import Image
from test_moge2 import red_image, synthetic_points

FOCAL = 1.2  # MoGe's convention (relative to half the diagonal)
HEIGHT, WIDTH = 48, 64


def _noisy_shot(count=15):
    """Frames of one locked-off camera: 2 % point noise, and every fifth frame a bad one (15 %),
    as a frame whose geometry the model got wrong."""
    frames = []
    for index in range(count):
        shift = float(np.random.default_rng(index).uniform(-1.0, 2.0))
        noise = 0.15 if index % 5 == 2 else 0.02
        points, mask, _ = synthetic_points(HEIGHT, WIDTH, FOCAL, shift, noise=noise, seed=index)
        frames.append((points, mask, shift))
    return frames


def _width_fraction(focal):
    return focal * math.hypot(HEIGHT, WIDTH) / 2 / WIDTH


def test_shot_focal_is_one_focal_near_the_truth_where_frames_vary():
    frames = _noisy_shot()
    per_frame = [moge2_solver.recover_focal_shift(points, mask)[0] for points, mask, _ in frames]
    errors = [abs(f / FOCAL - 1) for f in per_frame]
    assert max(errors) > 0.2 and np.ptp(per_frame) / FOCAL > 0.2  # the frames disagree (bad ones by 30-40 %)
    shot = shot_camera.shot_focal_width(_width_fraction(f) for f in per_frame)
    assert abs(shot / _width_fraction(FOCAL) - 1) < 0.015  # the median; the mean is 7 % off here
    assert abs(np.mean(per_frame) / FOCAL - 1) > 0.05


def test_shift_for_a_given_focal():
    for points, mask, shift in _noisy_shot(6)[:2]:  # frames 0 and 1: 2 % noise
        found = moge2_solver.shift_for_focal(points, mask, FOCAL)
        depth = points[..., 2][mask] + shift  # true depth 2.2..3.8
        assert abs(found - shift) < 0.03 * float(np.median(depth))


def test_fov_conversions_and_refusals():
    assert shot_camera.fov_from_focal_width(shot_camera.focal_width_from_fov(50.0)) == pytest.approx(50.0)
    assert shot_camera.focal_width_from_fov(90.0) == pytest.approx(0.5)
    with pytest.raises(LeanImageError, match="between 1 and 170"):
        shot_camera.ShotCamera(shot_camera.SHOT, 0.0)
    with pytest.raises(LeanImageError, match="no shot focal"):
        shot_camera.shot_focal_width([])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return moge2_like_model(tmp_path_factory.mktemp("cam") / "moge2.onnx")


def test_adapter_uses_the_given_focal(model, fresh_runtime):
    image = red_image(60, 90)
    options = RunOptions(runtime=fresh_runtime)
    own = moge2.run(image, model, options=options)
    fixed_width = float(own.intrinsics[0][0]) / 90
    fixed = moge2.run(image, model, options=RunOptions(runtime=fresh_runtime), focal_width=fixed_width)
    assert float(fixed.intrinsics[0][0]) == pytest.approx(float(own.intrinsics[0][0]), rel=1e-6)
    assert fixed.shift == pytest.approx(own.shift, rel=1e-3)  # its own focal: the same shift
    wider = moge2.run(image, model, options=RunOptions(runtime=fresh_runtime), focal_width=fixed_width * 0.8)
    assert float(wider.intrinsics[0][0]) == pytest.approx(0.8 * float(own.intrinsics[0][0]), rel=1e-6)
    assert wider.fov_x > own.fov_x and wider.shift != pytest.approx(own.shift, rel=1e-3)


def _shot(folder, count=3):
    folder.mkdir()
    for index in range(count):
        Image.fromarray((red_image(40, 60) * 255).astype(np.uint8)).save(folder / f"f_{index + 1:04d}.png")
    return folder


@pytest.mark.parametrize("option,expected", [(("--camera", "shot"), "shot"), (("--fov", "50"), "fov")])
def test_cli_one_camera_for_the_shot(tmp_path, capsys, model, option, expected):
    shot = _shot(tmp_path / "in")
    code = main(["geometry", str(shot), str(tmp_path / "out" / "g_####.ply"), "--model", str(model), *option])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["camera"]["mode"] == expected and summary["written"] == 3
    fovs = {json.loads(p.read_text())["fov_x_deg"] for p in (tmp_path / "out").glob("*.json")}
    assert len(fovs) == 1 and fovs.pop() == pytest.approx(summary["camera"]["fov_x_deg"], abs=1e-5)
    if expected == "fov":
        assert summary["camera"]["fov_x_deg"] == pytest.approx(50.0)
    else:
        assert "first pass: focal lengths only" in captured.out
