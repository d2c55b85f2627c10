"""One job, three front-ends, the same files (issue 29's Done-when).

The same JobSpec through the command line (a subprocess), the Ray farm (local; skipped only where
Ray is missing) and Process Sequence in bpy 5.0.1 (a subprocess), each running the one runner
(models/batch/runner.py). Files the add-on writes itself (PLY, JSON) and files written by the same
image writer (the command line and the farm: Pillow/OpenEXR) are compared byte for byte. Blender
saves images with its own encoder (an EXR as RGBA where the command line writes depth as one Y
channel; no metadata), so its images are compared sample for sample, float for float. The 2-frame shots (one depth range found by a first pass,
one camera fitted over the shot) run 20 times in a row in each front-end: in Blender they used to
write nothing in 3-4 of 4 tries.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402
from builders_moge2 import moge2_like_model  # noqa: E402
from builders_shot import drifting_depth_model, write_shot  # noqa: E402
from onnx_builders import sr_model  # noqa: E402

TESTS = Path(__file__).parent
TRIES = 20
SHOTS = {"auto", "camera"}  # the 2-frame shots whose first pass raced: run TRIES times, the others once
# (name, command, Process Sequence's properties, the command line's flags, output pattern)
JOBS = [
    ("range", "depth", {"family": "da3", "depth_range": "0.5:3"}, ["--depth-range", "0.5:3"], "d_####.exr"),
    ("auto", "depth", {"family": "da3", "depth_range": "auto-shot"}, ["--depth-range", "auto-shot"], "d_####.exr"),
    ("camera", "geometry", {"family": "moge2", "shot_camera": "shot"}, ["--camera", "shot"], "g_####.ply"),
    ("upscale", "upscale", {"family": "upscale"}, [], "u_####.png"),
]


@pytest.fixture(scope="module")
def shot(tmp_path_factory):
    root = tmp_path_factory.mktemp("agree")
    frames = write_shot(root / "in", 2, noise=True)
    models = {"depth": drifting_depth_model(root / "drift.onnx"), "geometry": moge2_like_model(root / "moge2.onnx"),
              "upscale": sr_model(root / "sr.onnx", scale=2, mid_channels=4)}
    search = bh.package_search_dir(root / "pkg")
    return root, frames, models, search


def _run(code: str, root: Path, search: Path, name: str):
    env = bh.isolated_blender_env(root / f"user-{name}", pythonpath=[search, TESTS])
    done = bh.run_python(textwrap.dedent(code), env=env, cwd=root, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _cli_code(frames: Path, models: dict, out: Path, tries: int) -> str:
    calls = [
        (name in SHOTS, f"{out}/{name}/{{i}}/{pattern}", [command, str(frames / "shot_####.png"), "--model", str(models[command]),
                                           "--device", "cpu", *flags])
        for name, command, _, flags, pattern in JOBS
    ]
    return f"""
        import sys
        from lean_image_ai.ui.cli.main import main
        for i in range({tries}):
            for repeated, target, argv in {calls!r}:
                if i and not repeated:
                    continue
                code = main([*argv[:2], target.format(i=i), *argv[2:]])
                if code:
                    sys.exit(f"try {{i}}: {{argv}} exited {{code}}")
    """


def _blender_code(frames: Path, models: dict, out: Path, tries: int) -> str:
    calls = [(name in SHOTS, f"{out}/{name}/{{i}}/{pattern}", {**props, "model_path": str(models[command])})
             for name, command, props, _, pattern in JOBS]
    return f"""
        import sys
        import bpy
        import blender_helpers as bh
        bh.import_package()
        from lean_image_ai.operators import batch_ops, jobs
        bh.reset_blender()
        with bh.registered_classes([*jobs.classes, *batch_ops.classes]):
            for i in range({tries}):
                for repeated, target, props in {calls!r}:
                    if i and not repeated:
                        continue
                    result = bpy.ops.lean_image_ai.process_sequence(source={str(frames)!r}, output=target.format(i=i), **props)
                    if result != {{"FINISHED"}}:
                        sys.exit(f"try {{i}}: {{props}} gave {{result}}")
    """


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _samples(path: Path) -> np.ndarray:
    """An image's samples as HxWxC (the command line writes depth as Y, Blender as RGBA)."""
    import OpenEXR

    if path.suffix == ".png":
        with Image.open(path) as image:
            pixels = np.asarray(image)
        return pixels if pixels.ndim == 3 else pixels[..., None]
    with OpenEXR.File(str(path)) as exr:
        planes = [np.asarray(c.pixels) for c in exr.channels().values()]
    return np.concatenate([p if p.ndim == 3 else p[..., None] for p in planes], axis=2)


def _same_samples(ours: dict, theirs: dict, folder_a: Path, folder_b: Path, where: str) -> None:
    assert sorted(ours) == sorted(theirs), where
    for name in ours:
        if name.endswith((".exr", ".png")):  # two encoders: the samples must agree, value for value
            mine, blenders = _samples(folder_a / name), _samples(folder_b / name)
            channels = 1 if mine.shape[2] == 1 else 3  # depth in Y (R, G and B in Blender); colour without alpha
            assert np.array_equal(mine[..., :channels], blenders[..., :channels]), f"{where}: {name}"
        else:  # written by the add-on itself in both front-ends
            assert ours[name] == theirs[name], f"{where}: {name}"


def test_one_job_writes_the_same_files_through_every_front_end(shot):
    root, frames, models, search = shot
    cli_out, blender_out = root / "cli", root / "blender"
    _run(_cli_code(frames, models, cli_out, TRIES), root, search, "cli")
    _run(_blender_code(frames, models, blender_out, TRIES), root, search, "blender")
    for name, *_ in JOBS:
        reference = _files(cli_out / name / "0")
        assert len([n for n in reference if n.endswith((".exr", ".ply", ".png")) and "normal" not in n]) == 2, (name, sorted(reference))
        for i in range(TRIES if name in SHOTS else 1):
            assert _files(cli_out / name / str(i)) == reference, f"command line, {name}, try {i}"
            here = blender_out / name / str(i)
            assert here.is_dir(), f"Blender wrote nothing for {name} on try {i}"
            _same_samples(reference, _files(here), cli_out / name / "0", here, f"Blender, {name}, try {i}")


def test_the_farm_writes_the_command_lines_bytes(shot):
    pytest.importorskip("ray")
    root, frames, models, search = shot
    # a farm cannot run a shot's first pass; and its workers run one intra-op thread each, where a
    # model that sums over the image (the depth stand-in's means) rounds differently from the
    # command line's thread count: the upscale job, whose convolutions keep every bit
    name, command, _, flags, pattern = JOBS[-1]
    cli_target, farm_target = root / "farm-cli" / pattern, root / "farm" / pattern
    code = f"""
        import os, sys
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        from lean_image_ai.ui.cli.main import main
        common = ["--model", {str(models[command])!r}, "--device", "cpu", *{flags!r}]
        source = {str(frames / "shot_####.png")!r}
        sys.exit(main([{command!r}, source, {str(cli_target)!r}, *common])
                 or main(["farm", {command!r}, source, {str(farm_target)!r}, *common, "--workers", "2"]))
    """
    done = _run(code, root, search, "farm")
    assert json.loads(done.stdout.strip().splitlines()[-1])["written"] == 2
    reference = _files(cli_target.parent)
    assert len(reference) == 2 and _files(farm_target.parent) == reference
    assert os.listdir(farm_target.parent) == os.listdir(cli_target.parent)
