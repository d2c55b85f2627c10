"""Blender's own memory through the Upscale button (issue #37 item 5), in a bpy process of its own.

    python host_memory_job.py CONFIG.json   writes CONFIG's "out" (one JSON object)

CONFIG: "side" (the source's side; the built-in bicubic x2 makes it twice that), "jobs" (per
phase), "folder" (a scratch folder), "out", "float" (optional: a float EXR source), "modal_runs"
and "save_to" (optional: the modal phase's job count, and Save Result To set; "save_suffix": its
format, else the source's), and "phases": any of
  removed   RSS before and after ``jobs`` Upscale jobs, each result image removed after its job
  kept      the same with every result kept: growth next to the results' own pixel bytes
  refs      with Python's cycle collector off: weak references to the job's task and every
            array it held (source pixels, model input, the result) are dead once the job is over
            and its result image removed, i.e. no reference cycle holds them
  modal     the job driven as Blender's UI drives it (start_modal, then a TIMER event at a time):
            the longest single call of the add-on on the main thread while the job runs; CONFIG
            "modal_source" (optional): "file" (default: the source as ``filepath``), "editor" (the
            Image Editor's image, loaded but not decoded) or "editor_decoded" (decoded, as an
            image the Image Editor shows)
Every phase runs after one warm-up job (the worker's start, first imports), whose result is removed.
The models folder is empty, so Upscale uses the built-in bicubic x2 (no model file needed). Used by
tests/test_host_memory.py and bench/worker.py.
"""

import gc
import json
import sys
import time
import weakref
from pathlib import Path
from types import SimpleNamespace

import bpy
import numpy as np
import psutil

CONFIG = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import lean_image_ai  # noqa: E402
from lean_image_ai.operators import job_operator, jobs, memory_ops  # noqa: E402

FOLDER = Path(CONFIG["folder"])


def rss() -> int:
    return psutil.Process().memory_info().rss


def source_file(side: int) -> str:
    """A smooth 8-bit photo-like PNG (a packed result of noise would weigh twice its pixels); with
    CONFIG "float", a float EXR of the same pixels (its result a float image)."""
    is_float = CONFIG.get("float", False)
    path = FOLDER / f"source_{side}.{'exr' if is_float else 'png'}"
    if not path.is_file():
        y, x = np.mgrid[0:side, 0:side].astype(np.float32) / side
        pixels = np.stack([x, y, (x + y) / 2, np.ones_like(x)], axis=-1)
        image = bpy.data.images.new("source", side, side, alpha=True, float_buffer=is_float)
        image.pixels.foreach_set(pixels.ravel())
        image.filepath_raw, image.file_format = str(path), "OPEN_EXR" if is_float else "PNG"
        image.save()
        bpy.data.images.remove(image)
    return str(path)


def upscale(path: str) -> list:
    """One Upscale job through bpy.ops; returns the result image it made (the memory picture of
    operators/memory_ops.py is made once, by the warm-up, and drawn again after every job)."""
    before = set(bpy.data.images)
    assert bpy.ops.lean_image_ai.upscale(filepath=path) == {"FINISHED"}
    made = [image for image in bpy.data.images if image not in before and image.name != memory_ops.PLOT_IMAGE]
    assert [image.name.startswith(Path(path).stem) for image in made] == [True], [image.name for image in made]
    return made


def pixel_bytes(image) -> int:
    width, height = image.size
    return width * height * image.channels * (4 if image.is_float else 1)


def remove(images) -> None:
    for image in images:
        bpy.data.images.remove(image)


def phase_removed(path: str) -> dict:
    before = rss()
    for _ in range(CONFIG["jobs"]):
        remove(upscale(path))
    after = rss()
    return {"rss_before": before, "rss_after": after}


def phase_kept(path: str) -> dict:
    before = rss()
    made = [image for _ in range(CONFIG["jobs"]) for image in upscale(path)]
    after = rss()
    result = {"rss_before": before, "rss_after": after, "results": len(made),
              "result_pixel_bytes": sum(pixel_bytes(image) for image in made),
              "one_result_pixel_bytes": pixel_bytes(made[0]), "result_size": list(made[0].size)}
    remove(made)
    return result


def phase_refs(path: str) -> dict:
    """See module doc. Blender frees a removed image at once; Python keeps what a cycle holds."""
    refs = {}

    def watch(job) -> None:
        inputs, result = job.inputs, job.result
        for name, value in (("task", job.task), ("source_pixels", getattr(inputs, "rgba", None)),
                            ("model_input", getattr(inputs, "model_rgba", None)),
                            ("result", getattr(result, "image", None))):
            if value is not None:
                refs[name] = weakref.ref(value)

    jobs.manager.on_end.append(watch)
    gc.collect()
    gc.disable()
    try:
        remove(upscale(path))
        alive = sorted(name for name, ref in refs.items() if ref() is not None)
    finally:
        gc.enable()
        jobs.manager.on_end.remove(watch)
    return {"watched": sorted(refs), "alive": alive}


