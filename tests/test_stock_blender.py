"""End to end, for real: the linux-x64 zip built with the real onnxruntime wheel works in a stock
Blender whose Python has no onnxruntime, Pillow or psutil, and leaves nothing behind when removed
but the user's models (a per-user data folder outside the extension's own).

Blender versions by default: the newest of each Python line (``5.0.1``: Python 3.11, the py311 zip;
``5.3.0``: Python 3.13, the py313 zip) and the oldest the manifest allows, ``4.2.23`` LTS (the py311
zip again; about 15 s with its venv cached): bpy 4.2 segfaulted at exit after the uninstall (see
ui/prop_callbacks.py), which test_exit_code guards. ``LEAN_IMAGE_AI_STOCK_BPY=4.2.23,5.0.1,5.2.3,5.3.0``
chooses the versions (here: the 5.2 LTS line too). In each: install, register a model (and have
one of the wrong family refused), all four operators, a sequence, the N-panels and the
preferences drawn, uninstall, exit with 0. And issue 32's checks, the same the dev-venv tests run
(one place each: tests/results_checks.py, tests/shot_checks.py, tests/panel_listing.py): the
four buttons' results saved, reopened in a new process (after the uninstall) and undone and
redone with every pixel kept; the shot operators all or nothing; the N-panel per mode showing
only what applies. With ``-s`` each version prints its panels and preferences as text.

Needs PyPI (the wheels and bpy are downloaded once, then reused) and a Python 3.13 for the 5.1+
lines (``LEAN_IMAGE_AI_PYTHON313``, else ``python3.13`` on PATH or in pyenv): without them the test
fails with the reason rather than skipping, because a zip that was never tried is the bug this
guards. The one exception: 4.2.23 when it is only there by default and pip cannot install it (its
wheel is not on this index, or not for this platform) skips with pip's words.

Caches (override the root with LEAN_IMAGE_AI_CACHE): ``<root>/wheels`` for the build tool's
downloads, ``<root>/stock-bpy-<version>`` for a venv holding only ``bpy==<version>`` and what it
pulls in (CI keeps them between runs, so a run costs the build and the jobs, not the downloads).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402
import panel_listing as pl  # noqa: E402
import results_checks as rc  # noqa: E402
import shot_checks  # noqa: E402
from builders_families import ben2_like_model, da3_like_model  # noqa: E402
from builders_moge2 import moge2_like_model  # noqa: E402
from engine_pythons import engine_venv  # noqa: E402
from onnx_builders import sr_model  # noqa: E402

CACHE = Path(os.environ.get("LEAN_IMAGE_AI_CACHE", Path.home() / ".cache" / "lean_image_ai"))
PYTHON_OF = {"4.2": "3.11", "4.5": "3.11", "5.0": "3.11"}  # Blender 5.1 and later: Python 3.13
DEFAULT_VERSIONS = ("4.2.23", "5.0.1", "5.3.0")
OPTIONAL_BY_DEFAULT = "4.2.23"  # skipped, not failed, where pip cannot install it (unless asked for)
ASKED = os.environ.get("LEAN_IMAGE_AI_STOCK_BPY")
VERSIONS = tuple(v.strip() for v in (ASKED or ",".join(DEFAULT_VERSIONS)).split(",") if v.strip())
JOB_SCRIPT = Path(__file__).with_name("stock_blender_job.py")
RESULTS_JOB = Path(__file__).with_name("results_job.py")


def python_line(bpy_version: str) -> str:
    return PYTHON_OF.get(".".join(bpy_version.split(".")[:2]), "3.13")


def _base_python(line: str) -> str:
    if line == f"{sys.version_info[0]}.{sys.version_info[1]}":
        return sys.executable
    # a pyenv shim is on PATH even where that version is not active, and then fails (exit 127):
    # take the first candidate that really runs
    candidates = [
        os.environ.get(f"LEAN_IMAGE_AI_PYTHON{line.replace('.', '')}"),
        shutil.which(f"python{line}"),
        *sorted(glob.glob(str(Path.home() / f".pyenv/versions/{line}.*/bin/python{line}"))),
    ]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    raise AssertionError(f"no Python {line} for bpy's {line} line: set LEAN_IMAGE_AI_PYTHON{line.replace('.', '')}")


def _stock_python(version: str) -> Path:
    """A venv with only bpy (and its own requirements); built once, into place by rename."""
    venv = CACHE / f"stock-bpy-{version}"
    python = venv / "bin" / "python"
    if (venv / ".complete").is_file() and python.is_file():
        return python
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = CACHE / f"{venv.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run([_base_python(python_line(version)), "-m", "venv", str(partial)], check=True)
    proc = subprocess.run(
        [str(partial / "bin" / "python"), "-m", "pip", "install", "-q", f"bpy=={version}"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        said = f"pip install bpy=={version} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        if version == OPTIONAL_BY_DEFAULT and not ASKED:
            pytest.skip(said.strip().splitlines()[-1])
        raise AssertionError(said)
    (partial / ".complete").write_text(version)
    shutil.rmtree(venv, ignore_errors=True)
    # Renamed whole so a killed run never leaves a half venv in place; its console scripts keep
    # the old path in their shebangs, but this test only ever starts bin/python by path.
    partial.rename(venv)
    return python


@pytest.fixture(scope="module")
def timings() -> dict:
    return {}


@pytest.fixture(scope="module")
def zips(tmp_path_factory, timings) -> dict:
    """The linux-x64 zip of each Python line asked for, built once per line."""
    built = {}
    for line in sorted({python_line(v) for v in VERSIONS}):
        out = tmp_path_factory.mktemp(f"stock_zip_{line}")
        started = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable, str(bh.REPO_ROOT / "tools" / "build_extension.py"),
                "--platform", "linux-x64", "--python", line,
                "--output-dir", str(out), "--wheels-dir", str(CACHE / "wheels"),
            ],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        timings[f"build_py{line}_s"] = time.perf_counter() - started
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        assert len(report["zips"]) == 1, report
        built[line] = report["zips"][0]
    return built


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("stock_models")
    return {
        "ben2": str(ben2_like_model(root / "ben2.onnx", fixed=False)),
        "da3": str(da3_like_model(root / "da3.onnx", fixed_hw=None)),
        "moge2": str(moge2_like_model(root / "moge2.onnx")),
        "upscale": str(sr_model(root / "my_x2.onnx", scale=2)),
    }


@pytest.fixture(scope="module", params=VERSIONS)
def stock_run(request, zips, standins, tmp_path_factory, timings) -> dict:
    version = request.param
    built = zips[python_line(version)]
    started = time.perf_counter()
    python = _stock_python(version)
    timings[f"{version}_venv_s"] = time.perf_counter() - started
    root = tmp_path_factory.mktemp(f"stock_blender_{version}")
    work = root / "work"
    work.mkdir()
    models_json = root / "models.json"
    models_json.write_text(json.dumps(standins))
    results_config = rc.make_project(root)
    checks_json = root / "checks.json"
    checks_json.write_text(json.dumps({
        "results_config": str(results_config),
        "shot": str(shot_checks.red_shot(root / "shot", count=3, damaged=2)),
        "shot_out": str(root / "shot_out"),
        "engine_python": engine_venv("3.13"),  # issue 40: a second Python as the worker's engine
    }))  # fmt: skip
    env = {**bh.isolated_blender_env(root), "PYTHONFAULTHANDLER": "1"}  # a crash says where, in CI too
    started = time.perf_counter()
    proc = subprocess.run(
        [str(python), str(JOB_SCRIPT), built["path"], str(work), str(models_json), str(JOB_SCRIPT.parent), str(checks_json)],
        capture_output=True, text=True, env=env, cwd=str(work), timeout=900,
    )  # fmt: skip
    timings[f"{version}_job_s"] = time.perf_counter() - started
    started = time.perf_counter()
    # Reopened in a new process, the add-on uninstalled: the results need nothing of it.
    reopened = subprocess.run(
        [str(python), str(RESULTS_JOB), "read", str(results_config)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    timings[f"{version}_reopen_s"] = time.perf_counter() - started
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    # The exit code is test_exit_code's: a crash at exit comes after the RESULT line.
    assert lines, f"exit code {proc.returncode}\n" + proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert "error" not in result, result["error"] + proc.stderr[-4000:]
    console = "\n".join(ln for ln in (proc.stdout + proc.stderr).splitlines() if not ln.startswith("RESULT "))
    result.update(root=str(root), home=env["HOME"], console=console, version=version, zip=built, returncode=proc.returncode)
    assert reopened.returncode == 0, reopened.stdout[-3000:] + reopened.stderr[-3000:]
    result["results"] = rc.load_session(results_config.parent, console)
    print(f"\nstock Blender {version} e2e timings: {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
    print(f"stock Blender {version} issue 32 checks in the job (s): {json.dumps({k: round(v, 1) for k, v in result['seconds'].items()})}")
    for title, lines in result["listings"].items():
        print(f"--- Blender {version}: {title} ---\n" + "\n".join(lines))
    return result


def test_zip_carries_exactly_the_onnxruntime_wheel_and_the_license(stock_run):
    built = stock_run["zip"]
    line = python_line(stock_run["version"])
    cp = "cp" + line.replace(".", "")
    with zipfile.ZipFile(built["path"]) as zf:
        names = zf.namelist()
        manifest = zf.read("blender_manifest.toml").decode()
    wheels = [n for n in names if n.endswith(".whl")]
    # the lean rule: the CPU onnxruntime; onnxruntime-gpu comes only with the GPU runtime download
    assert len(wheels) == 1 and Path(wheels[0]).name.startswith("onnxruntime-"), wheels
    assert f"-{cp}-{cp}-manylinux" in wheels[0]
    assert [w["name"] for w in built["wheels"]] == [Path(wheels[0]).name]
    assert "LICENSE" in names
    assert not any("numpy" in n.lower() for n in names)
    assert not any(n.endswith(".png") and "/" not in n for n in names), names
    assert not any(n.startswith("docs/") for n in names)
    if line == "3.11":
        assert 'blender_version_max = "5.1.0"' in manifest  # cp311: Blender 4.2 to 5.0 only
    else:
        assert 'blender_version_min = "5.1.0"' in manifest


def test_stock_blender_lacks_what_the_addon_must_bring(stock_run):
    line = python_line(stock_run["version"])
    assert stock_run["python"] == [int(p) for p in line.split(".")] and stock_run["bpy"].split()[0] == stock_run["version"]
    assert all(stock_run["missing_before"].values()), stock_run["missing_before"]


def test_upscale_runs_in_stock_blender_with_the_bundled_onnxruntime(stock_run):
    assert stock_run["install"] == ["FINISHED"] and stock_run["enabled"] is True
    assert stock_run["upscale"] == ["FINISHED"]
    ext = Path(stock_run["extensions_dir"]).resolve()
    assert ext.is_relative_to(Path(stock_run["root"]).resolve())  # the temporary user folders
    # Blender unpacks extension wheels into one site-packages under the user extensions folder.
    site = ext / ".local" / "lib" / f"python{python_line(stock_run['version'])}" / "site-packages"
    assert stock_run["site_packages"] == [str(site)]
    assert stock_run["onnxruntime_in_blender"] is False  # the model worker imported it (issue 30)
    assert Path(stock_run["onnxruntime_file"]).resolve().is_relative_to(site)
    assert Path(stock_run["addon_file"]).resolve() == ext / "user_default" / "lean_image_ai" / "__init__.py"
    assert "onnxruntime" in stock_run["site_entries_installed"]
    assert not any(stock_run["imported"].values()), stock_run["imported"]
    assert stock_run["rss_bytes"] and stock_run["rss_bytes"] > 0  # RSS without psutil

    assert stock_run["output_size"] == [96, 64]  # 2x of 48x32
    assert stock_run["pixels_finite"]
    low, high = stock_run["pixels_range"]
    assert 0.0 <= low <= high <= 1.0
    # Each 2x2 block of a bicubic x2 averages back to its source pixel, to 8-bit rounding and ringing.
    assert stock_run["pooled_max_abs_diff"] < 0.05


def test_a_second_python_as_the_engine_gives_the_pixels_of_blenders_own(stock_run):
    """Issue 40's engine path: the Worker Python preference names a Python 3.13 venv with numpy 2
    and its own onnxruntime (tests/engine_pythons.py); the worker runs there, importing the add-on
    from the installed extension, and the Upscale's pixels are those of Blender's own Python."""
    assert stock_run["engine_upscale"] == ["FINISHED"], stock_run["engine_upscale"]
    worker = stock_run["engine_worker"]
    assert worker["python"].startswith("3.13.") and worker["numpy"].startswith("2."), worker
    assert "engine-py313" in worker["onnxruntime_file"], worker
    assert stock_run["engine_max_abs_diff"] == 0.0
    # then, the preference cleared, the host's Upscale ran on the zip's onnxruntime again
    site = Path(stock_run["extensions_dir"]).resolve() / ".local"
    assert Path(stock_run["onnxruntime_file"]).resolve().is_relative_to(site), stock_run["onnxruntime_file"]


def test_uninstall_leaves_nothing_behind(stock_run):
    assert stock_run["uninstall"] == ["FINISHED"]
    assert stock_run["enabled_after"] is False
    assert stock_run["addon_dir_exists_after"] is False
    assert stock_run["site_entries_after"] == []
    assert stock_run["left_under_extensions"] == []


def test_auto_device_skips_cuda_quietly_without_an_nvidia_driver(stock_run):
    """No nvidia-ml-py in a stock Blender: the driver's NVML library itself says there is no GPU."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("an NVIDIA driver is installed here")
    except OSError:
        pass
    assert "CUDAExecutionProvider" not in stock_run["console"], stock_run["console"][-3000:]
    assert "libcublas" not in stock_run["console"]


