"""One family job (models/model_run.py) behind every front-end, with the real onnxruntime and real bpy
5.0.1: the same upscale with the same RAM budget gets the same tile plan from the command line
(its flag and its variable), a farm worker (FrameWorker in this process: no Ray needed), the
single-image Upscale operator and Process Sequence; the budget flags and variables follow the
preferences' rule; one rule says whether a model text is a file or an id; an installed model's
first-time hash runs where the job runs, not where it is set up."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
bh.import_package()

from lean_image_ai.models import families  # noqa: E402
from lean_image_ai.models.adapters.upscale import plan as upscale_plan  # noqa: E402
from lean_image_ai.models.adapters.upscale.plan import AUTO_WORKING_CPU  # noqa: E402
from lean_image_ai.models.batch.frame_io import ImageFileFrames  # noqa: E402
from lean_image_ai.models.batch.runner import Runner  # noqa: E402
from lean_image_ai.models.model_run import ModelRun  # noqa: E402
from lean_image_ai.models.store import installer, library, verified_record  # noqa: E402
from lean_image_ai.models.store.catalog import Catalog  # noqa: E402
from lean_image_ai.models.store.catalog_entry import CatalogEntry  # noqa: E402
from lean_image_ai.models.tiles.tile_memory import BUDGET_FRACTION, estimate_bytes_per_pixel  # noqa: E402
from lean_image_ai.runtime import get_runtime, memory_snapshot  # noqa: E402
from lean_image_ai.runtime.errors import ModelFileError, SettingError  # noqa: E402
from lean_image_ai.runtime.settings import MAX_BUDGET_MB, RAM_BUDGET_ENV, MemoryBudgets, budget_bytes  # noqa: E402
from lean_image_ai.ui.cli import cli_job  # noqa: E402
from lean_image_ai.ui.cli import main as cli  # noqa: E402
from lean_image_ai.ui.cli.farm_worker import FrameWorker  # noqa: E402
from onnx_builders import sr_model  # noqa: E402

HEADROOM_MB = 1024  # above this process's RSS: the runtime's own budget check never splits a tile


@pytest.fixture
def runtime_kept():
    """The process-wide runtime's settings as they were (the jobs below set budgets and threads)."""
    runtime = get_runtime()
    saved = runtime.settings
    yield runtime
    runtime.settings = saved


@pytest.fixture
def tile_plans(monkeypatch):
    """Every auto tile size an upscale plans, with the budget it was planned from and the working
    target per window it says it used (the real upscale/plan.py auto_tile, recorded). In this process:
    Blender's operators run the model here too (remote_batch.IN_PROCESS_ENV) so that it is seen."""
    from lean_image_ai.models.worker.remote_batch import IN_PROCESS_ENV

    monkeypatch.setenv(IN_PROCESS_ENV, "1")
    plans = []
    real = upscale_plan.auto_tile

    def recording(runtime, handle, overlap, budget, **kwargs):
        tile, how = real(runtime, handle, overlap, budget, **kwargs)
        plans.append({"budget": budget, "overlap": overlap, "tile": tile, "how": how})
        return tile, how

    monkeypatch.setattr(upscale_plan, "auto_tile", recording)
    return plans


@pytest.fixture
def plate(tmp_path, monkeypatch):
    """An image larger than the tile the budget gives, alone in its folder, and a 2x model."""
    (tmp_path / "models").mkdir()
    monkeypatch.setenv(library.MODELS_DIR_ENV, str(tmp_path / "models"))
    monkeypatch.delenv(RAM_BUDGET_ENV, raising=False)
    budget_mb = memory_snapshot(None)["rss_bytes"] // (1 << 20) + HEADROOM_MB
    side = int(np.sqrt((budget_mb << 20) * 0.5 / estimate_bytes_per_pixel(4)))  # 4: the plan's safe side
    height, width = side + 40, 2 * side  # more than one tile each way
    rng = np.random.default_rng(7)
    (tmp_path / "plate").mkdir()
    source = tmp_path / "plate" / "plate_0001.png"
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(source)
    model = sr_model(tmp_path / "sr.onnx", scale=2, mid_channels=4)
    return source, model, budget_mb


