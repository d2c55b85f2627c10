"""The model worker process against the same job run in Blender's process (issue #30 item 8).

    python bench/worker.py [--width 1920 --height 1080] [--small 256] [--model FILE] [--ops-only]
    python bench/worker.py --ops-start [--ops-side 2048]   (the model operators' start, issue #37 item 3)

This process plays Blender's: it imports bpy (the bpy 5.0.1 wheel of the dev venv) and the add-on,
and drives jobs as the operators do (models/worker/remote_batch.py's RemoteBatchRun, pumped from
this thread, no thread of its own). The model is the compact x4 real-architecture export of
tools/reference_models.py (``compact-x4``, read from ~/.cache/lean_image_ai/reference_models and
never rebuilt here), else a seeded compact net built like it (tests/builders_upscale.py), named in
the output.

Measured, in order (everything about Blender's process before anything imports onnxruntime in it):
threads started and onnxruntime modules in this process during three small upscale jobs, its RSS
growth over them, the first job's extra time (the worker's start), a cancel in the middle of one
long tile (Esc to the end of the job), kill -9 of the worker mid-job (the next job must work),
Free memory now's figure, and last warm full-size jobs through the worker against the same job
run in this process by the batch runner (models/batch/sequence.py's BatchRun), in alternating pairs.
Before all that, in a bpy process of its own, the path artists use (issue #37 item 9): the Upscale
button through ``bpy.ops`` (1024x1024 -> 2048x2048, built-in bicubic x2): Blender's RSS growth over
three jobs with each result removed and with the results kept (next to their pixels), and the
longest single call of the add-on on Blender's main thread while a modal job runs.
Ends with one JSON line with the keys of issue #30 item 8 and issue #37 item 9.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))

_started: list[str] = []
_real_start = threading.Thread.start


def _recording_start(self, *args, **kwargs):
    _started.append(self.name)
    return _real_start(self, *args, **kwargs)


def _model(args, folder: Path) -> tuple[Path, str]:
    if args.model:
        return Path(args.model), f"given: {args.model}"
    from reference_models import reference_dir

    exported = reference_dir() / "compact-x4.onnx"
    if exported.is_file():
        return exported, f"compact-x4 reference export ({exported})"
    from builders_upscale import compact_model

    built = compact_model(folder / "compact-x4-like.onnx", num_conv=32, feat=64, scale=4)
    return built, "a seeded compact net (32 convs, 64 features, x4; no reference export found)"


def _mib(value) -> float:
    return round((value or 0) / 2**20, 1)


def _through_operators(side: int, jobs: int, *, float_source: bool = False, save_to: bool = False,
                       modal_runs: int = 1, save_suffix: str = "") -> dict:
    """Blender's side as artists use it (issue #37 items 5 and 9): tests/host_memory_job.py in a
    fresh bpy process, the Upscale button through ``bpy.ops`` (built-in bicubic x2, side -> 2 side),
    ``jobs`` jobs with each result removed, then ``jobs`` kept, then one driven as the UI drives it
    (start_modal, then one TIMER event at a time: each a call of the add-on on Blender's main thread).
    ``float_source``: the source is a float EXR, so the result is a float image (packed as EXR);
    ``save_to``: the modal jobs (``modal_runs`` of them) save their result at Save Result To, as a
    file of ``save_suffix`` (e.g. ".jpg"; empty: the source's kind, PNG or EXR)."""
    import subprocess
    import tempfile

    import blender_helpers as bh

    root = Path(tempfile.mkdtemp(prefix="bench_worker_ops_"))
    (root / "models").mkdir()  # empty: the built-in bicubic x2
    env = bh.isolated_blender_env(root / "blender", pythonpath=[bh.package_search_dir(root / "pkg")])
    env.update(LEAN_IMAGE_AI_MODELS_DIR=str(root / "models"), LEAN_IMAGE_AI_LOG_DIR=str(root / "logs"))
    config = {"side": side, "jobs": jobs, "folder": str(root), "out": str(root / "out.json"),
              "phases": ["removed", "kept", "modal"], "float": float_source,
              "save_to": save_to, "save_suffix": save_suffix, "modal_runs": modal_runs}
    (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "host_memory_job.py"), str(root / "config.json")],
                          env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"the bpy process of the operator jobs failed: {done.stderr[-2000:]}")
    out = json.loads((root / "out.json").read_text(encoding="utf-8"))
    removed, kept, modal = out["removed"], out["kept"], out["modal"]
    figures = {
        "removed": _mib(removed["rss_after"] - removed["rss_before"]),
        "kept": _mib(kept["rss_after"] - kept["rss_before"]),
        "kept_pixels": _mib(kept["result_pixel_bytes"]),
        "longest": max(modal["start_modal_s"], modal["longest_timer_call_s"]),
        "longest_pump": modal["longest_pump_call_s"],
        "result_call": modal["result_call_s"],
        "longest_call": modal["longest_call"],
        "most_cpu_call": max(modal["last_job_calls"], key=lambda call: call[2]),  # [wall, step, CPU], the last job's
    }
    print(f"through bpy.ops, Upscale {side}x{side} -> {kept['result_size'][0]}x{kept['result_size'][1]}: Blender's RSS "
          f"{_mib(removed['rss_before'])} -> {_mib(removed['rss_after'])} MiB over {jobs} jobs, each result removed; "
          f"{_mib(kept['rss_before'])} -> {_mib(kept['rss_after'])} MiB with {jobs} kept (their pixels: "
          f"{figures['kept_pixels']} MiB)")
    print(f"main thread, one modal Upscale job: invoke (start_modal) {modal['start_modal_s']:.3f} s "
          f"(CPU {modal['start_modal_cpu_s']:.3f} s), "
          f"{modal['timer_calls']} timer calls, longest {modal['longest_timer_call_s']:.3f} s; the one that makes "
          f"the result image: {modal['result_call_s']:.3f} s; the last: {modal['last_timer_call_s']:.3f} s; the longest "
          f"but the last: {modal['longest_pump_call_s']:.3f} s")
    longest = modal["longest_call"]
    print(f"the longest call ran '{longest['step']}' (its CPU time {longest['cpu_s']:.3f} s, the cycle collector "
          f"{longest['collector_s']:.3f} s); calls over 0.1 s in {_jobs_text(modal_runs)}: {modal['calls_over_0.1_s']}")
    wall, step, cpu = figures["most_cpu_call"]
    print(f"the last job's call of most CPU: {cpu:.3f} s CPU ({wall:.3f} s wall, '{step}')")
    return figures


