"""RAM given back once jobs stop coming (RuntimeSettings.cpu_release_delay, deferred_release.py):
jobs that follow each other find the CPU arena warm, and the memory still goes back after the
delay; GPU arenas and failed jobs are released as before."""

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from builders_upscale import compact_model
from lean_image_ai.runtime import Runtime, RuntimeSettings, mark_last
from onnx_builders import conv_model
from polling import wait_until
from recording import RecordingFactory


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conv_model(tmp_path_factory.mktemp("models") / "conv.onnx")


def frame(seed=0, size=32):
    return np.random.default_rng(seed).random((1, 3, size, size), dtype=np.float32)


def job(runtime, model, frames=1, *, inside=None):
    with runtime.operation("test") as op:
        handle = op.session(model, "cpu")
        for seed, last in mark_last(range(frames)):
            op.run(handle, {"x": frame(seed)}, last=last)
        if inside is not None:
            inside()
    return op


def deferred_releases(runtime):
    return [e for e in runtime.events.recent("memory_freed") if e["action"] == "deferred release"]


def test_no_run_carries_the_cpu_shrink_and_the_report_says_when_ram_goes_back(conv):
    factory = RecordingFactory()
    runtime = Runtime(RuntimeSettings(cpu_release_delay=60), session_factory=factory)
    first = job(runtime, conv, frames=3)
    job(runtime, conv)
    assert factory.sessions[0].shrink_entries == ["", "", "", ""]
    assert runtime.events.recent("memory_release") == [] and deferred_releases(runtime) == []
    assert runtime.deferred.pending
    assert first.memory["release_deferred_s"] == 60
    assert any(
        "the release is deferred: RAM goes back after 60 s without a job" in line
        for line in first.memory["lines"]
    )
    assert runtime.deferred.settle() is True
    assert len(deferred_releases(runtime)) == 1 and not runtime.deferred.pending
    assert runtime.deferred.settle() is False, "nothing is owed twice"


def test_the_release_comes_once_no_job_started_for_the_delay(conv):
    runtime = Runtime(RuntimeSettings(cpu_release_delay=0.05))
    job(runtime, conv)
    wait_until(lambda: not runtime.deferred.pending, "the deferred release")
    [freed] = deferred_releases(runtime)  # pending until the release is done, not just begun
    assert set(freed["by"]) == {"ram"} and not runtime.deferred.pending
    runtime.clear("test teardown")


def test_no_deferred_release_runs_while_a_job_runs(conv):
    runtime = Runtime(RuntimeSettings(cpu_release_delay=0.05))
    seen_during = []

    def long_job():  # the first job's timer would have come due several times over
        time.sleep(0.5)
        seen_during.append(len(deferred_releases(runtime)))

    job(runtime, conv)
    before = len(deferred_releases(runtime))  # 0, or 1 if this machine paused between the jobs
    job(runtime, conv, inside=long_job)
    assert seen_during == [before]
    wait_until(lambda: len(deferred_releases(runtime)) == before + 1, "the release after the long job")
    runtime.clear("test teardown")


def test_overlapping_jobs_release_after_the_last_one_ends(conv):
    runtime = Runtime(RuntimeSettings(cpu_release_delay=0.05))
    second_started, first_ended = threading.Event(), threading.Event()
    seen = []

    def hold_until_the_first_ended():
        second_started.set()
        first_ended.wait(30)
        time.sleep(0.5)  # the first job's end must not have started the timer
        seen.append(len(deferred_releases(runtime)))

    other = threading.Thread(target=job, args=(runtime, conv), kwargs={"inside": hold_until_the_first_ended})

    def start_the_second():
        other.start()
        second_started.wait(30)

    job(runtime, conv, inside=start_the_second)
    first_ended.set()
    other.join(60)
    assert seen == [0]
    wait_until(lambda: len(deferred_releases(runtime)) == 1, "one release after both jobs")
    runtime.clear("test teardown")


def test_a_failed_job_still_releases_at_once(conv):
    factory = RecordingFactory()
    runtime = Runtime(RuntimeSettings(cpu_release_delay=60), session_factory=factory)
    with pytest.raises(RuntimeError, match="boom"):
        with runtime.operation("fails") as op:
            handle = op.session(conv, "cpu")
            op.run(handle, {"x": frame()}, last=False)
            raise RuntimeError("boom")
    assert [e["reason"] for e in runtime.events.recent("memory_release")] == ["error"]
    runtime.clear("test teardown")


def test_release_now_settles_what_is_owed(conv):
    runtime = Runtime(RuntimeSettings(cpu_release_delay=60))
    job(runtime, conv)
    assert runtime.deferred.pending
    runtime.release_now()
    assert not runtime.deferred.pending
    runtime.clear("test teardown")


