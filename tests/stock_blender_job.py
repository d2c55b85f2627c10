"""Runs inside a *stock* bpy (its own venv: no onnxruntime, Pillow, psutil, onnx): install the built
zip, register a model, run all four operators and a sequence headless, draw the panels and the
preferences, uninstall. Prints one ``RESULT {json}`` line.

    python stock_blender_job.py <zip> <work folder> <models.json> <tests folder> <checks.json>

``models.json`` names the small stand-in ONNX files the test built (a stock Blender has no onnx
package to build them); the tests folder gives ``recording_layout`` (a stand-in UILayout, since
bpy as a module never makes a real one) and the issue 32 checks the dev tests run too:
``results_job.make`` (results saved, undone and redone: the project named in ``checks.json``;
the test reopens it in a new process), ``shot_checks.shot_facts`` (a shot with a damaged frame)
and ``panel_listing`` (the N-panel per mode). Used by tests/test_stock_blender.py; the temporary
HOME and Blender user folders come from its environment, so nothing touches the real user's
Blender.
"""

import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path

import bpy
import numpy as np


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent package (google for google.protobuf) is missing
        return False


PKG = "lean_image_ai"
MODULE = f"bl_ext.user_default.{PKG}"


def write_picture(path: Path, width: int, height: int, shift: float = 0.0) -> np.ndarray:
    """A smooth test picture, written by Blender itself (no Pillow here)."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    rgba = np.stack([xx / width, yy / height, 0.5 + 0.25 * np.sin(xx / 5 + shift), np.ones_like(xx)], -1)
    image = bpy.data.images.new(path.stem, width, height, alpha=True)
    image.pixels.foreach_set(rgba.ravel())
    image.filepath_raw = str(path)
    image.file_format = "PNG"
    image.save()
    bpy.data.images.remove(image)
    return rgba


def call(out: dict, name: str, operator, **kwargs) -> None:
    """Run an operator; its result set, or the one-line error it reported."""
    try:
        out[name] = sorted(operator(**kwargs))
    except RuntimeError as exc:
        out[name] = [f"error: {str(exc).strip().splitlines()[-1]}"]


def panel_modes(out: dict, models: dict) -> None:
    """The 3D Viewport's N-panel in single-image and Sequence mode, a model installed for every
    task (registered: the stand-ins), drawn and read as tests/test_panel_modes.py reads it."""
    import panel_listing as pl
    from recording_layout import FakePanel

    ops = bpy.ops.lean_image_ai
    out["register_tasks"] = {}
    for family in ("ben2", "da3", "moge2"):
        call(out["register_tasks"], family, ops.register_user_model, family=family, filepath=models[family])
    panels = importlib.import_module(MODULE + ".ui.panels")
    pl.put_on_active_object(bpy, bpy.data.images.new("panel_photo.png", 8, 8))
    settings = bpy.context.scene.lean_image_ai
    modes, listings = {}, out.setdefault("listings", {})
    for mode, sequence in (("single image", False), ("Sequence", True)):
        settings.use_sequence = sequence
        settings.sequence_source = "//plates/shot_####.png" if sequence else ""
        fake = FakePanel()
        panels.LEAN_IMAGE_AI_PT_view3d.draw(fake, bpy.context)
        modes[mode] = pl.mode_facts(fake.layout, MODULE)
        listings[f"3D Viewport, {mode}"] = pl.listing(fake.layout, MODULE)
    settings.use_sequence = False
    out["panel_modes"] = modes


def draw_ui(out: dict, tests: Path) -> None:
    """Draw the N-panels and the preferences (model list included) into recording layouts."""
    from panel_listing import listing
    from recording_layout import FakePanel, RecordingLayout

    panels = importlib.import_module(MODULE + ".ui.panels")
    drawn, listings = {}, out.setdefault("listings", {})
    for cls in panels.classes:
        fake = FakePanel()
        cls.draw(fake, bpy.context)
        drawn[cls.__name__] = len(fake.layout.log)
        if cls.__name__ == "LEAN_IMAGE_AI_PT_image_editor":
            listings["Image Editor (no image shown: background Blender has no editor)"] = listing(fake.layout, MODULE)
    prefs = bpy.context.preferences.addons[MODULE].preferences

    class Proxy:  # ``self`` for the preferences' draw: their properties, a recording layout
        def __init__(self):
            self.layout = RecordingLayout()

        def __getattr__(self, name):
            return getattr(prefs, name)

    proxy = Proxy()
    type(prefs).draw(proxy, bpy.context)
    drawn["preferences"] = len(proxy.layout.log)
    out["drawn"] = drawn
    out["preferences_text"] = [str(getattr(c, "text", "")) for c in proxy.layout.log if getattr(c, "text", "")]
    listings["Preferences"] = listing(proxy.layout, MODULE)


def run_doctor(out: dict) -> None:
    """The preferences' Run Doctor, its timer driven by hand (bpy as a module has no event loop)."""
    gpu_ops = importlib.import_module(MODULE + ".operators.gpu_ops")
    call(out, "doctor", bpy.ops.lean_image_ai.run_doctor)
    deadline = time.monotonic() + 240
    while gpu_ops.poll_doctor() is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    run = gpu_ops.doctor["run"]
    out["doctor_report"] = run.text if run is not None else None


