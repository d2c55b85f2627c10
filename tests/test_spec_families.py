"""The spec's cross-family scenarios: BEN2, DA3, MoGe-2 and Upscale follow the same session
retention and release semantics, and release does not change their results."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from builders_families import ben2_like_model, da3_like_model
from builders_moge2 import moge2_like_model
from lean_image_ai.models import families
from lean_image_ai.models.adapters import ben2, da3, moge2, upscale
from lean_image_ai.models.base import RunOptions
from lean_image_ai.runtime import Runtime, RuntimeSettings
from onnx_builders import sr_model
from recording import RecordingFactory

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("families")
    return {
        "ben2": (ben2.run, ben2_like_model(folder / "ben2.onnx", size=64), {}),
        "da3": (da3.run, da3_like_model(folder / "da3.onnx", fixed_hw=(56, 84)), {}),
        "moge2": (moge2.run, moge2_like_model(folder / "moge2.onnx"), {"resolution_level": 0}),
        "upscale": (upscale.run, sr_model(folder / "sr.onnx", scale=2), {"tile_size": 32, "overlap": 4}),
    }


def frames(count=2):
    rng = np.random.default_rng(7)
    return [rng.random((40, 56, 3), dtype=np.float32) for _ in range(count)]


@pytest.mark.parametrize("family", families.IDS)
def test_every_family_keeps_its_session_and_releases_only_on_the_final_run(family_models, family):
    run, model, kwargs = family_models[family]
    factory = RecordingFactory()
    runtime = Runtime(session_factory=factory)
    options = RunOptions(device="cpu", runtime=runtime)
    run(frames(), model, options=options, **kwargs)
    first_entries = factory.shrink_entries
    assert len(first_entries) >= 2, "two frames (and tiles for upscale) are several runs"
    assert first_entries[-1] == "cpu:0" and set(first_entries[:-1]) == {""}
    run(frames(1), model, options=options, **kwargs)
    assert len(factory.calls) == 1, f"{family}: the second job must reuse the loaded session"
    assert factory.shrink_entries[len(first_entries) :][-1] == "cpu:0"


def _arrays(result):
    """Every array of a result dataclass, dict fields (DA3's extras) included, by name."""
    arrays = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if isinstance(value, np.ndarray):
            arrays[f.name] = value
        elif isinstance(value, dict):
            arrays.update({f"{f.name}.{k}": v for k, v in value.items() if isinstance(v, np.ndarray)})
    return arrays


def _job(family_models, family, release, jobs=1):
    """`jobs` runs of the family's whole job (three frames; upscale tiled with a tile smaller than
    the frame) through its adapter, on a recorded runtime with release on or off."""
    run, model, kwargs = family_models[family]
    if family == "upscale":
        kwargs = {**kwargs, "tile_size": 16}  # 40x56 frames in 16 px windows: several tiles each
    factory = RecordingFactory()
    runtime = Runtime(RuntimeSettings(release_memory=release), session_factory=factory)
    options = RunOptions(device="cpu", runtime=runtime)
    try:
        products = [run(frames(3), model, options=options, **kwargs) for _ in range(jobs)]
    finally:
        runtime.clear("test teardown")
    return products, factory


@pytest.mark.parametrize("family", families.IDS)
def test_every_family_returns_the_same_result_with_release_on_and_off(family_models, family):
    """Whole job products (every array of every frame's result) are identical with release on and
    off; the "on" jobs really sent the shrink entry on their final run only, the "off" job never,
    and both ran on the real onnxruntime. The second "on" job runs on the arena the first one
    shrank, so it also shows that a release leaves later results untouched."""
    (first_on, second_on), on = _job(family_models, family, release=True, jobs=2)
    (off_products,), off = _job(family_models, family, release=False)

    runs_per_job = len(off.runs)
    assert runs_per_job >= 3, "three frames are at least three runs"
    if family == "upscale":
        assert runs_per_job >= 3 * 4, "a tile smaller than the frame: several runs per frame"
    assert off.shrink_entries == [""] * runs_per_job, "release off: no run carries the entry"
    assert on.shrink_entries == ([""] * (runs_per_job - 1) + ["cpu:0"]) * 2, (
        "release on: only each job's final run carries the entry"
    )
    for factory in (on, off):
        assert len(factory.sessions) == 1, "one cached session for both jobs"
        assert isinstance(factory.sessions[0].real, ort.InferenceSession)
        assert factory.sessions[0].real.get_providers() == ["CPUExecutionProvider"]
        assert all(record["ok"] for record in factory.runs), "every run went through onnxruntime"
    assert [r["shape"] for r in on.runs] == [r["shape"] for r in off.runs] * 2

    for products in (first_on, second_on):
        assert len(products) == len(off_products) == 3
        for index, (with_release, without) in enumerate(zip(products, off_products, strict=True)):
            a, b = _arrays(with_release), _arrays(without)
            assert a.keys() == b.keys() and a, (family, index)
            for name, array in a.items():
                other = b[name]
                assert array.shape == other.shape and array.dtype == other.dtype, (family, index, name)
                assert np.array_equal(array, other, equal_nan=True), (family, index, name)


UPSCALE_OOM = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from onnx_builders import sr_model
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.base import RunOptions
from lean_image_ai.runtime import InferenceOutOfMemoryError, Runtime, RuntimeSettings

# 256 KiB arena: even the floor tile (32 px) needs a 512 KiB 128-channel intermediate
runtime = Runtime(RuntimeSettings(cpu_arena_max_bytes=256 << 10))
model = sr_model(sys.argv[2], scale=2, mid_channels=128)
report = {}
try:
    upscale.run(np.random.default_rng(0).random((256, 256, 3), dtype=np.float32), model,
                options=RunOptions(device="cpu", runtime=runtime), tile_size=256, overlap=4)
except InferenceOutOfMemoryError as exc:
    report = {"message": str(exc), "resource": exc.resource, "model": exc.model}
report["cached_sessions"] = len(runtime.cached_sessions())
report["evictions"] = len(runtime.events.recent("session_evict"))
report["splits"] = len(runtime.events.recent("tile_split"))
print(json.dumps(report))
"""


def test_upscale_provider_resource_failure_releases_the_session_and_reports_readably(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", UPSCALE_OOM, str(TESTS), str(tmp_path / "sr.onnx")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["message"].startswith("Out of system memory while running sr.onnx on CPU"), report
    assert report["resource"] == "system memory"
    assert report["cached_sessions"] == 0, "the failed Upscale session must not stay cached"
    assert report["evictions"] == report["splits"] + 1 >= 2, "it split down to the floor before giving up"