def test_all_four_operators_and_a_sequence_run(stock_run):
    assert stock_run["remove_background"] == ["FINISHED"], stock_run["remove_background"]
    assert stock_run["estimate_depth"] == ["FINISHED"], stock_run["estimate_depth"]
    assert stock_run["reconstruct_geometry"] == ["FINISHED"], stock_run["reconstruct_geometry"]
    assert stock_run["objects_added"] >= 1  # the point cloud / mesh (and camera)
    assert any(name.startswith("source") and name != "source.png" for name in stock_run["images"]), stock_run["images"]
    assert stock_run["sequence"] == ["FINISHED"], stock_run["sequence"]
    assert stock_run["sequence_files"] == ["up_0001.png", "up_0002.png", "up_0003.png"]


def test_panels_and_preferences_draw(stock_run):
    drawn = stock_run["drawn"]
    assert set(drawn) >= {"LEAN_IMAGE_AI_PT_image_editor", "LEAN_IMAGE_AI_PT_view3d", "preferences"}
    assert all(count > 0 for count in drawn.values()), drawn
    text = " ".join(stock_run["preferences_text"])
    assert "my_x2 (your model)" in text  # the registered model is in the preferences' list


def test_run_doctor_reports_the_bundled_onnxruntime(stock_run):
    """The preferences' doctor runs `python -m lean_image_ai doctor` with Blender's Python and
    sys.path: it finds the installed extension and the onnxruntime Blender unpacked for it."""
    assert stock_run["doctor"] == ["FINISHED"]
    report = stock_run["doctor_report"] or ""
    site = Path(stock_run["onnxruntime_file"]).resolve().parent
    assert f"onnxruntime: onnxruntime {stock_run['onnxruntime_version']} from {site}" in report, report
    assert "Bundled with this zip: onnxruntime-" in report, report