class RecordingWorker(FrameWorker):
    """The farm's worker as Ray runs it, keeping the tile size each frame reports."""

    tiles: list

    def write(self, ref, out, result):
        self.tiles.append(result.tile_size_used)
        return super().write(ref, out, result)


def test_every_front_end_plans_the_same_tiles_for_the_same_budget(plate, tmp_path, tile_plans, runtime_kept, monkeypatch, capsys):
    source, model, budget_mb = plate
    common = ["--model", str(model), "--device", "cpu", "--overwrite"]

    # the command line, with the flag, then with the variable
    assert cli.main(["upscale", str(source), str(tmp_path / "cli.png"), *common, "--ram-budget", str(budget_mb)]) == 0
    printed = capsys.readouterr().out
    monkeypatch.setenv(RAM_BUDGET_ENV, str(budget_mb))
    assert cli.main(["upscale", str(source), str(tmp_path / "env.png"), *common]) == 0
    monkeypatch.delenv(RAM_BUDGET_ENV)

    # a farm worker, given the job the farm's driver builds from its command line
    args = cli.build_parser().parse_args(["farm", "upscale", str(source), str(tmp_path / "farm") + "/", *common, "--ram-budget", str(budget_mb)])
    driver = Runner(cli_job.job_spec(args.family, args, farm=True), ImageFileFrames())  # as ui/cli/farm_ray.py plans
    worker = type("Worker", (RecordingWorker,), {"tiles": []})(driver.model_run.for_worker(), 1)
    (tmp_path / "farm").mkdir(exist_ok=True)
    items = list(worker.process([(1, str(source), str(tmp_path / "farm" / "plate.png"))]))
    assert items[0] == {"frame": 1} and "end" in items[-1], items

    # Blender: the preferences' RAM budget, the Upscale operator and Process Sequence
    with bh.registered_addon() as package:
        addon = bpy.context.preferences.addons.new()
        addon.module = package.__name__
        try:
            prefs = addon.preferences
            prefs.device, prefs.ram_budget_mb = "CPU", budget_mb
            assert bpy.ops.lean_image_ai.upscale(filepath=str(source), model_path=str(model), tile_size=0) == {"FINISHED"}
            out = tmp_path / "sequence"
            done = bpy.ops.lean_image_ai.process_sequence(
                family="upscale", source=str(source.parent), output=f"{out}/", model_path=str(model), tile_size=0
            )
            assert done == {"FINISHED"} and len(list(out.iterdir())) == 1
        finally:
            bpy.context.preferences.addons.remove(addon)
            bh.reset_blender()

    front_ends = ["cli flag", "cli variable", "farm worker", "upscale operator", "process sequence"]
    assert len(tile_plans) == len(front_ends), tile_plans
    # the working memory per pixel in the plan's words is each run's own measurement (onnxruntime's
    # arena grows a little differently run to run: 0.1 or 0.2 KB per pixel); the plan is the rest
    decided = [{**plan, "how": re.sub(r"[\d.]+ KB per pixel measured", "KB per pixel measured", plan["how"])} for plan in tile_plans]
    assert all(plan == decided[0] for plan in decided), dict(zip(front_ends, tile_plans, strict=True))
    plan = tile_plans[0]
    assert plan["budget"] == budget_mb << 20  # the budget itself reached the plan, not a default
    # so it was planned from the budget: half of it per window, below the 2 GiB CPU default
    target = int(BUDGET_FRACTION * (budget_mb << 20))
    assert target < AUTO_WORKING_CPU and f"{target / 2**30:.1f} GiB per window" in plan["how"], plan
    # what the frame reports agrees too: the largest window that ran (the plan's side at most;
    # None: one window over the frame, which this small model's measured memory allows)
    ran = [int(t) for t in re.findall(r"tile (\d+) px", printed)]
    assert ran == worker.tiles and ran[0] <= (plan["tile"] or max(Image.open(source).size)), (ran, worker.tiles)

    # without a budget the same job plans against the CPU default: the budget is what changed it
    tile_plans.clear()
    assert cli.main(["upscale", str(source), str(tmp_path / "none.png"), *common]) == 0
    assert tile_plans[0]["budget"] is None, tile_plans
    assert f"{AUTO_WORKING_CPU / 2**30:.1f} GiB per window" in tile_plans[0]["how"], tile_plans