def modal_operator(path: str):
    """The operator of the modal phase and its properties: CONFIG "modal_operator" is "upscale"
    (default), "replace" (Remove Background with Replace on the source, CONFIG "model" its ONNX
    file; CONFIG "blender_writer": the cut-out saved and packed by Blender's writer, as before the pump
    wrote its file), "sequence" (Process Sequence, CONFIG "family", over the frames of CONFIG "frames", named as
    CONFIG "output_pattern" says, else the default names; CONFIG "blender_writer": Blender's writer saves
    every frame, as before the banded encoders), "geometry" (Reconstruct Geometry of CONFIG
    "photo" with the MoGe-2 model CONFIG "model") or "shot" (Reconstruct Shot of the frames of CONFIG
    "frames" with that model)."""
    from lean_image_ai.operators.batch_ops import LEAN_IMAGE_AI_OT_process_sequence
    from lean_image_ai.operators.geometry_ops import LEAN_IMAGE_AI_OT_reconstruct_geometry
    from lean_image_ai.operators.image_ops import LEAN_IMAGE_AI_OT_remove_background, LEAN_IMAGE_AI_OT_upscale
    from lean_image_ai.operators.shot_ops import LEAN_IMAGE_AI_OT_reconstruct_shot

    kind = CONFIG.get("modal_operator", "upscale")
    if kind == "replace":
        if CONFIG.get("blender_writer"):  # the cut-out written whole, saved and packed by Blender's writer (as before)
            from lean_image_ai.operators import image_ops

            image_ops._packs_cutout_in_place = lambda inputs: False
        return LEAN_IMAGE_AI_OT_remove_background, {"filepath": path, "model_path": CONFIG["model"], "replace": True}
    if kind == "sequence":
        output = str(FOLDER / "sequence_out") + "/" + CONFIG.get("output_pattern", "")  # e.g. "f_####.jpg"
        if CONFIG.get("blender_writer"):  # every frame saved by Blender's writer in one call, as before the banded encoders
            from lean_image_ai.models import file_bytes

            file_bytes.product_file = lambda path, product: None
        return LEAN_IMAGE_AI_OT_process_sequence, {"family": CONFIG.get("family", "upscale"), "source": CONFIG["frames"],
                                                   "output": output, "overwrite": True,
                                                   "model_path": CONFIG.get("model", "")}
    if kind == "geometry":
        return LEAN_IMAGE_AI_OT_reconstruct_geometry, {"filepath": CONFIG["photo"], "model_path": CONFIG["model"],
                                                       "resolution_level": 0}
    if kind == "shot":
        return LEAN_IMAGE_AI_OT_reconstruct_shot, {"source": CONFIG["frames"], "model_path": CONFIG["model"],
                                                   "resolution_level": 0}
    return LEAN_IMAGE_AI_OT_upscale, {"filepath": path}


def made_count(path: str) -> int:
    """Images but the source file's, which a ``filepath`` job's first timer call loads (and its read
    removes again)."""
    return sum(image.filepath != path for image in bpy.data.images)


def editor_source(path: str):
    """The Image Editor's image of the modal phase (CONFIG "modal_source"), or None: ``filepath``."""
    kind = CONFIG.get("modal_source", "file")
    if kind == "file":
        return None
    image = bpy.data.images.load(path, check_existing=False)
    if kind == "editor_decoded":
        image.size[0]  # Blender decodes the file here, as for an image the Image Editor shows
    return image


