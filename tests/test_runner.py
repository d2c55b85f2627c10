"""The one runner (models/batch/runner.py), in this process: pumped as Blender pumps it (the model
on a worker thread, frames read and written by the caller) it writes what run() writes, as the
command line and the farm call it; results that are not files go to the front-end."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from builders_shot import drifting_depth_model, write_shot  # noqa: E402
from lean_image_ai.models.batch import job_checks  # noqa: E402
from lean_image_ai.models.batch.frame_io import ImageFileFrames  # noqa: E402
from lean_image_ai.models.batch.runner import RunEvents, Runner  # noqa: E402
from lean_image_ai.models.job_spec import JobSpec, JobSpecError, ShotOptions  # noqa: E402

REPEATS = 20


@pytest.fixture(scope="module")
def shot(tmp_path_factory):
    root = tmp_path_factory.mktemp("runner")
    return write_shot(root / "in", 2, noise=True), drifting_depth_model(root / "drift.onnx")


def _spec(frames: Path, model: Path, output: Path) -> JobSpec:
    return JobSpec("da3", model=str(model), source=str(frames / "shot_####.png"), output=str(output / "d_####.png"),
                   device="cpu", shot=ShotOptions(depth_range="auto-shot"))


def _pumped(runner: Runner):
    worker = threading.Thread(target=runner.infer_all, daemon=True)
    worker.start()
    while not runner.pump(0.01):
        pass
    worker.join(30)
    return runner.report


def test_a_pumped_two_frame_shot_writes_what_run_writes_every_time(shot, tmp_path):
    frames, model = shot
    lines = []
    run = Runner(_spec(frames, model, tmp_path / "run"), ImageFileFrames(), events=RunEvents(line=lines.append))
    assert run.run().written == [1, 2]
    assert lines[0].startswith("first pass:") and lines[1].startswith("shot depth range:")
    reference = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    for attempt in range(REPEATS):
        out = tmp_path / f"pumped{attempt}"
        runner = Runner(_spec(frames, model, out), ImageFileFrames())
        report = _pumped(runner)
        assert (report.written, report.failed) == ([1, 2], []), f"attempt {attempt}: {report.summary()}"
        assert runner.shot_line == lines[1]
        assert {p.name: p.read_bytes() for p in out.iterdir()} == reference, f"attempt {attempt}"


def test_the_runner_holds_one_output_that_plans_claims_and_records_what_it_wrote(shot, tmp_path):
    """One owner of the plan: the runner's JobOutput (models/outputs.py) names the files, and
    every file the run writes is recorded there, none elsewhere."""
    frames, model = shot
    spec = replace(_spec(frames, model, tmp_path / "out"), shot=ShotOptions())
    runner = Runner(spec, ImageFileFrames())
    assert list(runner.output.targets) == runner.refs and runner.outputs == list(runner.output.targets.values())
    assert runner.run().written == [1, 2]
    assert runner.output.written == runner.outputs == [tmp_path / "out" / f"d_{n:04d}.png" for n in (1, 2)]


def test_results_that_are_not_files_go_to_the_front_end(shot, tmp_path):
    frames, model = shot
    taken = []
    spec = replace(_spec(frames, model, tmp_path / "never"), output=None, writes_files=False)
    runner = Runner(spec, ImageFileFrames(), events=RunEvents(take=lambda ref, result: taken.append(ref.number)))
    report = runner.run()
    assert taken == [1, 2] and report.written == [1, 2]
    assert not (tmp_path / "never").exists() and runner.outputs == []


# -- the runner trusts nothing of a job it receives (issue 39, item 8): one ValueError naming the
# field before any model is resolved or any file touched ---------------------------------------------
def _chunk(frames: Path, model: Path, outputs: list, numbers=(1, 2)) -> JobSpec:
    return JobSpec("da3", model=str(model), device="cpu", farm=True,
                   frame_list=[(n, str(frames / f"shot_{n:04d}.png")) for n in numbers],
                   output_list=[str(out) for out in outputs])


def _refused(spec, *, named: str) -> str:
    with pytest.raises(ValueError) as caught:
        Runner(spec, ImageFileFrames()).run()
    assert isinstance(caught.value, JobSpecError), caught.value
    message = str(caught.value)
    assert named in message and "\n" not in message, message
    return message


def test_a_chunk_whose_output_is_an_input_is_refused_and_the_input_kept(shot, tmp_path):
    frames, model = shot
    before = {p.name: p.read_bytes() for p in frames.iterdir()}
    # frame 1 written over its own input, then over frame 2's input named another way
    _refused(_chunk(frames, model, [frames / "shot_0001.png"], numbers=(1,)), named="shot_0001.png")
    _refused(_chunk(frames, model, [tmp_path / "d1.png", frames / ".." / frames.name / "shot_0002.png"]),
             named="input of frame 2")
    assert {p.name: p.read_bytes() for p in frames.iterdir()} == before


def test_two_frames_of_a_chunk_with_one_output_are_refused(shot, tmp_path):
    frames, model = shot
    _refused(_chunk(frames, model, [tmp_path / "d.png", tmp_path / "d.png"]), named="frames 1 and 2")
    assert not (tmp_path / "d.png").exists()


def test_each_bad_field_is_one_value_error_naming_it(shot, tmp_path):
    frames, model = shot
    good = _chunk(frames, model, [tmp_path / "a.png", tmp_path / "b.png"])
    cases = {  # field set after the job was built: the runner checks it again
        "output_list": {"output_list": [str(tmp_path / "a.png")]},
        "frames": {"frame_list": None, "output_list": None, "source": str(frames / "shot_####.png"), "frames": (1, 4, 0)},
        "frame_list": {"frame_list": [(-1, str(frames / "shot_0001.png")), (2, str(frames / "shot_0002.png"))]},
        "family_id": {"family_id": "nope"},
        "values.tile_size": {"family_id": "upscale", "values": {"tile_size": "abc"}},
        "values: zoom": {"values": {"zoom": 2}},
        "values.make_plane": {"values": {"make_plane": "no"}},
    }
    for named, changes in cases.items():
        spec = replace(good)
        for name, value in changes.items():
            setattr(spec, name, value)
        _refused(spec, named=named)
        with pytest.raises(JobSpecError, match=named.split(":")[0]):  # building it so is refused as well
            replace(good, **changes) if named.startswith(("output_list", "frame")) else job_checks.checked(spec)
    assert not list(tmp_path.iterdir())
    assert Runner(good, ImageFileFrames()).run().written == [1, 2]  # the good chunk runs
def test_reading_image_files_needs_no_front_end():
    """The file frames are the core's (models/batch/frame_io.py): a front-end of its own reads and
    writes image files without importing the command line or Blender's code, and they have every
    member of the one frame-IO interface."""
    code = (
        "import json, sys\n"
        "from lean_image_ai.models.batch.frame_io import FrameIO, ImageFileFrames\n"
        "wanted = sorted({*FrameIO.__annotations__, *(n for n in vars(FrameIO) if not n.startswith('_'))})\n"
        "front_ends = sorted(m for m in sys.modules if m.startswith(('lean_image_ai.ui', 'lean_image_ai.operators')))\n"
        "print(json.dumps({'wanted': wanted, 'lacking': [n for n in wanted if not hasattr(ImageFileFrames, n)],\n"
        "                  'front_ends': front_ends, 'pillow': 'PIL' in sys.modules}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["wanted"] == ["check_format", "input_kind", "read", "write_image", "writer"]
    assert found["lacking"] == [] and found["front_ends"] == [] and not found["pillow"]  # Pillow only on a read


def test_the_pumped_objects_declare_one_interface():
    """The runner, its batches and the worker's calls are pumped by a host the same way
    (models/batch/sequence.py Pumped and PumpedBatch): each has every member the host uses."""
    import inspect

    from lean_image_ai.models.batch import report, sequence, shot_batch
    from lean_image_ai.models.worker import remote_batch, remote_call

    def members(protocol) -> set:
        return {n for klass in protocol.__mro__ if klass.__name__ in ("Pumped", "PumpedBatch")
                for n in vars(klass) if not n.startswith("_")}

    def has(cls, name) -> bool:
        return hasattr(cls, name) or f"self.{name} =" in inspect.getsource(cls)

    batches = (sequence.BatchRun, remote_batch.RemoteBatchRun, shot_batch.TwoPassBatch, Runner)
    assert members(report.PumpedBatch) == {"pump", "cancel", "report", "needs_model"}
    for cls in batches:
        assert [n for n in members(report.PumpedBatch) if not has(cls, n)] == [], cls.__name__
    assert [n for n in members(report.Pumped) if not has(remote_call.RemoteCall, n)] == []