@pytest.mark.parametrize("text", ["abc", "-1", "1.5", "4GB", "0x10", "1_000", " ", str(MAX_BUDGET_MB + 1), "nan"])
def test_a_budget_is_whole_mb_within_the_preferences_limits(text):
    with pytest.raises(SettingError, match="whole number of MiB from 0"):
        budget_bytes("--ram-budget", text)


def test_budget_values_mean_the_same_everywhere():
    assert budget_bytes("x", "0") is None and budget_bytes("x", 0) is None  # 0: no limit
    assert budget_bytes("x", " 512 ") == 512 << 20 == budget_bytes("x", 512)
    assert budget_bytes("x", str(MAX_BUDGET_MB)) == MAX_BUDGET_MB << 20
    preferences = bh.import_submodule("ui.preferences").LeanImageAIPreferences.__annotations__
    for name in ("ram_budget_mb", "gpu_memory_budget_mb"):  # the preferences take the same limits
        assert (preferences[name].keywords["min"], preferences[name].keywords["max"]) == (0, MAX_BUDGET_MB)
    limits = MemoryBudgets(1 << 30, 2 << 30).settings()
    assert limits == {"ram_budget_bytes": 1 << 30, "vram_budget_bytes": 2 << 30, "gpu_mem_limit_bytes": 2 << 30}


def test_a_budget_flag_of_0_lifts_the_variable(monkeypatch):
    monkeypatch.setenv(RAM_BUDGET_ENV, "4096")
    parse = cli.build_parser().parse_args
    assert cli_job.budgets(parse(["upscale", "in.png"])).ram_bytes == 4096 << 20
    assert cli_job.budgets(parse(["upscale", "in.png", "--ram-budget", "0"])).ram_bytes is None
    assert cli_job.budgets(parse(["upscale", "in.png", "--ram-budget", "100"])).ram_bytes == 100 << 20


def test_a_model_text_is_a_catalog_id_else_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    known = library.catalog(tmp_path)
    some_id = known.entries("upscale")[0].id
    (tmp_path / some_id).write_bytes(b"")  # a file with an id's name: the id still wins
    (tmp_path / "plain").write_bytes(b"")
    assert not library.names_a_file(some_id, known)
    assert library.names_a_file("plain", known)  # something is there
    assert library.names_a_file("missing.onnx", known) and library.names_a_file("MISSING.ONNX", known)
    assert library.names_a_file(f"sub{'/'}thing", known)
    assert not library.names_a_file("no-such-model", known)
    with pytest.raises(ModelFileError, match="Unknown model 'no-such-model'"):
        ModelRun.resolve("upscale", tmp_path, model="no-such-model")
    with pytest.raises(ModelFileError, match="Model file not found: 'missing.onnx'"):
        ModelRun.resolve("upscale", tmp_path, model="missing.onnx")


def test_the_first_time_hash_runs_with_the_job_not_where_it_is_set_up(tmp_path, runtime_kept, monkeypatch):
    """Every front-end resolves its model with a read (Blender on its main thread): a file whose
    sha256 was never checked is taken on its size there, and hashed by the job's first run."""
    model = sr_model(tmp_path / "source.onnx", scale=2, mid_channels=4)
    data = model.read_bytes()
    entry = CatalogEntry(
        id="test-sr", family="upscale", variant="x2", title="Test SR", filename="test_sr.onnx", url=None,
        size_bytes=len(data), sha256=installer.sha256_file(model), license="test", source="this test",
    )
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / entry.filename).write_bytes(data)
    monkeypatch.setattr(library, "catalog", lambda _folder: Catalog(builtin=[entry]))  # a real catalog of one entry
    hashed = []
    real_hash = installer.sha256_file
    monkeypatch.setattr(installer, "sha256_file", lambda *a, **k: hashed.append(a[0]) or real_hash(*a, **k))

    job = ModelRun.resolve("upscale", folder, model=entry.id, device="cpu")
    assert hashed == [] and library.status(entry, folder) == library.UNVERIFIED
    image = np.zeros((8, 8, 3), np.uint8)
    result = job.infer(image)
    assert len(hashed) == 1 and result.image.shape[:2] == (16, 16)
    assert library.status(entry, folder) == library.INSTALLED
    job.infer(image)
    assert len(hashed) == 1  # once

    (folder / entry.filename).write_bytes(data[:-4] + b"\0\0\0\0")  # same size, other bytes
    corrupt = ModelRun.resolve("upscale", folder, model=entry.id, device="cpu")
    with pytest.raises(ModelFileError):
        corrupt.infer(image)