def _apply_calls(args) -> None:
    """The longest call on Blender's main thread of the two cases apply2 left made whole in one call
    (issue #37 item 3): Remove Background with Replace on an ``--ops-side`` byte or float source (a
    seeded BEN2-like net of tests/builders_families.py: the apply's cost is the source's size, not
    the model's), and Process Sequence (built-in bicubic x2) over three ``--width``x``--height`` PNG
    frames. With ``--ops-start``: Upscale's start (``start_modal``) and its first calls on a byte PNG and
    a float EXR, the source given as ``filepath``, as the Image Editor's image not yet decoded, and
    decoded. Each case in a fresh bpy process (tests/host_memory_job.py's modal phase)."""
    import subprocess
    import tempfile

    import blender_helpers as bh
    from builders_families import ben2_like_model
    from PIL import Image

    figures = {}
    cases = []
    if args.ops_replace:
        for float_source in (False, True):  # with --ops-blender-writer: each after Blender's writer's (before)
            cases += [("replace_blender_writer", float_source, "file")] if args.ops_blender_writer else []
            cases.append(("replace", float_source, "file"))
    if args.ops_sequence:
        cases += [("sequence_blender_writer", False, "file")] if args.ops_blender_writer else []
        cases.append(("sequence", False, "file"))
    if args.ops_sequence_geometry:
        cases.append(("geometry", False, "file"))
    if args.ops_geometry:
        cases.append(("reconstruct", False, "file"))
    if args.ops_shot:
        cases.append(("shot", False, "file"))
    if args.ops_start:
        cases += [("upscale", float_source, source) for float_source in (False, True)
                  for source in ("file", "editor", "editor_decoded")]
    for kind, float_source, source in cases:
        if kind == "reconstruct":
            figures.update(_geometry_calls(args))
            continue
        if kind == "shot":
            figures.update(_shot_calls(args))
            continue
        root = Path(tempfile.mkdtemp(prefix=f"bench_worker_{kind}_"))
        (root / "models").mkdir()
        config = {"side": args.ops_side, "jobs": 1, "folder": str(root), "out": str(root / "out.json"),
                  "phases": ["modal"], "float": float_source, "modal_runs": args.ops_runs,
                  "modal_operator": "sequence" if kind == "geometry" else kind, "modal_source": source}
        if kind.startswith("replace"):
            config["model"] = str(ben2_like_model(root / "ben2.onnx", size=64))
            config["modal_operator"], config["blender_writer"] = "replace", kind == "replace_blender_writer"
            config["save_to"], config["save_suffix"] = args.ops_save, args.ops_save_suffix
        elif kind.startswith("sequence"):
            config["frames"] = str(_sequence_frames(root / "frames", args))
            config["modal_operator"] = "sequence"
            config["blender_writer"] = kind == "sequence_blender_writer"
            config["output_pattern"] = ("f_####.jpg" if args.ops_jpeg
                                        else f"shot_####{args.ops_frame_suffix}" if args.ops_frame_suffix else "")
        elif kind == "geometry":
            frames = root / "frames"
            frames.mkdir()
            y, x = np.mgrid[0:args.height, 0:args.width].astype(np.float32)
            for number in range(1, 4):
                rgb = np.stack([x / args.width, y / args.height, ((x + y + number * 97) % 256) / 255], axis=-1)
                if kind == "geometry":  # the seeded MoGe-2's mask is the red channel: geometry on most pixels
                    rgb[..., 0] = np.where(rgb[..., 2] < 0.9, 0.8, 0.2)
                Image.fromarray((rgb * 255).astype(np.uint8)).save(frames / f"shot_{number:04d}.png")
            config["frames"] = str(frames)
            if kind == "geometry":
                from builders_moge2 import moge2_like_model

                config["family"], config["model"] = "moge2", str(moge2_like_model(root / "moge2.onnx"))
        env = bh.isolated_blender_env(root / "blender", pythonpath=[bh.package_search_dir(root / "pkg")])
        env.update(LEAN_IMAGE_AI_MODELS_DIR=str(root / "models"), LEAN_IMAGE_AI_LOG_DIR=str(root / "logs"))
        (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "host_memory_job.py"), str(root / "config.json")],
                              env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"the bpy process of the {kind} jobs failed: {done.stderr[-2000:]}")
        modal = json.loads((root / "out.json").read_text(encoding="utf-8"))["modal"]
        bits = "float" if float_source else "byte"
        saving = f", Save Result To {args.ops_save_suffix or 'the source format'}" if args.ops_save else ""
        label = {"replace": f"Remove Background Replace {args.ops_side}x{args.ops_side} {bits}{saving}",
                 "replace_blender_writer": f"Remove Background Replace {args.ops_side}x{args.ops_side} {bits}{saving}, "
                                           "the cut-out written whole and saved/packed by Blender's writer",
                 "upscale": f"Upscale {args.ops_side}x{args.ops_side} {bits}, source: {source}",
                 "sequence": f"Process Sequence (upscale x2), 3 frames {args.width}x{args.height} "
                             f"{_frames_label(args)} -> {'.jpg' if args.ops_jpeg else args.ops_frame_suffix or ('.exr' if args.ops_frame_exr else '.png')}",
                 "sequence_blender_writer": f"Process Sequence (upscale x2), 3 frames {args.width}x{args.height} "
                                            f"{args.ops_frame_bits}-bit PNG, every frame saved by Blender's writer",
                 "geometry": f"Process Sequence (seeded MoGe-2), 3 frames {args.width}x{args.height}"}[kind]
        longest = modal["longest_call"]
        print(f"{label}: the job {modal['job_wall_s']:.1f} s, start_modal {modal['start_modal_s']:.3f} s "
              f"(CPU {modal['start_modal_cpu_s']:.3f} s), {modal['timer_calls']} timer calls, longest "
              f"{modal['longest_timer_call_s']:.3f} s ('{longest['step']}', CPU {longest['cpu_s']:.3f} s), the last "
              f"{modal['last_timer_call_s']:.3f} s; calls over 0.1 s in {_jobs_text(args.ops_runs)}: {modal['calls_over_0.1_s']}")
        if kind in ("geometry", "sequence"):  # each call of the job: wall, what it ran, CPU
            print("  the job's calls (wall s, step, CPU s), longest first:",
                  sorted(modal["last_job_calls"], reverse=True)[:12])
            most_cpu = max(modal["last_job_calls"], key=lambda call: call[2])
            print(f"  the call of most CPU: {most_cpu[2]:.3f} s CPU ({most_cpu[0]:.3f} s wall, '{most_cpu[1]}')")
            print("  the calls of most CPU (CPU s, wall s, step):",
                  sorted(((call[2], call[0], call[1]) for call in modal["last_job_calls"]), reverse=True)[:8])
            figures[f"{kind}_most_cpu_call_s"] = most_cpu[2]
        if kind == "upscale":  # --ops-start: the start's own call, and the longest after it
            print(f"  start_modal CPU {modal['start_modal_cpu_s']:.3f} s; the first calls: {modal['last_job_calls'][:4]}")
            figures[f"start_{bits}_{source}_s"] = round(modal["start_modal_s"], 3)
            figures[f"start_{bits}_{source}_cpu_s"] = round(modal["start_modal_cpu_s"], 3)
            figures[f"start_{bits}_{source}_longest_timer_call_s"] = round(modal["longest_timer_call_s"], 3)
            continue
        key = f"{kind}_{bits}" if kind.startswith("replace") else kind
        figures[f"{key}_longest_call_s"] = round(max(modal["start_modal_s"], modal["longest_timer_call_s"]), 3)
        figures[f"{key}_longest_cpu_s"] = round(longest["cpu_s"], 3)
        figures[f"{key}_most_cpu_in_a_call_s"] = round(max(call[2] for call in modal["last_job_calls"]), 3)  # the last job's
        figures[f"{key}_job_s"] = round(modal["job_wall_s"], 1)
        if kind == "geometry":
            figures.update(_geometry_split(args, root / "frames", Path(config["model"])))
    print(json.dumps(figures))