def read_pixels(path: Path) -> np.ndarray:
    image = bpy.data.images.load(str(path))
    pixels = np.empty(len(image.pixels), np.float32)
    image.pixels.foreach_get(pixels)
    size = tuple(image.size)
    bpy.data.images.remove(image)
    return pixels.reshape(size[1], size[0], 4)


def engine_path(out: dict, engine_python: str, source: str, model: str, work: Path) -> Path:
    """The engine path (issue 40): the Worker Python preference names a second Python (3.13,
    numpy 2, its own onnxruntime); the worker restarts under it and the Upscale gives the pixels of
    Blender's own Python. The preference is cleared after, so the rest runs out of the zip."""
    client = importlib.import_module(MODULE + ".models.worker.client")
    prefs = bpy.context.preferences.addons[MODULE].preferences
    prefs.worker_python = engine_python
    client.stop_shared()  # the preference applies to the worker's next start
    output = work / "upscaled_engine.png"
    try:
        call(out, "engine_upscale", bpy.ops.lean_image_ai.upscale, filepath=source, output_path=str(output), model_path=model)
        status = client.shared().status
        out["engine_worker"] = {key: status.get(key) for key in ("python", "numpy", "onnxruntime_file")}
    finally:
        prefs.worker_python = ""
        client.stop_shared()
    return output


def issue32_checks(out: dict, checks: dict, models: dict) -> None:
    """Results saved, undone and redone (the test reopens the .blend), the shot operators' all or
    nothing, the panel per mode: the dev tests' checks, run here in the installed extension."""
    import results_job
    import shot_checks

    started = time.perf_counter()
    results_job.make(json.loads(Path(checks["results_config"]).read_text()), Path(checks["results_config"]).parent, MODULE)
    out["seconds"]["results"] = time.perf_counter() - started
    started = time.perf_counter()
    out["shot"] = shot_checks.shot_facts(bpy, Path(checks["shot"]), models["moge2"], models["bicubic"], Path(checks["shot_out"]))
    out["seconds"]["shot"] = time.perf_counter() - started
    started = time.perf_counter()
    panel_modes(out, models)
    out["seconds"]["panels"] = time.perf_counter() - started


