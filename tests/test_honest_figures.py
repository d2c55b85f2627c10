"""Issue 33, "one set of figures a user can trust": the same job's memory says the same figures in
the text report, the JSON line and the picture, each named for what it measures, in MiB; the
picture's labels stay off the curve; a model's weights come from its file; a cancelled job's report
says what stayed; the leak check says why it needs 8 runs; HDR values are kept or their clipping
is said; `models list` shows the embedded model; messages use the command names."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.adapters.upscale import DEFAULT_MODEL_PATH
from lean_image_ai.models.base import RunOptions
from lean_image_ai.runtime import Runtime
from lean_image_ai.runtime.errors import OperationCancelled, SettingError
from lean_image_ai.runtime.measure import leak_check, memory_plot
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
# the CLI run in a subprocess, then the picture's words read from the code that draws them
DRIVER = """
import json, sys
from lean_image_ai.ui.cli.main import main
from lean_image_ai.runtime import get_runtime
from lean_image_ai.runtime.measure import memory_plot
code = main(sys.argv[1:])
timeline = get_runtime().last_timeline
layout = memory_plot.label_layout(timeline)
print("PICTURE " + json.dumps({"code": code, "title": layout["title"],
      "labels": [text for text, _, _ in layout["labels"]], "legend": memory_plot.legend(timeline)}))