def _frames_label(args) -> str:
    return "float EXR" if args.ops_frame_exr else f"{args.ops_frame_bits}-bit PNG"


def _sequence_frames(folder: Path, args) -> Path:
    """Three ``--width``x``--height`` RGB frames, PNG of ``--ops-frame-bits`` (16: the add-on's own
    16-bit PNG encoder, opaque; their results are 16-bit too), or with ``--ops-frame-exr`` 32-bit
    float EXR (the add-on's own encoder, opaque; their results are EXR)."""
    from lean_image_ai.models import file_bytes
    from PIL import Image

    folder.mkdir()
    y, x = np.mgrid[0:args.height, 0:args.width].astype(np.float32)
    for number in range(1, 4):
        rgb = np.stack([x / args.width, y / args.height, ((x + y + number * 97) % 256) / 255], axis=-1)
        path = folder / f"shot_{number:04d}.png"
        if args.ops_frame_exr:
            rgba = np.dstack([rgb, np.ones_like(x)]).astype(np.float32)
            path.with_suffix(".exr").write_bytes(
                file_bytes.ExrFile(args.height, args.width, lambda a, b, rgba=rgba: rgba[a:b]).finish_now())
            continue
        if args.ops_frame_bits == 8:
            Image.fromarray((rgb * 255).astype(np.uint8)).save(path)
            continue
        rgba = np.dstack([rgb, np.ones_like(x)])
        samples = file_bytes.blender_samples.quantised(rgba, 65535, np.uint16)
        path.write_bytes(file_bytes.PngFile(args.height, args.width, lambda a, b, samples=samples: samples[a:b],
                                            sixteen_bit=True).finish_now())
    return folder