def test_models_live_in_the_shared_folder_and_survive_uninstall(stock_run):
    shared = Path(stock_run["home"]) / ".local" / "share" / "lean_image_ai" / "models"
    assert Path(stock_run["models_folder"]) == shared
    assert stock_run["register"] == ["FINISHED"] and stock_run["registered"][0].endswith("my_x2.onnx")
    (refused,) = stock_run["register_wrong_family"]
    assert refused.startswith("error: ") and "this looks like a background-removal (matte) model" in refused
    assert stock_run["models_kept_after"] == ["user_models.json"]  # uninstalling kept the library


def test_exit_code(stock_run):
    """0 on every version, 4.2 included: bpy 4.2 used to segfault at exit after the uninstall
    (see ui/prop_callbacks.py)."""
    assert stock_run["returncode"] == 0, stock_run["console"][-3000:]


def test_every_result_survives_save_and_reopen_with_its_pixels(stock_run):
    """Issue 32: the four buttons' results (and a saved one, a replaced source, the memory
    picture) reopened in a new process; packed, or reading their file `//`-relative."""
    session = stock_run["results"]
    for name in rc.REOPENED:
        rc.check_reopened_pixels(session, name)
    for name in rc.RESULTS:
        rc.check_packed(session, name)
    rc.check_depth_plane(session)
    rc.check_saved_result_reads_its_file(session)
    rc.check_replaced_source(session)
    rc.check_loaded_source_relative(session)
    rc.check_no_blend_relative_warning(session)


def test_undo_removes_each_result_and_redo_brings_its_pixels_back(stock_run):
    for name in rc.RESULTS:
        rc.check_undo_redo(stock_run["results"], name)
    rc.check_replace_undo_redo(stock_run["results"])  # the replaced source's pixels too (issue #39 item 12)


def test_the_image_editor_that_showed_the_photo_shows_each_result(stock_run):
    for name in rc.RESULTS:
        rc.check_shown(stock_run["results"], name)


def test_shot_operators_are_all_or_nothing(stock_run):
    shot_checks.check_reconstruct_shot(stock_run["shot"])
    shot_checks.check_process_sequence(stock_run["shot"])


def test_the_panel_of_each_mode_shows_only_what_applies(stock_run):
    assert all(r == ["FINISHED"] for r in stock_run["register_tasks"].values()), stock_run["register_tasks"]
    pl.check_single_image(stock_run["panel_modes"]["single image"], "panel_photo.png")
    pl.check_sequence(stock_run["panel_modes"]["Sequence"], "shot_####.png")