"""


def _cli(*args, cwd, driver=False, timeout=180):
    command = [sys.executable, "-c", DRIVER, *args] if driver else [sys.executable, "-m", "lean_image_ai", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def _mib(value: int) -> int:
    return int(round(value / MIB))


# ---- one measurement, one set of figures ------------------------------------------------------


def test_a_real_job_says_one_set_of_figures_in_the_report_the_json_line_and_the_picture(tmp_path):
    plot = tmp_path / "memory.png"
    done = _cli("upscale", "--output", str(tmp_path / "out.png"), "--device", "cpu", "--memory-plot", str(plot),
                cwd=tmp_path, driver=True)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    summary = json.loads(next(line for line in lines if line.startswith("{")))
    picture = json.loads(next(line for line in lines if line.startswith("PICTURE "))[len("PICTURE "):])
    memory = summary["memory"]
    assert memory["unit"] == "bytes" and "rss_peak" not in memory, "every peak is named for what it measures"
    job_peak, process_peak = memory["job_rss_peak"], memory["process_rss_peak"]
    assert process_peak >= job_peak > 0, "the job runs inside the process"
    text = done.stdout
    # the text report: the job's peak, and the process's over the whole command, as the JSON line has them
    (report_peak,) = re.findall(r"the runs grew \d+ MiB \(job peak (\d+) MiB\)", text)
    assert int(report_peak) == _mib(job_peak)
    (process_line,) = [line for line in lines if line.startswith("process RAM (RSS) over the whole command")]
    assert f"peak {_mib(process_peak)} MiB" in process_line and f"the job's peak {_mib(job_peak)} MiB" in process_line
    # the picture: its title and legend say the job's peak, the level labels the before/after of the report
    assert f"job peak RSS {_mib(job_peak)} MiB" in picture["title"]
    assert any(f"to a job peak of {_mib(job_peak)} MiB" in line for line in picture["legend"])
    (before,) = re.findall(r"before the job (\d+) MiB", text)
    (after,) = re.findall(r"what stays \((\d+) MiB\)", text)
    assert f"RSS before {before} MiB" in picture["labels"] and f"RSS after {after} MiB" in picture["labels"]
    # MiB everywhere: no "MB" figure left in what the user reads
    everything = "\n".join([text, done.stderr, *picture["labels"], picture["title"], *picture["legend"]])
    assert not re.search(r"\d\s*[MGK]B\b", everything), re.findall(r".{30}\d\s*[MGK]B\b.{10}", everything)
    assert plot.is_file()


def test_the_cli_help_says_mib():
    done = subprocess.run([sys.executable, "-m", "lean_image_ai", "upscale", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert "--ram-budget MiB" in done.stdout and not re.search(r"\b[MGK]B\b", done.stdout.replace("_MB", ""))


# ---- the picture's labels stay off the curve ---------------------------------------------------


def _ending_on_its_after_level(after_mib: float = 108, hump_mib: float = 117) -> dict:
    """The real upscale's shape (the picture of issue 33): RSS climbs to a peak just before the
    release, dips, and ends flat at its "after" level at the right edge: where the right-aligned
    "RSS after" label used to sit on the hump."""
    points = [(0.0, 49), (0.05, 80), (0.1, 89), (0.19, 85), (0.23, 88), (0.25, 93), (0.3, 106), (0.35, 105),
              (0.4, hump_mib), (0.43, hump_mib - 4), (0.47, hump_mib - 4), (0.49, after_mib - 7),
              (0.5, after_mib), (0.52, after_mib)]
    samples = [(t, {"ram": int(v * MIB)}) for t, v in points]
    marks = [(0.0, "before", {"ram": 49 * MIB}), (0.23, "run 1", {"ram": 88 * MIB}),
             (0.48, "run 2", {"ram": int((hump_mib - 4) * MIB)}), (0.49, "release", {"ram": int((after_mib - 7) * MIB)}),
             (0.53, "after", {"ram": int(after_mib * MIB)})]
    return {"samples": samples, "marks": marks, "operation": "upscale", "devices": ["CPU"], "outcome": "success"}


def _boxes_clear(layout) -> list[str]:
    """The labels whose box (with 2 px of margin) holds a pixel of a curve."""
    hit = []
    for text, (x0, y0, x1, y1), _ in layout["labels"]:
        for cols, rows in layout["curves"].values():
            inside = (cols >= x0 - 2) & (cols <= x1 + 2) & (rows >= y0 - 2) & (rows <= y1 + 2)
            if inside.any():
                hit.append(text)
    return hit


@pytest.mark.parametrize(("after_mib", "hump_mib"), [(108, 117), (100, 125), (60, 70), (112, 114)])
def test_the_after_label_does_not_cover_the_end_of_the_curve(after_mib, hump_mib):
    timeline = _ending_on_its_after_level(after_mib, hump_mib)
    layout = memory_plot.label_layout(timeline)
    texts = [text for text, _, _ in layout["labels"]]
    assert f"RSS after {after_mib} MiB" in texts and "RSS before 49 MiB" in texts
    assert _boxes_clear(layout) == [], "a label covers the curve"
    boxes = [box for _, box, _ in layout["labels"]]
    left, top, right, bottom = layout["plot"]
    assert all(left < b[0] and b[2] < right and top < b[1] and b[3] < bottom for b in boxes)
    a, b = boxes
    assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), "labels overlap each other"


# ---- the weights figure comes from the model --------------------------------------------------


def _tiny_model(path: Path, floats: int) -> Path:
    """y = x * w[:, :3]: ``floats`` float32 weights, of which the graph uses three (a weight's bytes
    count however few are used)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, "h", "w"])
    nodes = [helper.make_node("Slice", ["w", "starts", "ends", "axes"], ["w3"]), helper.make_node("Mul", ["x", "w3"], ["y"])]
    inits = [numpy_helper.from_array(np.ones((1, floats, 1, 1), np.float32), "w"),
             numpy_helper.from_array(np.array([0], np.int64), "starts"),
             numpy_helper.from_array(np.array([3], np.int64), "ends"), numpy_helper.from_array(np.array([1], np.int64), "axes")]
    graph = helper.make_graph(nodes, "tiny", [x], [y], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _weights_floor(runtime, model) -> tuple[int, str]:
    with runtime.operation("weights") as op:
        handle = op.session(model, "cpu")
        op.run(handle, {"x": np.ones((1, 3, 64, 64), np.float32)}, last=True)
    (ram,) = op.memory["figures"]
    (value,) = [v for label, v in ram["floors"] if label.startswith("model weights")]
    (line,) = [line for line in op.memory["lines"] if "what stays" in line]
    return value, line


def test_the_weights_figure_comes_from_the_model_file_not_from_a_measurement(tmp_path):
    runtime = Runtime()
    tiny = _tiny_model(tmp_path / "tiny.onnx", 3)
    size = tiny.stat().st_size
    value, line = _weights_floor(runtime, tiny)
    assert 0 < value <= size < 1024, (value, size)
    assert re.search(rf"model weights \(1 cached session, as the model files hold them\) {value} B", line), line
    big = _tiny_model(tmp_path / "big.onnx", 1 << 20)  # 4 MiB of weights
    runtime2 = Runtime()
    value, line = _weights_floor(runtime2, big)
    assert 4 * MIB <= value <= big.stat().st_size, value
    assert "model weights (1 cached session, as the model files hold them) 4 MiB" in line


def test_the_embedded_model_is_a_few_hundred_bytes_of_weights_not_megabytes():
    from lean_image_ai.runtime.onnx_inputs import weights_bytes

    assert 0 < weights_bytes(DEFAULT_MODEL_PATH) <= DEFAULT_MODEL_PATH.stat().st_size < 4096


# ---- a cancelled job says what stayed ----------------------------------------------------------


def test_a_cancelled_job_report_says_what_stayed(tmp_path):
    runtime = Runtime()
    image = (np.random.default_rng(0).random((512, 512, 3)) * 255).astype(np.uint8)
    cancel = threading.Event()

    def progress(_fraction, stage):
        if stage.startswith("tile 2/"):
            cancel.set()

    options = RunOptions(device="cpu", progress=progress, cancel=cancel, runtime=runtime)
    with pytest.raises(OperationCancelled):
        upscale.run(image, options=options, tile_size=128)
    report = runtime.last_job_memory
    assert report["outcome"] == "cancelled"
    (ram,) = report["figures"]
    canvas = 1024 * 1024 * 3 * 4  # the x2 result's float32 canvas, allocated before the first paste
    assert ram["unfinished"] >= canvas, ram["unfinished"]
    text = "\n".join(report["lines"])
    assert "the unfinished frame's buffers" in text and f"{_mib(ram['unfinished'])} MiB allocated" in text
    assert "The cached session and the arena's reserved regions stay on purpose" in text
    # a finished job has nothing unfinished and says nothing about it
    upscale.run(image, options=RunOptions(device="cpu", runtime=runtime), tile_size=128)
    assert runtime.last_job_memory["figures"][0]["unfinished"] == 0
    assert "unfinished" not in "\n".join(runtime.last_job_memory["lines"])


# ---- the leak check says why it needs 8 runs ---------------------------------------------------


def test_the_leak_check_says_in_its_help_and_its_refusal_why_it_needs_eight_runs(tmp_path):
    helped = _cli("leak-check", "--help", cwd=tmp_path)
    assert "needs at least 8 runs to judge" in " ".join(helped.stdout.split())
    refused = _cli("leak-check", "--runs", "3", "--device", "cpu", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    (line,) = refused.stderr.strip().splitlines()
    assert "3 run(s) cannot be judged" in line and "needs at least 8 runs to judge" in line
    with pytest.raises(SettingError, match="needs at least 8 runs to judge"):
        leak_check.analyse({"ram": [1, 2, 3, 4, 5]})
    with pytest.raises(SettingError, match="needs at least 8 runs to judge"):
        leak_check.leak_check(lambda: None, runs=7)


# ---- HDR: kept where the model allows it, else said --------------------------------------------


def _write_exr(path: Path, pixels: np.ndarray) -> Path:
    import OpenEXR

    with OpenEXR.File({"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}, {"RGB": pixels}) as f:
        f.write(str(path))
    return path


def _read_exr(path: Path) -> tuple[np.ndarray, dict]:
    import OpenEXR

    with OpenEXR.File(str(path)) as f:
        return np.array(f.channels()["RGB"].pixels), dict(f.header())


def _hdr_input(tmp_path) -> Path:
    pixels = np.full((32, 48, 3), 0.5, np.float32)
    pixels[8:16, 8:24] = 4.0  # a bright patch, 4 stops over white
    return _write_exr(tmp_path / "hdr.exr", pixels)


def test_an_hdr_upscale_with_the_embedded_model_keeps_values_above_one(tmp_path):
    source = _hdr_input(tmp_path)
    done = _cli("upscale", str(source), str(tmp_path / "out.exr"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    pixels, header = _read_exr(tmp_path / "out.exr")
    assert pixels.shape == (64, 96, 3) and pixels.max() >= 4.0, pixels.max()
    assert "clipped" not in done.stdout and not [k for k in header if "clipped" in k]
    # a PNG cannot hold them: what was clipped is said in the report and in the file
    done = _cli("upscale", str(source), str(tmp_path / "out.png"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    over = int((pixels > 1.0).any(axis=2).sum())
    said = f"out.png: {over} pixel(s) above 1 (highest {pixels.max():.6g}) were clipped to 1"
    assert said in done.stdout, done.stdout
    from PIL import Image

    with Image.open(tmp_path / "out.png") as written:
        assert said.split(": ", 1)[1] in written.text["lean_image_ai:clipped_on_write"]


def test_an_hdr_upscale_with_a_trained_model_says_exactly_what_was_clipped(tmp_path):
    from builders_upscale import resize_model

    model = resize_model(tmp_path / "trained_x2.onnx")
    source = _hdr_input(tmp_path)
    done = _cli("upscale", str(source), str(tmp_path / "out.exr"), "--model", str(model), "--device", "cpu",
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    said = ("128 pixel(s) outside [0, 1] (lowest 0.5, highest 4) were clipped to [0, 1] for trained_x2.onnx, "
            "which takes [0, 1]")
    assert f"warning: hdr.exr: {said}" in done.stdout, done.stdout
    pixels, header = _read_exr(tmp_path / "out.exr")
    assert pixels.max() <= 1.0 and said in header["lean_image_ai:clipped_for_model"]


# ---- models list shows the embedded model ------------------------------------------------------


def test_models_list_shows_the_embedded_model_jobs_use_by_default(tmp_path):
    done = _cli("models", "list", "--models-dir", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (row,) = [line for line in done.stdout.splitlines() if "(embedded)" in line]
    assert row.startswith("bicubic_x2 (embedded)") and " upscale " in row and " embedded " in row
    assert str(DEFAULT_MODEL_PATH) in row and f"{DEFAULT_MODEL_PATH.stat().st_size} B" in row
    only_depth = _cli("models", "list", "--family", "depth", "--models-dir", str(tmp_path), cwd=tmp_path)
    assert only_depth.returncode == 0 and "(embedded)" not in only_depth.stdout


# ---- wording a user can follow -----------------------------------------------------------------


def test_a_wrong_family_refusal_says_what_the_model_looks_like_and_which_command_to_use():
    from lean_image_ai.models.store.family_check import Finding, Verdict

    refused = Verdict("ben2", Finding("da3", "an output named 'depth'", strong=True))
    assert refused.refused
    assert refused.message() == ("this looks like a depth model: an output named 'depth'. "
                                 "Use depth (Estimate Depth in Blender) for it (remove-background cannot use it).")
    doubtful = Verdict("upscale", Finding("ben2", "values within [0, 1] on a probe"))
    assert "use remove-background" in doubtful.message() and "ben2" not in doubtful.message()
    from lean_image_ai.models import families
    from lean_image_ai.models.family import command_of

    assert all(command_of(f.id) == f.command for f in families.ALL)


def test_messages_name_the_file_and_the_command_not_frame_one_and_family_ids(tmp_path):
    source = tmp_path / "photo.exr"
    _write_exr(source, np.full((16, 16, 3), -0.5, np.float32))
    done = _cli("upscale", str(source), str(tmp_path / "out.exr"), "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "warning: photo.exr: 256 pixel(s) below 0" in done.stdout and "frame 1" not in done.stdout
    leak = _cli("leak-check", "--family", "ben2x", cwd=tmp_path)
    assert "remove-background, depth, geometry, upscale" in leak.stderr


def test_the_cuda_fallback_names_each_library_once():
    from lean_image_ai.runtime.cuda import cuda_preload

    preload = cuda_preload.Preload()
    preload.messages, preload.failed = cuda_preload.parse(
        "Failed to load /opt/nvidia/lib/libcublasLt.so.13: libcublasLt.so.13: cannot open shared object file\n"
        "Failed to load C:\\B\\cudart64_13.dll: Could not find module 'cudart64_13.dll' (or one of its dependencies).\n"
    )
    text = preload.describe()
    assert text.count("libcublasLt.so.13") == 1 and text.count("cudart64_13.dll") == 1, text
    assert "cannot open shared object file" in text and "not found" in text


INTERNAL_NAMES = ("ModelRun", "run_tiled", "run_frames", "RunOptions", "ResultSink", "BatchRun", "FrameQueue",
                  "preload_dlls", "upscale.run")


def test_user_facing_strings_name_no_python_api():
    """Every string a user can read (errors, warnings, reports, help: the non-docstring literals of
    the add-on's code) names no Python API of ours or onnxruntime's."""
    import tokenize

    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if {"tests", "bench", "tools", ".venv", "examples"} & set(path.relative_to(ROOT).parts):
            continue
        with open(path) as fh:
            tokens = list(tokenize.generate_tokens(fh.readline))
        for token in tokens:
            if token.type != tokenize.STRING or token.string.lstrip("rbfuRBFU").startswith(('"""', "'''")):
                continue
            body = re.sub(r"\{[^{}]*\}", "", token.string)  # the code inside an f-string is not read
            if " " not in body:
                continue  # a name looked up (getattr(ort, "preload_dlls")), not a sentence
            found += [f"{path.relative_to(ROOT)}:{token.start[0]}: {name}" for name in INTERNAL_NAMES if name in body]
    assert found == []


def test_blender_tooltips_name_no_python_api():
    """Blender shows an operator's, panel's or preference's class docstring as its tooltip."""
    import ast

    found = []
    for path in sorted([*ROOT.glob("operators/*.py"), *ROOT.glob("ui/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.startswith("LEAN_IMAGE_AI_"):
                doc = ast.get_docstring(node) or ""
                found += [f"{path.name} {node.name}: {word}" for word in (*INTERNAL_NAMES, ".py") if word in doc]
    assert found == []


def test_pip_install_warns_about_no_package_left_out(tmp_path):
    """setuptools copies every package folder it is told of; one it is not (models/assets) makes it
    print a 40-line warning on every `pip install -e .`."""
    done = subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "build_py", "--build-lib",
                           str(tmp_path / "lib")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Package would be ignored" not in done.stderr and "as data is deprecated" not in done.stderr, done.stderr
    assert (tmp_path / "lib" / "lean_image_ai" / "models" / "assets" / "bicubic_x2.onnx").is_file()