def _timed(work) -> tuple[float, float]:
    """(wall, CPU) seconds of ``work()`` on this thread."""
    started, cpu_started = time.perf_counter(), time.thread_time()
    work()
    return time.perf_counter() - started, time.thread_time() - cpu_started


def _geometry_split(args, frames: Path, model: Path) -> dict:
    """The parts of one frame's write in one call (models/adapters/moge2_mesh.py write_geometry
    through Blender's writer for the normal map), each timed here (this process plays Blender's),
    on frame 1's result computed in this process; then the same files made by the staged
    GeometryFiles, each of its calls timed."""
    import tempfile

    from lean_image_ai.models import file_formats
    from lean_image_ai.models.adapters import moge2, moge2_mesh
    from lean_image_ai.models.result_images import ImageProduct
    from lean_image_ai.operators import results
    from PIL import Image

    picture = np.asarray(Image.open(sorted(frames.iterdir())[0]).convert("RGB"))
    result = moge2.run(picture, model)
    out = Path(tempfile.mkdtemp(prefix="bench_geometry_split_")) / "frame.ply"
    kept = {}

    def mesh():
        kept["arrays"] = moge2_mesh.mesh_arrays(result.points, result.mask, discontinuity=0.04)

    def normals():
        kept["normals"] = ImageProduct(moge2_mesh.normal_map(result.normal, result.mask)[..., :3], is_data=True)

    parts = {
        "mesh numpy (mesh_arrays)": mesh,
        "PLY bytes + write": lambda: file_formats.write_ply(out, kept["arrays"].vertices, kept["arrays"].quads,
                                                             kept["arrays"].uv, comment="bench"),
        "JSON camera": lambda: file_formats.write_json(out.with_suffix(".json"), {"stride": kept["arrays"].stride}),
        "normal map numpy (normal_map)": normals,
        "normal map EXR (Blender's writer)": lambda: results.save_product(out.with_name("frame_normal.exr"), kept["normals"]),
    }
    figures, total = {}, [0.0, 0.0]
    print(f"one frame's write in one call, {args.width}x{args.height} ({len(result.mask.ravel())} pixels):")
    for name, work in parts.items():
        wall, cpu = _timed(work)
        total[0], total[1] = total[0] + wall, total[1] + cpu
        print(f"  {name}: {wall:.3f} s wall, {cpu:.3f} s CPU")
    print(f"  all of it: {total[0]:.3f} s wall, {total[1]:.3f} s CPU ({len(kept['arrays'].vertices)} vertices)")
    figures["geometry_one_call_s"], figures["geometry_one_call_cpu_s"] = round(total[0], 3), round(total[1], 3)
    if not hasattr(moge2_mesh, "GeometryFiles"):  # a tree from before the staged files (the before run)
        return figures
    staged = moge2_mesh.GeometryFiles(out.with_name("staged.ply"), result, discontinuity=0.04)
    calls, done = [], []
    while not done:
        calls.append(_timed(lambda: done.append(True) if staged.pump(0.05) else None))
    longest = max(calls)
    print(f"the same files staged (GeometryFiles, a 0.05 s budget a call): {len(calls)} calls, longest "
          f"{longest[0]:.3f} s wall ({longest[1]:.3f} s CPU), the last (the three files written) {calls[-1][0]:.3f} s "
          f"wall ({calls[-1][1]:.3f} s CPU), all {sum(c[0] for c in calls):.3f} s wall, {sum(c[1] for c in calls):.3f} s CPU")
    figures["geometry_staged_longest_s"], figures["geometry_staged_longest_cpu_s"] = round(longest[0], 3), round(longest[1], 3)
    return figures