def test_jobs_in_a_row_find_the_arena_warm_and_the_memory_still_comes_back(tmp_path):
    """In a fresh process (RSS and page-fault counts of a process that ran other tests say little):
    a job that follows others faults its working memory in again after a release at the last run,
    and far less with the release deferred; once settled, the deferred release gives back
    most of what the job grew."""
    code = """
        import resource, numpy as np
        from lean_image_ai.runtime import Runtime, RuntimeSettings
        from lean_image_ai.runtime.measure.memory import process_rss_bytes
        from lean_image_ai.models.adapters import upscale
        from lean_image_ai.models.base import RunOptions
        import sys
        model = sys.argv[1]
        image = np.random.default_rng(0).random((512, 512, 3), dtype=np.float32)
        faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for delay in (0, 600):
            runtime = Runtime(RuntimeSettings(cpu_release_delay=delay))
            options = RunOptions(device="cpu", runtime=runtime)
            before = process_rss_bytes()
            for _ in range(2):  # onnxruntime plans a shape's memory pattern on its first run
                upscale.run(image, model, options=options)
            grown = process_rss_bytes() - before
            start = faults()
            result = upscale.run(image, model, options=options)
            second = faults() - start
            del result
            kept = process_rss_bytes()
            runtime.deferred.settle()
            print(second, grown, kept - process_rss_bytes())
            runtime.clear("done")
    """
    model = compact_model(tmp_path / "compact_x4.onnx", num_conv=2, feat=16, scale=4)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(model)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    (faults_at_once, _, _), (faults_deferred, grown, given_back) = [
        tuple(map(int, line.split())) for line in done.stdout.splitlines()
    ]
    assert faults_deferred < faults_at_once / 2, (faults_deferred, faults_at_once)
    assert given_back > grown / 4, f"settling the deferred release gave back {given_back} of {grown} bytes"


def test_headless_knob_sets_the_delay_and_a_wrong_one_says_what_it_wants(monkeypatch):
    from lean_image_ai.runtime import settings as core

    monkeypatch.delenv("LEAN_IMAGE_AI_RAM_RELEASE_DELAY", raising=False)
    assert core.settings_from_environment().cpu_release_delay == 0.0
    monkeypatch.setenv("LEAN_IMAGE_AI_RAM_RELEASE_DELAY", "2.5")
    assert core.settings_from_environment().cpu_release_delay == 2.5
    for wrong in ("soon", "-1", "nan"):
        monkeypatch.setenv("LEAN_IMAGE_AI_RAM_RELEASE_DELAY", wrong)
        with pytest.raises(ValueError, match="seconds without a job"):
            core.settings_from_environment()


# ---- the bound outputs' buffers are kept warm with the arena, and go back with it ------------


@pytest.fixture(scope="module")
def compact(tmp_path_factory):
    return compact_model(tmp_path_factory.mktemp("models") / "compact.onnx", num_conv=2, feat=8, scale=2)


def image(seed, size=48):
    return np.random.default_rng(seed).random((size, size, 3), dtype=np.float32)


@pytest.mark.parametrize(
    "settings, kept_after_the_job",
    [
        (RuntimeSettings(), False),  # RAM back at each job's end: nothing kept
        (RuntimeSettings(cpu_release_delay=60), True),
        (RuntimeSettings(release_memory=False), True),
    ],
)
def test_output_buffers_are_kept_only_while_the_arena_is(compact, settings, kept_after_the_job):
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions

    runtime = Runtime(settings)
    result = upscale.run(image(0), compact, options=RunOptions(device="cpu", runtime=runtime), tile_size=None)
    output_bytes = result.image[..., :3].size * 4
    assert (runtime.scratch.kept_bytes >= output_bytes) is kept_after_the_job
    runtime.release_now()  # the deferred release, Release Now, an unload: all go through the CPU release
    assert runtime.scratch.kept_bytes == 0
    runtime.clear("test teardown")


def test_jobs_at_once_each_get_their_own_buffer_and_results_match_jobs_one_by_one(compact):
    """Two threads upscaling different images at once on one runtime, edge tiles included (their
    outputs are bound to a prefix of the full tile's buffer): each gets the pixels it gets alone."""
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions

    runtime = Runtime(RuntimeSettings(cpu_release_delay=60))
    options = RunOptions(device="cpu", runtime=runtime)
    images = [image(seed, size=70) for seed in range(4)]
    alone = [upscale.run(i, compact, options=options, tile_size=32).image for i in images]
    together = [None] * len(images)

    def work(index):
        for _ in range(3):
            together[index] = upscale.run(images[index], compact, options=options, tile_size=32).image

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(images))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for expected, got in zip(alone, together, strict=True):
        np.testing.assert_array_equal(got, expected)
    runtime.clear("test teardown")
