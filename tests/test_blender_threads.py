"""Issue #30 item 2: Blender's process starts no Python thread and never imports onnxruntime while
any operator of the add-on runs (Blender does not support Python threads; onnxruntime's native
libraries, a GPU provider's included, would stay loaded in Blender for the whole session).

Real bpy 5.0.1 in processes of their own (tests/thread_watch_job.py records every
``threading.Thread.start`` and looks at ``sys.modules`` after each case): registering the add-on,
drawing the preferences and the N-panel (the device menu), installing and removing a model from
the loopback model server, registering and removing your own ONNX file, installing and removing
the GPU runtime from a local folder of fake wheels (pip's own PIP_* settings), the doctor, the
cancel buttons, and every model operator (their jobs run in the model worker process,
models/worker/).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402
from builders_families import ben2_like_model, da3_like_model  # noqa: E402
from builders_moge2 import moge2_like_model  # noqa: E402
from child_catalog import ENV as CHILD_CATALOG_ENV  # noqa: E402
from child_catalog import ChildCatalog  # noqa: E402
from fake_wheels import build_wheel, write_requirements  # noqa: E402
from model_server import loopback_entry, loopback_http, onnx_payload, serving  # noqa: E402

pytest.importorskip("bpy")
PIL = pytest.importorskip("PIL.Image")

TESTS = Path(__file__).resolve().parent

# Not a model job: none may start a thread or import onnxruntime.
OTHER_CASES = (
    "register", "preferences", "install_model", "remove_model", "register_user_model", "remove_user_model",
    "install_gpu_runtime", "remove_gpu_runtime", "run_doctor", "cancel_buttons", "unregister",
)  # fmt: skip
# Model jobs and the memory of the models: in a process of their own, after a register.
MODEL_CASES = (
    "upscale", "remove_background", "estimate_depth", "reconstruct_geometry", "process_sequence",
    "reconstruct_shot", "release_memory", "unload_all", "leak_check", "show_memory_plot",
)  # fmt: skip


class _Monkey:
    """What ChildCatalog needs of pytest's monkeypatch, for an environment dict of a subprocess."""

    def __init__(self, env: dict, paths: list):
        self.env, self.paths = env, paths

    def setenv(self, name, value):
        self.env[name] = value

    def syspath_prepend(self, path):
        self.paths.insert(0, Path(path))


def _photo(path: Path, seed: int) -> None:
    pixels = np.random.default_rng(seed).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    PIL.fromarray(pixels).save(path)


def _config(root: Path, server) -> tuple[dict, dict]:
    """The files every case uses, and the environment of the bpy process."""
    for name in ("images", "frames", "models", "index"):
        (root / name).mkdir(parents=True)
    _photo(root / "images" / "photo.png", 0)
    for frame in (1, 2):
        _photo(root / "frames" / f"f_{frame:04d}.png", frame)
    data = onnx_payload(64 * 1024)
    server.files["/m.onnx"] = data
    entry = loopback_entry(server.url("/m.onnx"), data, id="test-threads", filename="test-threads.onnx")
    wheels = [
        build_wheel(root / "index", "nvidia-cuda-runtime", "13.5.37", {"nvidia/cu13/lib/libfake.so.13": b"c" * 100}),
        build_wheel(root / "index", "nvidia-cudnn-cu13", "9.28.1.4", {"nvidia/cudnn/lib/libfakednn.so.9": b"d" * 100}),
    ]
    paths = [bh.package_search_dir(root / "pkg")]
    env = bh.isolated_blender_env(root / "blender")
    catalog = ChildCatalog(root / "child_site", _Monkey(env, paths), 16 * 1024)
    catalog.write([entry])
    env.update({
        "PYTHONPATH": os.pathsep.join(str(p) for p in paths),
        "LEAN_IMAGE_AI_MODELS_DIR": str(root / "models_dir"),
        "LEAN_IMAGE_AI_GPU_RUNTIME_DIR": str(root / "gpu" / "gpu_runtime"),
        "LEAN_IMAGE_AI_LOG_DIR": str(root / "logs"),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(root / "index"),
    })  # fmt: skip
    assert env[CHILD_CATALOG_ENV]
    config = {
        "tests": str(TESTS),
        "models_dir": str(root / "models_dir"),
        "model_id": entry.id,
        "model_file": entry.filename,
        "user_model": str(ben2_like_model(root / "models" / "mine.onnx")),
        "gpu_requirements": str(write_requirements(root / "req.txt", wheels)),
        "images": str(root / "images"),
        "frames": str(root / "frames"),
        "sequence_out": str(root / "out" / "u_####.png"),
        "models": {
            "ben2": str(ben2_like_model(root / "models" / "ben2.onnx")),
            "da3": str(da3_like_model(root / "models" / "da3.onnx", fixed_hw=(28, 42))),
            "moge2": str(moge2_like_model(root / "models" / "moge2.onnx")),
        },
        "leak_runs": 3,
    }
    return config, env


