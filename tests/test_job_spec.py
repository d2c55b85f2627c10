"""The job as data (models/job_spec.py): what a front-end builds pickles and goes through JSON
unchanged, so a farm or a worker process runs the very job that was built."""

from __future__ import annotations

import json
import pickle
from dataclasses import fields

import pytest
from lean_image_ai.models.job_spec import JobSpec, JobSpecError, ShotOptions


def full_spec() -> JobSpec:
    return JobSpec(
        "da3", model="da3-small", models_dir="/models", source="/shots/plate_####.exr", output="/out/d_####.exr",
        overwrite=True, shard=(2, 3), stop_on_error=True, values={"max_side": 518}, device="cuda:1",
        ram_budget=2**30, vram_budget=None, frame_list=[(1001, "/shots/plate_1001.exr")],
        output_list=["/out/d_1001.exr"], shot=ShotOptions(depth_range="auto-shot", align_depth=True, fov=55.5, preview=1001),
    ).with_frames(range(1001, 1101, 2))


def test_a_job_pickles_and_round_trips_through_json():
    spec = full_spec()
    assert pickle.loads(pickle.dumps(spec)) == spec
    again = JobSpec.from_json(spec.to_json())
    assert again == spec
    assert again.frame_range == range(1001, 1101, 2) and again.shard == (2, 3)
    assert again.budgets.ram_bytes == 2**30 and again.budgets.vram_bytes is None


def test_a_job_from_another_version_is_refused_by_its_unknown_field():
    text = full_spec().to_json().replace('"device"', '"gpu_kind"')
    with pytest.raises(ValueError, match="gpu_kind"):
        JobSpec.from_json(text)


# -- a job received as data (issue 39, item 7): one ValueError naming the field, never a TypeError,
# an AttributeError, a RecursionError or a wrong value passed on ------------------------------------
def _job(**fields) -> str:
    return json.dumps({"family_id": "da3", **fields})