GEOMETRY_SIZES = ((1024, 768), (1920, 1080))


def _geometry_calls(args) -> dict:
    """Reconstruct Geometry through bpy.ops (issue #37 item 3): a seeded MoGe-2-like net
    (tests/builders_moge2.py: a tilted plane, every pixel valid, so every cell a quad) on a photo of
    each of :data:`GEOMETRY_SIZES`, each in a fresh bpy process; every main-thread call of the last job
    printed with its wall and CPU time and the step it ran."""
    import subprocess
    import tempfile

    import blender_helpers as bh
    from builders_moge2 import moge2_like_model
    from PIL import Image

    figures = {}
    for width, height in GEOMETRY_SIZES:
        root = Path(tempfile.mkdtemp(prefix="bench_worker_geometry_"))
        (root / "models").mkdir()
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        rgb = np.stack([np.ones_like(x), x / width, y / height], axis=-1)  # red: valid everywhere (the net's mask)
        Image.fromarray((rgb * 255).astype(np.uint8)).save(root / "photo.png")
        config = {"side": 64, "jobs": 1, "folder": str(root), "out": str(root / "out.json"), "phases": ["modal"],
                  "modal_runs": args.ops_runs, "modal_operator": "geometry", "photo": str(root / "photo.png"),
                  "model": str(moge2_like_model(root / "moge2.onnx"))}
        env = bh.isolated_blender_env(root / "blender", pythonpath=[bh.package_search_dir(root / "pkg")])
        env.update(LEAN_IMAGE_AI_MODELS_DIR=str(root / "models"), LEAN_IMAGE_AI_LOG_DIR=str(root / "logs"))
        (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "host_memory_job.py"), str(root / "config.json")],
                              env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"the bpy process of the geometry jobs failed: {done.stderr[-2000:]}")
        modal = json.loads((root / "out.json").read_text(encoding="utf-8"))["modal"]
        longest = modal["longest_call"]
        print(f"Reconstruct Geometry {width}x{height}: start_modal {modal['start_modal_s']:.3f} s "
              f"(CPU {modal['start_modal_cpu_s']:.3f} s), {modal['timer_calls']} timer calls; the last job's calls "
              "(wall s, CPU s, step):")
        for seconds, step, cpu in modal["last_job_calls"]:
            print(f"  {seconds:7.3f} {cpu:7.3f}  {step}")
        busiest = modal["most_cpu_call"]
        print(f"  longest: {longest['seconds']:.3f} s ('{longest['step']}', CPU {longest['cpu_s']:.3f} s); the most CPU: "
              f"{busiest['cpu_s']:.3f} s ('{busiest['step']}', {busiest['seconds']:.3f} s); calls over 0.1 s in "
              f"{_jobs_text(args.ops_runs)}: {modal['calls_over_0.1_s']}")
        key = f"geometry_{width}x{height}"
        figures[f"{key}_longest_call_s"] = round(max(modal["start_modal_s"], modal["longest_timer_call_s"]), 3)
        figures[f"{key}_most_cpu_s"] = round(max(busiest["cpu_s"], modal["start_modal_cpu_s"]), 3)
        figures[f"{key}_most_cpu_step"] = (busiest["step"] if busiest["cpu_s"] >= modal["start_modal_cpu_s"]
                                           else "start_modal")
    return figures


