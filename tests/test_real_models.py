"""The product on the real architectures: Real-ESRGAN's compact x4 and RRDBNet x4plus (spandrel),
MoGe-2 ViT-S (dlr-moge), DA3-SMALL (depth-anything-3) and BEN2 Base (PramaLLC/BEN2's model file,
vendored in tools/), exported with seeded weights by tools/reference_models.py.

The exports are cached outside the repository (`$LEAN_IMAGE_AI_REFERENCE_DIR`, else
~/.cache/lean_image_ai/reference_models): the first run on a machine exports them (about five
minutes on two cores, three of them BEN2), later runs reuse them. torch runs only in the export's own process.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from lean_image_ai.models.adapters import da3, moge2_contract, upscale
from lean_image_ai.models.base import RunOptions
from lean_image_ai.models.model_run import ModelRun
from lean_image_ai.models.store import family_check
from lean_image_ai.models.tiles.receptive import graph_receptive_field
from lean_image_ai.runtime.errors import ModelContractError

pytestmark = pytest.mark.real_models

TOOL = Path(__file__).resolve().parents[1] / "tools" / "reference_models.py"
SR_MODELS = ("compact-x4", "rrdb-x4plus")
PROBE_SIDE = 97  # an impulse probe's window (2 * PROBE_RADIUS + 1): no run may have it


def _tool():
    spec = importlib.util.spec_from_file_location("reference_models", TOOL)
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)  # imports no torch: the tool imports it only to export
    return module


def _missing(*packages) -> list[str]:
    return [name for name in packages if importlib.util.find_spec(name) is None]


def _export(names) -> dict:
    tool = _tool()
    directory = tool.reference_dir()
    done = subprocess.run(
        [sys.executable, str(TOOL), "--only", *names, "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, f"reference export failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    manifest = tool.load_manifest(directory)
    return {name: directory / manifest["models"][name]["file"] for name in names}


@pytest.fixture(scope="session")
def sr_models() -> dict:
    missing = _missing("torch", "spandrel")
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed: pip install -e '.[dev,reference]' to export the real models")
    return _export(SR_MODELS)


@pytest.fixture(scope="session")
def moge2_vits() -> Path:
    missing = _missing("torch", "moge")
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed: pip install -e '.[dev,reference]' (dlr-moge)")
    return _export(["moge2-vits"])["moge2-vits"]


@pytest.fixture(scope="session")
def da3_small() -> Path:
    missing = _missing("torch", "depth_anything_3")
    if missing:  # not in the reference extra: its package pins numpy<2 and asks for xformers
        pytest.skip(
            f"{' and '.join(missing)} not installed: pip install omegaconf addict && pip install --no-deps depth-anything-3"
        )
    return _export(["da3-small"])["da3-small"]


@pytest.fixture(scope="session")
def da3_small_dynamic(da3_small) -> Path:  # the same package needs (da3_small skips without them)
    return _export(["da3-small-dynamic"])["da3-small-dynamic"]


@pytest.fixture(scope="session")
def ben2_base() -> Path:
    if _missing("torch"):  # torch only: the model file is vendored (tools/ben2_model.py)
        pytest.skip("torch not installed: pip install -e '.[dev,reference]' to export the real models")
    return _export(["ben2-base"])["ben2-base"]


def picture(h, w, seed=0):
    return np.random.default_rng(seed).random((h, w, 3), dtype=np.float32)


def opts(runtime):
    return RunOptions(device="cpu", runtime=runtime)


@pytest.mark.parametrize("name,radius", [("compact-x4", 34), ("rrdb-x4plus", 349)])
def test_the_graph_walk_reads_the_real_radius(sr_models, name, radius):
    found = graph_receptive_field(sr_models[name])  # torch.onnx.export's Resize scales: Constant nodes
    assert (found.radius, found.how, found.proven, found.scale) == (radius, "graph", True, 4.0)


def test_compact_tiles_equal_one_whole_run_with_no_probe(sr_models, recorded):
    runtime, factory = recorded
    image = picture(96, 80, seed=5)
    whole = upscale.run(image, sr_models["compact-x4"], options=opts(runtime), tile_size=None)
    assert factory.fed == [{"input": ((1, 3, 96, 80), np.float32)}]  # one run: no impulse probe
    tiled = upscale.run(image, sr_models["compact-x4"], options=opts(runtime), tile_size=116)  # 2x2 tiles
    assert len(factory.fed) == 1 + 4 and all(PROBE_SIDE not in f["input"][0][2:] for f in factory.fed)
    assert tiled.overlap == tiled.receptive_radius == 34
    assert tiled.exact and whole.exact and not tiled.warnings
    np.testing.assert_array_equal(tiled.image, whole.image)


def test_rrdb_tiled_below_its_radius_is_never_exact(sr_models, recorded):
    runtime, factory = recorded
    # a 56 px window with an 8 px overlap costs (56 / 40)^2 = 1.96x the staged whole-image plan:
    # under twice it, so the explicit tile is honoured, not raised (issue 38's rule)
    image = picture(64, 48, seed=6)
    whole = upscale.run(image, sr_models["rrdb-x4plus"], options=opts(runtime), tile_size=None)
    before = len(factory.fed)
    short = upscale.run(image, sr_models["rrdb-x4plus"], options=opts(runtime), tile_size=56, overlap=8)
    windows = short.plan["windows"]
    assert windows >= 2 and len(factory.fed) - before == windows  # tiled, no probe
    assert not any("raised" in w for w in short.warnings), short.warnings
    assert whole.exact and whole.receptive_radius == 349
    assert not short.exact and short.receptive_radius == 349
    assert any("below" in w and "349 px" in w for w in short.warnings)
    difference = np.abs(short.image - whole.image)
    assert difference.max() > 0  # the seams really differ: a real 349 px reach, not a label
    print(f"RRDBNet x4plus, overlap 8 < 349: max |tiled - whole| = {difference.max():.3g}")


def test_moge2_vits_binds_and_runs_through_the_adapter_contract(moge2_vits, fresh_runtime):
    with fresh_runtime.operation("moge2") as op:
        handle = op.session(moge2_vits, "cpu")
        binding = moge2_contract.bind_contract(handle)
        assert (binding.image.name, binding.tokens.name) == ("image", "num_tokens")
        assert binding.output_names == ["points", "normal", "mask", "metric_scale"]
        feeds = {
            "image": picture(56, 70, seed=7).transpose(2, 0, 1)[None].copy(),
            # 300 tokens (below the trained 1200..3600): the graph takes any count, and this test
            # checks the contract and shapes, not geometry; a quarter of the run's cost
            "num_tokens": np.array(300, dtype=np.int64).reshape((1,) * len(binding.tokens.shape)),
        }
        out = op.run(handle, feeds, last=True, output_names=binding.output_names)
        assert out["points"].shape == out["normal"].shape == (1, 56, 70, 3)
        assert out["mask"].shape == (1, 56, 70) and out["metric_scale"].shape == (1,)
        assert all(np.isfinite(v).all() for v in out.values())


def test_da3_small_runs_through_the_depth_adapter(da3_small, fresh_runtime):
    result = da3.run(picture(90, 160, seed=8), da3_small, options=opts(fresh_runtime))
    assert result.model_size == (280, 504)  # the export's fixed input
    assert result.depth.shape == (90, 160) and np.isfinite(result.depth).all()
    assert set(result.extras) == {"depth_conf"}


def test_da3_small_dynamic_runs_at_the_pictures_own_aspect(da3_small_dynamic, fresh_runtime):
    result = da3.run(picture(120, 160, seed=8), da3_small_dynamic, options=opts(fresh_runtime))
    assert result.model_size == (378, 504)  # DA3's own size rule at 4:3, no fixed size to fit
    assert result.depth.shape == (120, 160) and np.isfinite(result.depth).all()
    assert not result.warnings and set(result.extras) == {"depth_conf"}


def test_ben2_base_is_a_matte_model_by_its_graph_and_refused_as_any_other(ben2_base, fresh_runtime):
    verdict, (inputs, outputs) = family_check.check_file("ben2", ben2_base, fresh_runtime)
    assert verdict.fits, verdict.message()
    assert not verdict.probed  # the final Sigmoid tells: registering it costs no 1024² run
    assert [list(i.shape) for i in inputs] == [[1, 3, 1024, 1024]]
    assert [list(o.shape) for o in outputs] == [[1, 1, 1024, 1024]]
    handle = fresh_runtime.session(ben2_base, "cpu")
    for other in ("da3", "moge2", "upscale"):  # what a job of another family does with this file
        with pytest.raises(ModelContractError, match="background-removal"):
            family_check.require(other, handle)


def _figures_never_negative(report: dict) -> None:
    text = "\n".join(report["lines"])
    assert not re.search(r"-\s*\d+ MiB", text), text
    for figure in report["figures"]:
        numbers = {k: v for k, v in figure.items() if isinstance(v, int)}
        numbers.update({label: value for label, value in figure["floors"] if value is not None})
        assert min(numbers.values()) >= 0, numbers
        assert sum(value for _, value in figure["floors"] if value is not None) == figure["after"]  # None: not known (the library floor when onnxruntime came before)


def _held_bytes(result) -> int:
    arrays = [v for v in vars(result).values() if isinstance(v, np.ndarray)]
    arrays += [v for d in vars(result).values() if isinstance(d, dict) for v in d.values()]
    return sum(a.nbytes for a in arrays)


@pytest.mark.parametrize("family,export", [("da3", "da3_small"), ("ben2", "ben2_base")])
def test_the_memory_report_on_a_real_export_holds_results_apart_and_nothing_negative(
    family, export, request, tmp_path, fresh_runtime
):
    path = request.getfixturevalue(export)
    job = ModelRun.resolve(family, tmp_path, model_path=str(path), device="cpu")
    result = job.infer(picture(480, 640, seed=9), job.options(runtime=fresh_runtime))  # BEN2: one 1024² run
    report = fresh_runtime.last_job_memory
    assert report["outcome"] == "success" and report["runs"] == 1
    print("\n".join(report["lines"]))
    _figures_never_negative(report)
    (ram,) = report["figures"]
    assert ram["results"] == _held_bytes(result) > 0  # DA3's depth_conf (in its extras) included
    held = f"results still held: {round(ram['results'] / 2**20)} MiB"
    assert any(held in line for line in report["lines"]), report["lines"]