BAD_JSON = [  # (JSON text, what the one line must name)
    ("42", "JSON object"),
    ("null", "JSON object"),
    ("[1, 2]", "JSON object"),
    ('"da3"', "JSON object"),
    ("{}", "family_id"),
    ('{"model": "x"}', "family_id"),
    (_job(shot={"zoom": 2}), "zoom"),
    (_job(shot=None), "shot"),
    (_job(shot=[1]), "shot"),
    ("[" * 100_000 + "]" * 100_000, "nested"),
    ('{"family_id": "da3", "values": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001, "nested"),
    (_job(frames="abc"), "frames"),
    (_job(frames=[1, 4]), "frames"),
    (_job(frames=[1, 4, 0]), "frames"),
    (_job(frames=[-3, 4, 1]), "frames"),
    (_job(frames=[1.5, 4, 1]), "frames"),
    (_job(overwrite="no"), "overwrite"),
    (_job(skip_existing=1), "skip_existing"),
    (_job(in_sequence="yes"), "in_sequence"),
    (_job(ram_budget=-5), "ram_budget"),
    (_job(vram_budget="2G"), "vram_budget"),
    (_job(ram_budget=True), "ram_budget"),
    (_job(device=0), "device"),
    (_job(family_id=7), "family_id"),
    (_job(family_id=""), "family_id"),
    (_job(source=["a.png"]), "source"),
    (_job(output_list="b.png"), "output_list"),
    (_job(output_list=["b.png"]), "output_list"),  # no frame_list to match
    (_job(frame_list=[[1, "a.png"]], output_list=["b.png", "c.png"]), "output_list"),
    (_job(frame_list="a.png"), "frame_list"),
    (_job(frame_list=[[1, "a.png", "x"]]), "frame_list"),
    (_job(frame_list=[[-1, "a.png"]]), "frame_list"),
    (_job(frame_list=[["1", "a.png"]]), "frame_list"),
    (_job(shard=[0, 3]), "shard"),
    (_job(shard="1/3"), "shard"),
    (_job(values=[1]), "values"),
    (_job(values={"tile_size": [1]}), "values.tile_size"),
    (_job(shot={"fov": "wide"}), "shot.fov"),
    (_job(shot={"preview": -1}), "shot.preview"),
    (_job(shot={"align_depth": "yes"}), "shot.align_depth"),
    ("{not json", "JSON"),
    (b"\xff\xfe", "UTF-8"),
]


@pytest.mark.parametrize(("text", "named"), BAD_JSON, ids=[f"{i}-{n}" for i, (_, n) in enumerate(BAD_JSON)])
def test_a_bad_job_is_one_value_error_naming_the_field(text, named):
    with pytest.raises(ValueError) as caught:
        JobSpec.from_json(text)
    assert isinstance(caught.value, JobSpecError)  # also the front-ends' one-line error
    message = str(caught.value)
    assert named in message and "\n" not in message and len(message) < 300, message


def test_building_a_job_checks_the_same_fields():
    with pytest.raises(JobSpecError, match="frames"):
        JobSpec("da3", frames=(1, 4, 0))
    with pytest.raises(JobSpecError, match="overwrite"):
        JobSpec("da3", overwrite="no")
    with pytest.raises(JobSpecError, match="shot.fov"):
        ShotOptions(fov=float("nan"))
    with pytest.raises(JobSpecError, match="frames"):
        JobSpec("da3").with_frames(range(5, 1))


def test_a_job_holding_paths_goes_through_json_as_their_text(tmp_path):
    spec = JobSpec("da3", source=tmp_path / "in_####.png", output=tmp_path / "out", model_path=tmp_path / "m.onnx",
                   frame_list=[(1, tmp_path / "in_0001.png")], output_list=[tmp_path / "out" / "d_0001.png"])
    again = JobSpec.from_json(spec.to_json())
    assert again == spec and again.source == str(tmp_path / "in_####.png")
    assert again.frame_list == [(1, str(tmp_path / "in_0001.png"))]
    spec.output = tmp_path / "elsewhere"  # set after it was built: still written as text
    assert json.loads(spec.to_json())["output"] == str(tmp_path / "elsewhere")


# a value unlike the default for every field: a field added without one here fails the next test
EXAMPLES = {
    "family_id": "ben2", "model": "da3-small", "model_path": "/m/x.onnx", "models_dir": "/models",
    "source": "/in/p_####.exr", "frames": (10, 21, 5), "frame_list": [(7, "/in/a.png"), (0, "/in/b b é.png")],
    "output": "/out/o_####.exr", "output_list": ["/out/a.png", "/out/b.png"], "writes_files": False,
    "in_sequence": True, "overwrite": True, "skip_existing": True, "shard": (3, 4), "stop_on_error": True,
    "values": {"max_side": 518, "flag": True, "ratio": 0.25, "word": "x"}, "device": "cuda:1",
    "ram_budget": 3 << 30, "vram_budget": 1 << 20, "farm": True,
    "shot": ShotOptions(depth_range="0.5:40", align_depth=True, camera="shot", fov=55.5, preview=12),
}
SHOT_EXAMPLES = {"depth_range": "auto-shot", "align_depth": True, "camera": "shot", "fov": 30, "preview": 0}


def test_a_round_trip_keeps_every_field_alone_and_all_together():
    assert set(EXAMPLES) == {f.name for f in fields(JobSpec)}
    assert set(SHOT_EXAMPLES) == {f.name for f in fields(ShotOptions)}
    needs = {"output_list": "frame_list"}  # one output per frame: never without the frames
    specs = [JobSpec("da3", **{name: value}, **{n: EXAMPLES[n] for n in [needs.get(name)] if n})
             for name, value in EXAMPLES.items() if name != "family_id"]
    specs += [JobSpec("da3", shot=ShotOptions(**{name: value})) for name, value in SHOT_EXAMPLES.items()]
    specs += [JobSpec(**EXAMPLES), JobSpec(EXAMPLES["family_id"])]
    for spec in specs:
        again = JobSpec.from_json(spec.to_json())
        assert again == spec and again.to_json() == spec.to_json()
        assert pickle.loads(pickle.dumps(spec)) == spec
