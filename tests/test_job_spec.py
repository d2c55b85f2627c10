"""The job as data (models/job_spec.py): what a front-end builds pickles and goes through JSON
unchanged, so a farm or a worker process runs the very job that was built."""

from __future__ import annotations

import pickle

import pytest
from lean_image_ai.models.job_spec import JobSpec, ShotOptions


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