def _shot_calls(args) -> dict:
    """Reconstruct Shot through bpy.ops (issue #37 item 3): the seeded MoGe-2-like net of
    :func:`_geometry_calls` (every pixel valid) on three ``--width``x``--height`` PNG frames, a mesh
    per frame, in a fresh bpy process; every main-thread call of the last job printed with its wall
    and CPU time and the step it ran (the stage the job was at, and the one the call reached)."""
    import subprocess
    import tempfile

    import blender_helpers as bh
    from builders_moge2 import moge2_like_model
    from PIL import Image

    width, height = args.width, args.height
    root = Path(tempfile.mkdtemp(prefix="bench_worker_shot_"))
    (root / "models").mkdir()
    frames = root / "frames"
    frames.mkdir()
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    for number in range(1, 4):  # red: valid everywhere (the net's mask); the frames differ in green and blue
        rgb = np.stack([np.ones_like(x), ((x + number * 97) % width) / width, y / height], axis=-1)
        Image.fromarray((rgb * 255).astype(np.uint8)).save(frames / f"shot_{number:04d}.png")
    config = {"side": 64, "jobs": 1, "folder": str(root), "out": str(root / "out.json"), "phases": ["modal"],
              "modal_runs": args.ops_runs, "modal_operator": "shot", "frames": str(frames),
              "model": str(moge2_like_model(root / "moge2.onnx"))}
    env = bh.isolated_blender_env(root / "blender", pythonpath=[bh.package_search_dir(root / "pkg")])
    env.update(LEAN_IMAGE_AI_MODELS_DIR=str(root / "models"), LEAN_IMAGE_AI_LOG_DIR=str(root / "logs"))
    (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "host_memory_job.py"), str(root / "config.json")],
                          env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"the bpy process of the shot jobs failed: {done.stderr[-2000:]}")
    modal = json.loads((root / "out.json").read_text(encoding="utf-8"))["modal"]
    print(f"Reconstruct Shot, 3 frames {width}x{height}: start_modal {modal['start_modal_s']:.3f} s "
          f"(CPU {modal['start_modal_cpu_s']:.3f} s), {modal['timer_calls']} timer calls; the last job's calls "
          "(wall s, CPU s, step):")
    for seconds, step, cpu in modal["last_job_calls"]:
        print(f"  {seconds:7.3f} {cpu:7.3f}  {step}")
    longest, busiest = modal["longest_call"], modal["most_cpu_call"]
    print(f"  longest: {longest['seconds']:.3f} s ('{longest['step']}', CPU {longest['cpu_s']:.3f} s); the most CPU: "
          f"{busiest['cpu_s']:.3f} s ('{busiest['step']}', {busiest['seconds']:.3f} s); calls over 0.1 s in "
          f"{_jobs_text(args.ops_runs)}: {len(modal['calls_over_0.1_s'])}")
    key = f"shot_{width}x{height}"
    return {f"{key}_longest_call_s": round(max(modal["start_modal_s"], modal["longest_timer_call_s"]), 3),
            f"{key}_most_cpu_s": round(max(busiest["cpu_s"], modal["start_modal_cpu_s"]), 3),
            f"{key}_most_cpu_step": busiest["step"] if busiest["cpu_s"] >= modal["start_modal_cpu_s"] else "start_modal",
            f"{key}_timer_calls": modal["timer_calls"]}