def main(zip_path: str, work: Path, models: dict, tests: Path, checks: dict) -> dict:
    sys.path.insert(0, str(tests))
    out: dict = {"python": list(sys.version_info[:2]), "bpy": bpy.app.version_string, "seconds": {}}
    # What a stock Blender lacks, before the add-on brings anything.
    out["missing_before"] = {
        name: not importable(name)
        for name in ("onnxruntime", "PIL", "psutil", "flatbuffers", "google.protobuf", "packaging", "pynvml")
    }
    out["extensions_dir"] = bpy.utils.user_resource("EXTENSIONS")
    width, height = 48, 32
    rgba = write_picture(work / "source.png", width, height)
    seq = work / "seq"
    seq.mkdir()
    for frame in (1, 2, 3):
        write_picture(seq / f"frame_{frame:04d}.png", 24, 16, shift=frame)

    result = bpy.ops.extensions.package_install_files(filepath=zip_path, repo="user_default", enable_on_install=True)
    out["install"] = sorted(result)
    out["enabled"] = MODULE in bpy.context.preferences.addons.keys()
    prefs_module = importlib.import_module(MODULE + ".operators.prefs")
    folder = prefs_module.models_folder(bpy.context, create=True)
    out["models_folder"] = str(folder)
    models = {**models, "bicubic": str(Path(sys.modules[MODULE].__file__).parent / "models" / "assets" / "bicubic_x2.onnx")}

    ops = bpy.ops.lean_image_ai
    call(out, "register", ops.register_user_model, family="upscale", filepath=models["upscale"])
    call(out, "register_wrong_family", ops.register_user_model, family="upscale", filepath=models["ben2"])
    store = folder / "user_models.json"
    out["registered"] = [e["path"] for e in json.loads(store.read_text())["user_models"]] if store.is_file() else []
    issue32_checks(out, checks, models)

    output = work / "upscaled.png"
    source = str(work / "source.png")
    engine_output = engine_path(out, checks["engine_python"], source, models["bicubic"], work)
    call(out, "upscale", ops.upscale, filepath=source, output_path=str(output), model_path=models["bicubic"])
    if engine_output.is_file() and output.is_file():
        out["engine_max_abs_diff"] = float(np.abs(read_pixels(engine_output) - read_pixels(output)).max())
    call(out, "remove_background", ops.remove_background, filepath=source, model_path=models["ben2"])
    call(out, "estimate_depth", ops.estimate_depth, filepath=source, model_path=models["da3"])
    before_objects = len(bpy.data.objects)
    call(out, "reconstruct_geometry", ops.reconstruct_geometry, filepath=source, model_path=models["moge2"])
    out["objects_added"] = len(bpy.data.objects) - before_objects
    out["images"] = sorted(i.name for i in bpy.data.images)
    call(
        out, "sequence", ops.process_sequence, family="upscale", source=str(seq / "frame_####.png"),
        output=str(work / "seq_out" / "up_####.png"), model_path=models["bicubic"],
    )  # fmt: skip
    out["sequence_files"] = sorted(p.name for p in (work / "seq_out").glob("*")) if (work / "seq_out").is_dir() else []
    draw_ui(out, tests)
    run_doctor(out)

    # the models ran in the worker process: onnxruntime is imported there, never in Blender's
    out["onnxruntime_in_blender"] = "onnxruntime" in sys.modules
    worker = importlib.import_module(MODULE + ".models.worker.client").shared()
    out["onnxruntime_file"] = worker.status.get("onnxruntime_file")
    out["onnxruntime_version"] = worker.status.get("onnxruntime_version")
    out["addon_file"] = sys.modules[MODULE].__file__
    out["imported"] = {name: name in sys.modules for name in ("PIL", "psutil", "flatbuffers", "google.protobuf")}
    memory = importlib.import_module(MODULE + ".runtime.measure.memory")
    out["rss_bytes"] = memory.process_rss_bytes()

    image = bpy.data.images.load(str(output))
    out["output_size"] = list(image.size)
    pixels = np.empty(len(image.pixels), np.float32)
    image.pixels.foreach_get(pixels)
    up = pixels.reshape(image.size[1], image.size[0], 4)
    # 2x2 means of a bicubic x2 come back close to the source (rows: both bottom-up in Blender).
    pooled = up.reshape(height, 2, width, 2, 4).mean(axis=(1, 3))
    out["pixels_finite"] = bool(np.isfinite(up).all())
    out["pixels_range"] = [float(up.min()), float(up.max())]
    out["pooled_max_abs_diff"] = float(np.abs(pooled[..., :3] - rgba[..., :3]).max())
    bpy.data.images.remove(image)

    ext_root = Path(out["extensions_dir"])
    site = [str(p) for p in ext_root.glob(".local/lib/python*/site-packages")]
    out["site_packages"] = site
    out["site_entries_installed"] = sorted(os.listdir(site[0])) if site else []

    repos = bpy.context.preferences.extensions.repos
    repo_index = next(i for i, repo in enumerate(repos) if repo.module == "user_default")
    out["uninstall"] = sorted(bpy.ops.extensions.package_uninstall(repo_index=repo_index, pkg_id=PKG))
    out["enabled_after"] = MODULE in bpy.context.preferences.addons.keys()
    out["addon_dir_exists_after"] = (ext_root / "user_default" / PKG).exists()
    out["site_entries_after"] = sorted(os.listdir(site[0])) if site and os.path.isdir(site[0]) else []
    out["left_under_extensions"] = sorted(
        str(p.relative_to(ext_root)) for p in ext_root.rglob("*") if PKG in p.name or "onnxruntime" in p.name
    )
    out["models_kept_after"] = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    return out


if __name__ == "__main__":
    try:
        report = main(
            sys.argv[1], Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()), Path(sys.argv[4]),
            json.loads(Path(sys.argv[5]).read_text()),
        )  # fmt: skip
    except BaseException:
        report = {"error": traceback.format_exc()}
    print("RESULT " + json.dumps(report), flush=True)