def _run(root: Path, config: dict, env: dict, cases) -> dict:
    path = root / f"{cases[1]}.json"
    config = {**config, "cases": list(cases), "out": str(root / f"{cases[1]}_out.json")}
    path.write_text(json.dumps(config), encoding="utf-8")
    done = subprocess.run([sys.executable, str(TESTS / "thread_watch_job.py"), str(path)], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    out = Path(config["out"])
    assert out.is_file(), f"the bpy process ended before its first case ({done.returncode}): {done.stderr[-3000:]}"
    return {r["case"]: r for r in json.loads(out.read_text(encoding="utf-8"))} | {"_stderr": done.stderr}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("threads")

    with serving() as server, loopback_http():
        config, env = _config(root, server)
        return {
            "other": _run(root, config, env, OTHER_CASES),
            "model": _run(root, config, env, ("register", *MODEL_CASES)),
        }


def _check(records: dict, case: str) -> None:
    record = records.get(case)
    assert record is not None, f"{case} never ran: {records['_stderr'][-3000:]}"
    assert record["error"] is None, record["error"]
    assert record["threads"] == [], f"{case} started Python threads in Blender's process: {record['threads']}"
    assert not record["onnxruntime"], f"onnxruntime was imported into Blender's process by {case} (or before it)"


@pytest.mark.parametrize("case", OTHER_CASES)
def test_no_thread_and_no_onnxruntime_in_blender(records, case):
    _check(records["other"], case)


@pytest.mark.parametrize("case", MODEL_CASES)
def test_model_operators_start_no_thread_in_blender(records, case):
    _check(records["model"], case)



def _thread_or_runtime_uses(path: str) -> list[str]:
    """What in the module's code could start a thread or load onnxruntime: an import of threading,
    concurrent.futures or onnxruntime (anywhere, a function's body included), ``threading.Thread``
    or ``threading.Timer``, ``importlib.import_module("onnxruntime")``. Comments and docstrings
    do not count."""
    found = []
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else []
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "threading":
            names = [f"threading.{node.attr}"] if node.attr in ("Thread", "Timer") else []
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            names = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
        else:
            continue
        found += [name for name in names if name.split(".")[0] in ("threading", "concurrent", "onnxruntime")]
    return sorted(set(found))


# Loaded in Blender's process and importing threading for a lock or an event only (no thread is
# made there), each with what it guards. Every other module Blender loads imports none of
# threading, concurrent.futures and onnxruntime (docs/building.md, "Which modules run where").
LOCK_OR_EVENT_ONLY = {
    "operators.jobs": "a job's cancel flag (threading.Event), which the batch checks",
    "models.batch.runner": "the cancel flag it hands to its batch",
    "models.batch.shot_batch": "the cancel flag and the second pass's ready flag",
    "models.worker.remote_batch": "the cancel flag (the worker client's, issue #37 items 1-4)",
    "models.worker.remote_call": "the cancel flag of a call in the worker (the leak check)",
    "models.files": "a lock around the process umask",
    "models.outputs": "a lock: a writer thread of the command line and the caller's may both write",
    "models.store.catalog": "a lock around the catalog's cache",
    # the host's event log (models/worker/host_record.py): the worker's and the command line's
    # threads emit into theirs too; in Blender only the main thread does
    "runtime.log.events": "a lock around the event history and its listeners",
    # the Memory panel's figures of Blender's own process (RSS, and NVML for the GPU)
    "runtime.measure.memory": "a lock around NVML's one-time start (the worker's sampler thread reads it too)",
}
@pytest.fixture(scope="module")
def loaded_uses(records) -> dict:
    """Per run, what every module of the add-on loaded after its last case uses (see above)."""
    out = {}
    for run in ("other", "model"):
        cases = [case for case in records[run] if not case.startswith("_")]
        modules = records[run][cases[-1]]["modules"]
        uses = {name.removeprefix("lean_image_ai."): _thread_or_runtime_uses(path) for name, path in modules.items() if path}
        out[run] = {name: found for name, found in uses.items() if found}
    assert "operators.image_ops" in {n.removeprefix("lean_image_ai.") for n in records["model"][cases[-1]]["modules"]}
    return out


@pytest.mark.parametrize("run", ["other", "model"])
def test_blender_loads_no_module_that_makes_threads_or_imports_onnxruntime(loaded_uses, run):
    """Issue #37 item 6: after every operator ran once, the add-on's modules in Blender's process
    import no threading but for a lock or an event (listed, with why), and none of
    concurrent.futures and onnxruntime: Blender's process makes no Runtime (runtime/core.py and
    its sessions, sampler, timers and deferred release are the worker's and the command line's).
    Before: 25 such modules, the batch's threads, the tile paste's pool, the download watch, pip's
    reader among them; then the shared runtime's 11 (core, session, timeline, deferred release...)."""
    lock_only = {name for name, found in loaded_uses[run].items() if found == ["threading"] and name in LOCK_OR_EVENT_ONLY}
    rest = {name: found for name, found in loaded_uses[run].items() if name not in lock_only}
    assert rest == {}, f"loaded in Blender's process: {json.dumps(rest, indent=1)}"


def test_the_lists_of_allowed_modules_hold_only_what_blender_loads(loaded_uses):
    """A module taken out of Blender's process leaves the lists above, so they never hide one."""
    seen = set(loaded_uses["other"]) | set(loaded_uses["model"])
    assert sorted(set(LOCK_OR_EVENT_ONLY) - seen) == []