def _jobs_text(runs: int) -> str:
    return f"{runs} job{'s' if runs > 1 else ''}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--small", type=int, default=256, help="side of the three small jobs")
    parser.add_argument("--model", default="")
    parser.add_argument("--pairs", type=int, default=4, help="worker/in-process pairs of the full-size job")
    parser.add_argument("--ops-side", type=int, default=1024, help="side of the Upscale jobs through bpy.ops")
    parser.add_argument("--ops-only", action="store_true", help="only the jobs through bpy.ops (issue 37 items 5, 9)")
    parser.add_argument("--ops-float", action="store_true", help="those jobs on a float EXR source (a float result)")
    parser.add_argument("--ops-save", action="store_true", help="the modal jobs save at Save Result To")
    parser.add_argument("--ops-save-suffix", default="", help="--ops-save's file format, e.g. .jpg (else the source's)")
    parser.add_argument("--ops-runs", type=int, default=1, help="modal jobs measured (the longest call over all)")
    parser.add_argument("--ops-replace", action="store_true", help="only Remove Background Replace's calls (byte, float; with --ops-save: saved at Save Result To)")
    parser.add_argument("--ops-sequence", action="store_true", help="only Process Sequence's calls (3 PNG frames)")
    parser.add_argument("--ops-sequence-geometry", action="store_true",
                        help="only Process Sequence's calls with a seeded MoGe-2 (3 frames: mesh, camera, normal map)")
    parser.add_argument("--ops-geometry", action="store_true",
                        help="only Reconstruct Geometry's calls (MoGe-2-like net, 1024x768 and 1920x1080)")
    parser.add_argument("--ops-jpeg", action="store_true", help="--ops-sequence writes .jpg frames (else PNG)")
    parser.add_argument("--ops-frame-bits", type=int, choices=(8, 16), default=8, help="bits of those PNG frames")
    parser.add_argument("--ops-frame-exr", action="store_true", help="--ops-sequence reads float EXR frames")
    parser.add_argument("--ops-frame-suffix", default="", help="their results' format (.tif; default: PNG)")
    parser.add_argument("--ops-blender-writer", action="store_true",
                        help="also the same sequence (or Replace) with every frame (the cut-out) saved by Blender's writer, as before the banded encoders")
    parser.add_argument("--ops-shot", action="store_true",
                        help="only Reconstruct Shot's calls (MoGe-2-like net, 3 frames --width x --height)")
    parser.add_argument("--ops-start", action="store_true",
                        help="only the Upscale job's start (start_modal) and calls: byte and float, the source as "
                             "filepath, as the Image Editor's image not decoded, and decoded")
    args = parser.parse_args(argv)
    if (args.ops_replace or args.ops_sequence or args.ops_sequence_geometry or args.ops_geometry or args.ops_shot
            or args.ops_start):
        _apply_calls(args)
        return 0
    operators = _through_operators(args.ops_side, 3, float_source=args.ops_float, save_to=args.ops_save,
                                   modal_runs=args.ops_runs, save_suffix=args.ops_save_suffix)  # first: a process of its own, this one still bare
    if args.ops_only:
        print(json.dumps({"longest_main_thread_call_s": round(operators["longest"], 3),
                          "longest_pump_call_s": round(operators["longest_pump"], 3),
                          "result_call_s": round(operators["result_call"], 3),
                          "most_cpu_in_a_call_s": operators["most_cpu_call"][2],
                          "blender_rss_growth_mib_results_removed": operators["removed"],
                          "blender_rss_growth_mib_results_kept": operators["kept"]}))
        return 0

    import tempfile

    import bpy  # noqa: F401 - this process is Blender's
    from lean_image_ai.models.batch.frame_lists import FrameRef
    from lean_image_ai.models.batch.sequence import BatchRun
    from lean_image_ai.models.model_run import ModelRun
    from lean_image_ai.models.worker.client import WorkerClient
    from lean_image_ai.models.worker.remote_batch import RemoteBatchRun
    from lean_image_ai.runtime.errors import LeanImageError
    from lean_image_ai.runtime.measure.memory import process_rss_bytes

    folder = Path(tempfile.mkdtemp(prefix="bench_worker_"))
    model, model_text = _model(args, folder)
    job = ModelRun.resolve("upscale", folder, model_path=str(model), device="cpu")
    rng = np.random.default_rng(0)
    small = rng.random((args.small, args.small, 4), dtype=np.float32)
    full = rng.random((args.height, args.width, 4), dtype=np.float32)
    client = WorkerClient()

    def remote(pixels, **hooks):
        kept = []  # each result's shape: a result kept alive would count as Blender's growth
        run = RemoteBatchRun(job, [FrameRef(1, Path("photo.png"))], lambda ref: pixels,
                             lambda ref, result: kept.append(result.image.shape), options=job.options(**hooks),
                             client=client)
        return run, kept

    def timed_remote(pixels) -> tuple[float, list]:
        started = time.perf_counter()
        run, kept = remote(pixels)
        run.run()
        return time.perf_counter() - started, kept

    print(f"model: {model_text}")
    # -- Blender's process during three jobs -----------------------------------------------------
    threading.Thread.start = _recording_start
    rss_before = process_rss_bytes()
    first, _ = timed_remote(small)
    second, _ = timed_remote(small)
    third, _ = timed_remote(small)
    rss_after = process_rss_bytes()
    threading.Thread.start = _real_start
    threads = len(_started)
    ort_here = any(name.split(".")[0] == "onnxruntime" for name in sys.modules)
    spawn = first - min(second, third)
    print(f"3 jobs {args.small}x{args.small}: {first:.2f} s (worker start), {second:.2f} s, {third:.2f} s; "
          f"threads started here {threads}, onnxruntime here {ort_here}, RSS here {_mib(rss_before)} -> {_mib(rss_after)} MiB")

    # -- cancel in the middle of one long tile -------------------------------------------------
    stages = []
    run, kept = remote(full, progress=lambda fraction, stage: stages.append(stage))
    begun = time.monotonic()
    while not run.pump(0.01) and time.monotonic() - begun < 2.0:
        pass  # two seconds in: inside the job's long run
    esc = time.monotonic()
    run.cancel()
    while not run.pump(0.01):
        pass
    cancel_seconds = time.monotonic() - esc
    print(f"cancel mid-tile: over {cancel_seconds:.2f} s after the cancel (cancelled={run.report.cancelled}, "
          f"written={len(kept)}, worker {'ended' if not client.running else 'kept'})")

    # -- kill -9 mid-job ----------------------------------------------------------------------
    run, kept = remote(full)
    while not run.pump(0.01) and not client.running:
        pass
    time.sleep(0.5)
    os.kill(client.pid, signal.SIGKILL)
    line = ""
    try:
        run.run()
    except LeanImageError as exc:
        line = str(exc)
    again, kept_again = timed_remote(small)
    survived = bool(line) and len(kept_again) == 1 and not kept
    print(f"kill -9: '{line}'; the next job wrote {len(kept_again)} result(s) in {again:.2f} s")

    # -- warm full-size jobs: through the worker and in this process, alternating ----------------
    def in_process(pixels) -> float:
        kept = []
        local = BatchRun([FrameRef(1, Path("photo.png"))], job.infer, lambda ref: pixels,
                         lambda ref, result: kept.append(result.image.shape), options=job.options())
        started = time.perf_counter()
        local.run()
        return time.perf_counter() - started

    timed_remote(small)  # both sessions loaded before anything is timed
    in_process(small)
    ratios = []
    for index in range(args.pairs):  # which side runs first alternates: a machine's drift cancels out
        if index % 2:
            local_seconds = in_process(full)
            worker_seconds, _ = timed_remote(full)
        else:
            worker_seconds, _ = timed_remote(full)
            local_seconds = in_process(full)
        ratios.append(worker_seconds / local_seconds)
        print(f"{args.width}x{args.height} pair {index + 1}: worker {worker_seconds:.2f} s, in-process {local_seconds:.2f} s, "
              f"ratio {ratios[-1]:.3f}")
    ratio = float(np.median(ratios))
    rss_worker = client.status.get("rss_bytes")
    freed = client.free_now()
    print(f"free now: {_mib(freed.get('rss_bytes'))} MiB RAM, VRAM {_mib(freed.get('vram_bytes'))} MiB "
          f"(worker RSS after the full jobs {_mib(rss_worker)} MiB)")

    print(json.dumps({
        "blender_threads_started": threads,
        "onnxruntime_in_blender": ort_here,
        "blender_rss_growth_mib": _mib((rss_after or 0) - (rss_before or 0)),
        "worker_over_in_process": round(ratio, 3),
        "spawn_seconds": round(spawn, 2),
        "cancel_seconds": round(cancel_seconds, 2),
        "survived_kill9": survived,
        "free_now_returned_mib": _mib(freed.get("rss_bytes")),
        "blender_rss_growth_mib_results_removed": operators["removed"],
        "blender_rss_growth_mib_results_kept": operators["kept"],
        "blender_results_kept_pixels_mib": operators["kept_pixels"],
        "longest_main_thread_call_s": round(operators["longest"], 3),
        "longest_pump_call_s": round(operators["longest_pump"], 3),
    }))
    client.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
