"""Out-of-memory messages that say what was needed and give advice that can help: a numpy
MemoryError in a batch becomes the runtime's out-of-memory error, and an allocation that does not
shrink with the tile (real, in a capped CPU arena, own process) is not met with "a smaller tile"."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
from lean_image_ai.models.base import RunOptions
from lean_image_ai.models.batch.frame_lists import FrameRef
from lean_image_ai.models.batch.sequence import BatchRun
from lean_image_ai.runtime import InferenceOutOfMemoryError
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import save_model

TESTS_DIR = Path(__file__).resolve().parent


def test_a_numpy_memory_error_in_a_batch_is_the_out_of_memory_error_with_what_was_needed():
    def infer(frames, options):
        for _ in frames:
            np.ones(1 << 50, np.uint8)  # 1 PiB: numpy's own MemoryError, "Unable to allocate 1 PiB ..."

    refs = [FrameRef(1, Path("a.png")), FrameRef(2, Path("b.png"))]
    batch = BatchRun(refs, infer, lambda ref: np.zeros((4, 4, 3), np.uint8), lambda ref, result: None,
                     options=RunOptions(device="cpu", cancel=threading.Event()))
    report = batch.run()
    assert [n for n, _ in report.failed] == [1, 2]
    for _, text in report.failed:
        assert text.startswith("Out of system memory: Unable to allocate 1.00 PiB") and "MemoryError" not in text


def bomb_model(path: Path, floats: int) -> Path:
    """A x2 resize that also allocates ``floats`` floats whatever the input's size (the count comes
    from the input's values, times 0, so onnxruntime cannot fold it away when the model loads)."""
    nodes = [
        helper.make_node("Resize", ["input", "", "scales"], ["r"], mode="nearest"),
        helper.make_node("ReduceMax", ["input"], ["m"], keepdims=0),
        helper.make_node("Mul", ["m", "zero"], ["m0"]),
        helper.make_node("Add", ["m0", "count"], ["n"]),
        helper.make_node("Cast", ["n"], ["n64"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["n64", "one"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["big"]),
        helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
        helper.make_node("Mul", ["s", "zero"], ["s0"]),
        helper.make_node("Add", ["r", "s0"], ["output"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(float(floats), np.float32), "count"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
    ]
    graph = helper.make_graph(
        nodes,
        "bomb",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, "OH", "OW"])],
        initializers,
    )
    return save_model(graph, path)


BOMB_JOB = r"""
import json, sys
import numpy as np
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.base import RunOptions
from lean_image_ai.runtime import InferenceOutOfMemoryError, Runtime, RuntimeSettings

runtime = Runtime(RuntimeSettings(cpu_arena_max_bytes=16 << 20))
try:
    upscale.run(np.full((96, 96, 3), 0.5, np.float32), sys.argv[1], options=RunOptions(device="cpu", runtime=runtime))
    print(json.dumps({"raised": None}))
except InferenceOutOfMemoryError as exc:
    print(json.dumps({"raised": type(exc).__name__, "message": str(exc), "splits": len(runtime.events.recent("tile_split"))}))
"""


def test_an_allocation_that_does_not_shrink_with_the_tile_gets_no_smaller_tile_advice(tmp_path):
    model = bomb_model(tmp_path / "bomb.onnx", floats=64 << 20)  # 256 MiB at every tile size; the arena holds 16
    done = subprocess.run([sys.executable, "-c", BOMB_JOB, str(model)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["raised"] == InferenceOutOfMemoryError.__name__, report
    assert report["splits"] >= 1  # the tiler did try smaller tiles first
    message = report["message"]
    assert "does not shrink with the tile size" in message and "smaller tile" not in message
    assert "256 MiB in one block" in message