def _listing(folder: Path) -> dict:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_resolving_the_command_lines_model_writes_nothing(tmp_path, runtime_kept, monkeypatch):
    """Choosing a model is a read: the command line's job (its runner, as ui/cli/main.py makes it)
    neither hashes nor writes a hash record or a lock in the models folder; a file installed
    without a catalog checksum and changed since is still caught, by the job's first run."""
    model = sr_model(tmp_path / "source.onnx", scale=2, mid_channels=4)
    data = model.read_bytes()
    checked = CatalogEntry(
        id="test-sr", family="upscale", variant="x2", title="Test SR", filename="test_sr.onnx", url=None,
        size_bytes=len(data), sha256=installer.sha256_file(model), license="test", source="this test",
    )
    unchecked = CatalogEntry(
        id="test-sr-own", family="upscale", variant="own", title="Test SR own", filename="own.onnx", url=None,
        size_bytes=None, sha256=None, license="test", source="this test",
    )
    folder = tmp_path / "models"
    folder.mkdir()
    for entry in (checked, unchecked):
        (folder / entry.filename).write_bytes(data)
    installer.verify_installed(unchecked, folder)  # as an install leaves it: no record without a checksum yet
    monkeypatch.setattr(library, "catalog", lambda _folder: Catalog(builtin=[checked, unchecked]))
    source = tmp_path / "in.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(source)
    before = _listing(folder)
    for entry in (checked, unchecked):
        args = cli.build_parser().parse_args(
            ["upscale", str(source), str(tmp_path / f"{entry.id}.png"), "--model", entry.id,
             "--models-dir", str(folder), "--device", "cpu"]
        )
        runner = Runner(cli_job.job_spec(args.family, args), ImageFileFrames())
        assert runner.model_run.model.entry.id == entry.id
    assert _listing(folder) == before

    verified_record.write_record(unchecked, folder / unchecked.filename, installer.sidecar_path(unchecked, folder),
                             installer.sha256_file(model))  # what an install records of a file without a checksum
    (folder / unchecked.filename).write_bytes(data[:-4] + b"\0\0\0\0")  # changed since: same size, other bytes
    changed = ModelRun.resolve("upscale", folder, model=unchecked.id, device="cpu")
    with pytest.raises(ModelFileError, match="changed since it was installed"):
        changed.infer(np.zeros((8, 8, 3), np.uint8))


def test_every_family_job_fills_in_the_defaults_of_options_a_front_end_lacks(tmp_path):
    for family in families.ALL:
        if family.fallback_model is None:
            continue
        job = ModelRun.resolve(family.id, tmp_path, values={})
        assert set(job.values) == {o.name for o in family.options}


def test_the_jobs_device_picks_the_default_model(tmp_path, monkeypatch):
    """Every front-end's device reaches the default pick through the job: off CUDA an installed
    fp32 export before an fp16 one (library.prefer_for_device), on CUDA the catalog's order."""
    model = sr_model(tmp_path / "source.onnx", scale=2, mid_channels=4)
    data = model.read_bytes()
    folder = tmp_path / "models"
    folder.mkdir()
    entries = []
    for entry_id, dtype in (("sr-half", "float16"), ("sr-full", "float32")):
        entry = CatalogEntry(
            id=entry_id, family="upscale", variant=entry_id, title=entry_id, filename=f"{entry_id}.onnx", url=None,
            size_bytes=len(data), sha256=installer.sha256_file(model), license="test", source="this test",
            weight_dtype=dtype,
        )
        (folder / entry.filename).write_bytes(data)
        entries.append(entry)
    monkeypatch.setattr(library, "catalog", lambda _folder: Catalog(builtin=entries))
    for device, expected in (("cpu", "sr-full"), ("auto", "sr-full"), ("cuda:0", "sr-half")):
        job = ModelRun.resolve("upscale", folder, device=device)
        assert job.model.entry.id == expected, device
