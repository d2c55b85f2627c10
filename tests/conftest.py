import os
import sys
import tempfile
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
# test helpers (onnx_builders, blender_helpers, ...) are plain modules beside the tests
sys.path.insert(0, str(TESTS_DIR))
REPO_ROOT = TESTS_DIR.parent
# the event log of every runtime the tests start (and their subprocesses) goes to a scratch folder,
# not the user's own; tests of the log itself give their own folder
os.environ.setdefault("LEAN_IMAGE_AI_LOG_DIR", tempfile.mkdtemp(prefix="lean_image_ai_test_logs_"))
# Ray reads these when first imported (any test may import it first): a local Ray then binds its
# node to loopback, so nothing a test starts listens beyond 127.0.0.1
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def family_models(tmp_path_factory):
    """A stand-in model of each family by its CLI command (tests/builders_*.py; upscale: None,
    the embedded bicubic x2)."""
    from builders_families import ben2_like_model, da3_like_model
    from builders_moge2 import moge2_like_model

    root = tmp_path_factory.mktemp("family_models")
    return {
        "remove-background": ben2_like_model(root / "ben2.onnx", size=64),
        "depth": da3_like_model(root / "da3.onnx", fixed_hw=None),
        "geometry": moge2_like_model(root / "moge2.onnx"),
        "upscale": None,
    }


@pytest.fixture
def fresh_runtime():
    """A private Runtime with the real onnxruntime (the process-wide one stays untouched)."""
    from lean_image_ai.runtime import Runtime

    runtime = Runtime()
    yield runtime
    runtime.clear("test teardown")


@pytest.fixture
def server():
    """A loopback model server (tests/model_server.py) for installer and download tests."""
    from model_server import loopback_http, serving

    with serving() as srv, loopback_http():
        yield srv


@pytest.fixture
def factory():
    """Records what each session and run receives (tests/recording.py)."""
    from recording import RecordingFactory

    return RecordingFactory()


@pytest.fixture
def runtime(factory):
    """A private Runtime whose sessions are real CPU sessions recorded by `factory`."""
    from lean_image_ai.runtime import Runtime

    rt = Runtime(session_factory=factory)
    yield rt
    rt.clear("test teardown")


@pytest.fixture
def recorded(runtime, factory):
    """(runtime, factory): a private runtime and what its sessions received, as one pair."""
    return runtime, factory


# ---- the worker-boundary tests' (test_worker_process, test_worker_reports, test_worker_deadlines) ----


@pytest.fixture
def client():
    """A model worker client of the test's own, its worker taking the tests' fault switch
    (models/worker/serve.py), killed after the test."""
    from lean_image_ai.models.worker import client as worker_client
    from lean_image_ai.models.worker import serve

    made = worker_client.WorkerClient(env={serve.FAULTS_ENV: "1"})
    yield made
    made.kill()


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """A small compact upscale net (tests/builders_upscale.py)."""
    from builders_upscale import compact_model

    return compact_model(tmp_path_factory.mktemp("worker") / "small.onnx", num_conv=4, feat=8)


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory):
    """A wide compact upscale net: one tile of it is long enough that a cancel or a fault lands inside."""
    from builders_upscale import compact_model

    return compact_model(tmp_path_factory.mktemp("worker") / "slow.onnx", num_conv=16, feat=64)