def phase_modal(path: str) -> dict:
    """See module doc: the stand-ins of tests/modal_standins.py for the window manager. Each call is
    labelled with the step it ran (the task's part and the job's stage before the call), the time
    Python's cycle collector took in it and the main thread's CPU time in it (a call far longer than
    its CPU time waited for a core: other processes had them); CONFIG "modal_runs" (default 1) jobs, the figures over all."""
    import modal_standins as ms

    real, props = modal_operator(path)
    if CONFIG.get("modal_source", "file") != "file":
        props = {key: value for key, value in props.items() if key != "filepath"}
    driver = ms.driver_class(real, "lean_image_ai_test.drive_upscale", "LEANTEST_OT_drive_upscale")
    bpy.utils.register_class(driver)
    calls, collecting, made, start_cpu = [], {"began": 0.0, "spent": 0.0}, {}, []

    def on_collect(phase, info):  # the collector's time inside a call, a suspect of a long one
        if phase == "start":
            collecting["began"] = time.perf_counter()
        else:
            collecting["spent"] += time.perf_counter() - collecting["began"]

    def step_of(op) -> str:
        if getattr(op, "_end", None) is not None:
            return "the job's end"  # applied: its end a step per call (operators/jobs.py's JobEnd)
        job = op._job
        task = getattr(job, "task", None)
        part = ("start" if getattr(op, "_start_steps", None)
                else "before" if getattr(task, "before", None) is not None
                else "steps" if getattr(task, "_steps", None) is not None else "batch")
        return f"{part}: {job.stage}"

    def script(op):
        ctx = ms.StandInContext()
        source = editor_source(path)
        if source is not None:
            ctx.space_data = SimpleNamespace(type="IMAGE_EDITOR", image=source)
        before = set(bpy.data.images)
        started, cpu_started = time.perf_counter(), time.thread_time()
        job_started = started
        state = op.start_modal(ctx)
        start_s = time.perf_counter() - started
        start_cpu.append(time.thread_time() - cpu_started)
        job_calls = []
        while state == {"RUNNING_MODAL"}:
            step, collecting["spent"] = step_of(op), 0.0
            images = made_count(path)
            started, cpu_started = time.perf_counter(), time.thread_time()
            state = op.modal(ctx, ms.TIMER)
            seconds = time.perf_counter() - started
            if step != "the job's end" and getattr(op, "_end", None) is not None:
                step = f"apply ({step})"  # the call that ran finish(): the job's result made in Blender
            elif step.startswith("steps") and state == {"RUNNING_MODAL"} and op._job.stage not in step:
                step = f"steps: {op._job.stage}"  # a step that said what it runs: the stage it set in the call
            elif (CONFIG.get("modal_operator") == "shot" and step.startswith("batch") and state == {"RUNNING_MODAL"}
                  and op._job.stage not in step):
                step = f"{step} -> {op._job.stage}"  # a frame's result made in the batch's pump: the stage it reached
            if made_count(path) > images and "made" not in made:
                made["made"] = seconds  # the call that made the result image
            job_calls.append((seconds, step, collecting["spent"], time.thread_time() - cpu_started))
            time.sleep(job_operator.TIMER_INTERVAL)  # what Blender waits between two timer events
        made.setdefault("job_walls", []).append(time.perf_counter() - job_started)  # start_modal to the end
        remove([image for image in bpy.data.images if image not in before] + ([source] if source else []))
        calls.append(job_calls)
        return state, start_s

    gc.callbacks.append(on_collect)
    try:
        starts = []
        for run in range(CONFIG.get("modal_runs", 1)):
            saved = {}
            if CONFIG.get("save_to"):  # Save Result To: a file of the source's kind (PNG, or EXR for a float one)
                suffix = CONFIG.get("save_suffix") or Path(path).suffix  # or another format (a .jpg, say)
                saved = {"output_path": str(FOLDER / f"saved_{run}{suffix}"), "overwrite": True}
            made.pop("made", None)
            state, start_s = ms.drive(bpy.ops.lean_image_ai_test.drive_upscale, script, **props, **saved)
            starts.append(start_s)
            made.setdefault("made_calls", []).append(made.get("made", 0.0))
    finally:
        gc.callbacks.remove(on_collect)
        bpy.utils.unregister_class(driver)
    last = [job_calls[-1] for job_calls in calls]
    pumps = [call for job_calls in calls for call in job_calls[:-1]]  # every call but the last, which applies
    longest = max(pumps + last)
    return {"state": sorted(state), "start_modal_s": max(starts), "start_modal_cpu_s": start_cpu[starts.index(max(starts))],
            "timer_calls": len(calls[-1]),
            "longest_timer_call_s": longest[0], "last_timer_call_s": max(last)[0],
            "longest_pump_call_s": max(pumps, default=(0.0,))[0],
            "result_call_s": max(made["made_calls"]), "job_wall_s": max(made["job_walls"]),
            "last_job_calls": [[round(c[0], 3), c[1], round(c[3], 3)] for c in calls[-1]],
            "longest_call": {"seconds": longest[0], "step": longest[1], "collector_s": longest[2], "cpu_s": longest[3]},
            "most_cpu_call": dict(zip(("seconds", "step", "collector_s", "cpu_s"), max(pumps + last, key=lambda c: c[3]),
                                      strict=True)),
            "calls_over_0.1_s": [{"seconds": round(c[0], 3), "step": c[1], "collector_s": round(c[2], 3),
                                  "cpu_s": round(c[3], 3), "call": f"{index + 1} of {len(job_calls)}"}
                                 for job_calls in calls for index, c in enumerate(job_calls) if c[0] > 0.1]}


def main() -> None:
    bpy.ops.wm.read_factory_settings(use_empty=True)
    lean_image_ai.register()
    try:
        path = source_file(CONFIG["side"])
        remove(upscale(path))  # warm-up: the worker's start and the first imports are not the job's
        out = {}
        for phase in CONFIG["phases"]:
            out[phase] = globals()[f"phase_{phase}"](path)
            Path(CONFIG["out"]).write_text(json.dumps(out), encoding="utf-8")
    finally:
        jobs.manager.cancel_all()
        lean_image_ai.unregister()


main()
