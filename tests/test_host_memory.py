"""Issue #37 item 5: Blender's memory stays flat through the Upscale button.

Real bpy 5.0.1 in a process of its own (tests/host_memory_job.py): 1024x1024 -> 2048x2048 with the
built-in bicubic x2, three jobs per phase after a warm-up job, through ``bpy.ops``. Every figure is
compared with another of the same run (one result's pixel bytes), never with bytes measured on
this machine: with each result removed Blender's RSS comes back to where it was (it grew by
~250 MiB over three jobs before: reference cycles BlenderJob <-> task and Runner <-> pass held every
array until Python's collector ran); with the results kept it grows by no more than their pixels
plus one result's worth.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

pytest.importorskip("bpy")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS after glibc's malloc_trim")

TESTS = Path(__file__).resolve().parent


def run_host_memory_job(root: Path, phases: list[str], *, side: int = 1024, jobs: int = 3) -> dict:
    """tests/host_memory_job.py in a fresh bpy process with an empty models folder; its JSON."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "models").mkdir(exist_ok=True)
    env = bh.isolated_blender_env(root / "blender", pythonpath=[bh.package_search_dir(root / "pkg")])
    env.update(LEAN_IMAGE_AI_MODELS_DIR=str(root / "models"), LEAN_IMAGE_AI_LOG_DIR=str(root / "logs"))
    config = {"side": side, "jobs": jobs, "folder": str(root), "out": str(root / "out.json"), "phases": phases}
    (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
    done = subprocess.run([sys.executable, str(TESTS / "host_memory_job.py"), str(root / "config.json")],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((root / "out.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return run_host_memory_job(tmp_path_factory.mktemp("host_memory"), ["refs", "removed", "kept"])


def test_no_reference_cycle_holds_a_finished_jobs_arrays(measured):
    """With Python's cycle collector off, the task and every array of the job (source pixels, model
    input, result) are gone once the job is over and its result image removed."""
    refs = measured["refs"]
    assert refs["watched"] == ["model_input", "result", "source_pixels", "task"], refs
    assert refs["alive"] == [], f"still alive after the job and its image were removed: {refs['alive']}"


def test_blender_rss_comes_back_after_upscale_jobs_whose_results_are_removed(measured):
    removed, kept = measured["removed"], measured["kept"]
    one_result = kept["one_result_pixel_bytes"]
    assert kept["result_size"] == [2048, 2048]
    growth = removed["rss_after"] - removed["rss_before"]
    assert growth < one_result / 2, (
        f"Blender's RSS grew {growth / 2**20:.1f} MiB over 3 jobs whose results were removed "
        f"(one result's pixels: {one_result / 2**20:.1f} MiB)"
    )


def test_blender_rss_grows_by_no_more_than_the_kept_results(measured):
    kept = measured["kept"]
    assert kept["results"] == 3
    growth = kept["rss_after"] - kept["rss_before"]
    allowed = kept["result_pixel_bytes"] + kept["one_result_pixel_bytes"]
    assert growth < allowed, (
        f"Blender's RSS grew {growth / 2**20:.1f} MiB with 3 results kept whose pixels weigh "
        f"{kept['result_pixel_bytes'] / 2**20:.1f} MiB"
    )


class _FailingBatch:
    """A batch whose model fails while a frame is in hand: the error's traceback holds that frame."""

    report = None

    def __init__(self):
        self.frames = []  # weak references to the frames it had in hand

    def pump(self, budget):
        import weakref

        import numpy as np

        frame = np.ones((64, 64, 4), np.float32)
        self.frames.append(weakref.ref(frame))
        raise ValueError("the model failed")

    def cancel(self):
        pass


def test_a_failed_jobs_error_holds_none_of_its_arrays():
    """The lane keeps a failed job for the panel (its text); the exception's traceback, whose
    frames hold their locals (the frame being worked on), goes when the job ends."""
    import gc

    jobs = bh.import_submodule("operators.jobs")
    lane = jobs.JobLane("busy")
    job = lane.begin("Upscale")
    batch = _FailingBatch()
    gc.collect()
    gc.disable()
    try:
        job.task = jobs.PumpedTask(job, batch)
        assert job.task.pump(0.05) and job.state == "failed"
        lane.end(job)
        assert lane.last is job and isinstance(job.error, ValueError) and job.error_text == "Unexpected error: ValueError: the model failed"
        assert batch.frames and batch.frames[0]() is None, "the failed job's error still holds the frame it failed on"
    finally:
        gc.enable()
