"""runtime/measure/memory_report.py from given snapshots: figures that add up and are never negative.

The snapshots are the shapes seen on real exports (issue 20): a release that also gives back
pages the load touched (DA3 METRIC-LARGE read "the job kept -788 MB"), and a 1080p x4 upscale
whose 380 MB result was still alive when the report was made (read as "kept 389 MB")."""

from __future__ import annotations

from pathlib import Path

import pytest
from lean_image_ai.runtime.measure.memory_report import format_figures, job_figures

MB = 2**20


def floors(figure) -> dict:
    return dict(figure["floors"])


def test_a_release_that_gives_back_load_pages_reads_as_such_never_as_a_negative_kept():
    # before 300, loading added 2100 (weights 1340 + parse buffers), peak 3900, after 1612
    figure = job_figures("ram", before=300 * MB, loaded=2100 * MB, peak=3900 * MB, after=1612 * MB,
                         library=60 * MB, weights=2100 * MB, cached_sessions=1)
    assert figure["kept"] == 0 and figure["load_given_back"] == 788 * MB
    assert figure["grew"] == figure["gave_back"] + figure["kept"] - figure["load_given_back"]
    values = [v for _, v in figure["floors"]]
    assert min(values) >= 0 and sum(values) == figure["after"]
    assert floors(figure)["model weights (1 cached session, as the model files hold them)"] == 1612 * MB - 60 * MB  # capped at what stays
    text = "\n".join(format_figures(figure, released=True))
    assert "-" not in text.replace("(RSS, what the OS sees)", "")
    assert "of it touched while loading" in text and "the job kept 0 MiB" in text


def test_results_still_held_are_their_own_line_apart_from_what_the_runtime_kept():
    figure = job_figures("ram", before=200 * MB, loaded=80 * MB, peak=3000 * MB, after=689 * MB,
                         library=60 * MB, weights=70 * MB, cached_sessions=1, results=380 * MB)
    assert figure["kept"] == 409 * MB and figure["runtime_kept"] == 29 * MB
    assert floors(figure)["results still held (the job's outputs, the caller's to drop)"] == 380 * MB
    text = "\n".join(format_figures(figure, released=True))
    assert "the runtime kept 29 MiB; results still held: 380 MiB" in text
    assert sum(v for _, v in figure["floors"]) == figure["after"]


def test_floors_that_overlap_never_leave_a_negative_rest():
    # weights measured at load larger than what stays (the "rest of the process -229 MB" case)
    figure = job_figures("ram", before=500 * MB, loaded=900 * MB, peak=2000 * MB, after=1171 * MB,
                         library=300 * MB, weights=900 * MB, cached_sessions=2)
    assert floors(figure)["rest of the process"] == 0
    assert all(v >= 0 for _, v in figure["floors"]) and sum(v for _, v in figure["floors"]) == figure["after"]


def test_a_gpu_figure_counts_no_results():
    figure = job_figures("vram", before=MB, loaded=0, peak=4 * MB, after=2 * MB, library=0, weights=0,
                         cached_sessions=0, results=380 * MB)
    assert figure["results"] == 0 and figure["runtime_kept"] == MB


def test_a_real_job_after_freed_heap_pages_reports_no_negative(tmp_path):
    """In a fresh process: building a 64 MB model of 256 small weights leaves freed pages in the C
    heap (counted in "before"), then a job loads it and runs one tiny input; the release's heap
    trim gives those pages back too, so `after` falls below `before + loaded` (the report used to
    read "the job kept -54 MB" here). Every figure must stay >= 0 and the floors add up."""
    import json
    import subprocess
    import sys

    tests = Path(__file__).parent
    code = f"""
import sys, json
sys.path.insert(0, {str(tests)!r})
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import save_model
from lean_image_ai.runtime import Runtime
n, count = 65536, 256
rng = np.random.default_rng(0)
weights = [numpy_helper.from_array(rng.standard_normal((1, n)).astype(np.float32), f"w{{i}}") for i in range(count)]
nodes = [helper.make_node("Add", ["x" if i == 0 else f"a{{i - 1}}", f"w{{i}}"], [f"a{{i}}"]) for i in range(count)]
nodes.append(helper.make_node("Identity", [f"a{{count - 1}}"], ["y"]))
graph = helper.make_graph(nodes, "many", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], weights)
path = save_model(graph, {str(tmp_path / "many.onnx")!r})
del weights, graph, nodes
runtime = Runtime()
with runtime.operation("stand-in") as op:
    handle = op.session(path, "cpu")
    op.run(handle, {{"x": np.ones((1, n), np.float32)}}, last=True)
print(json.dumps({{"figure": op.memory["figures"][0], "lines": op.memory["lines"]}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    figure = report["figure"]
    assert figure["kept"] >= 0 and all(value >= 0 for _, value in figure["floors"])
    assert sum(value for _, value in figure["floors"]) == figure["after"]
    assert figure["grew"] == figure["gave_back"] + figure["kept"] - figure["load_given_back"]
    assert not any(" -" in line for line in report["lines"])
    if figure["load_given_back"] == 0:
        pytest.skip("this heap gave nothing back beyond the job's own pages: the negative case did not arise")
    assert any("touched while loading" in line for line in report["lines"])


def test_an_upscale_reports_its_result_as_held_not_as_kept_by_the_runtime():
    import numpy as np
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions
    from lean_image_ai.runtime import Runtime

    runtime = Runtime()
    result = upscale.run(np.full((96, 128, 3), 0.5, np.float32), options=RunOptions(device="cpu", runtime=runtime))
    (ram,) = runtime.last_job_memory["figures"]
    assert ram["results"] == result.image.nbytes  # alive when the report was made (returned after it)
    assert any("results still held: " in line for line in runtime.last_job_memory["lines"])
    runtime.clear("test teardown")


def test_results_held_counts_arrays_in_a_results_dict_and_each_buffer_once():
    from dataclasses import dataclass, field

    import numpy as np
    from lean_image_ai.models.base import ResultSink, RunOptions

    @dataclass
    class Depth:  # DA3's shape: the confidence map sits in a dict beside the depth
        depth: np.ndarray
        extras: dict = field(default_factory=dict)
        alias: np.ndarray | None = None

    depth, conf = np.zeros((90, 160), np.float32), np.zeros((90, 160), np.float32)
    sink = ResultSink(RunOptions(on_result=lambda _result: None))
    result = Depth(depth, {"depth_conf": conf}, alias=depth[:45])  # a view holds its owner's memory
    sink.add(result)
    assert sink.held_bytes() == depth.nbytes + conf.nbytes
    del result
    assert sink.held_bytes() == 0  # dropped by whoever took it: no longer held
