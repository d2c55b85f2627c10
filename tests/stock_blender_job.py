"""Runs inside a *stock* bpy 5.0.1 (its own venv: no onnxruntime, Pillow, psutil): install the built
zip, run the upscale operator headless, uninstall. Prints one ``RESULT {json}`` line.

    python stock_blender_job.py <zip> <work folder>

Used by tests/test_stock_blender.py; the temporary HOME and Blender user folders come from its
environment, so nothing touches the real user's Blender.
"""

import importlib.util
import json
import os
import sys
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


def main(zip_path: str, work: Path) -> dict:
    out: dict = {"python": list(sys.version_info[:2]), "bpy": bpy.app.version_string}
    # What a stock Blender lacks, before the add-on brings anything.
    out["missing_before"] = {
        name: not importable(name)
        for name in ("onnxruntime", "PIL", "psutil", "flatbuffers", "google.protobuf", "packaging", "pynvml")
    }
    out["extensions_dir"] = bpy.utils.user_resource("EXTENSIONS")

    # A smooth test picture, written by Blender itself (no Pillow here).
    width, height = 48, 32
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    rgba = np.stack([xx / width, yy / height, 0.5 + 0.25 * np.sin(xx / 5), np.ones_like(xx)], -1)
    source = bpy.data.images.new("stock_src", width, height, alpha=True)
    source.pixels.foreach_set(rgba.ravel())
    source.filepath_raw = str(work / "source.png")
    source.file_format = "PNG"
    source.save()
    bpy.data.images.remove(source)

    result = bpy.ops.extensions.package_install_files(
        filepath=zip_path, repo="user_default", enable_on_install=True
    )
    out["install"] = sorted(result)
    out["enabled"] = MODULE in bpy.context.preferences.addons.keys()

    output = work / "upscaled.png"
    out["upscale"] = sorted(bpy.ops.lean_image_ai.upscale(filepath=str(work / "source.png"), output_path=str(output)))

    ort = sys.modules.get("onnxruntime")
    out["onnxruntime_file"] = getattr(ort, "__file__", None)
    out["onnxruntime_version"] = getattr(ort, "__version__", None)
    out["addon_file"] = sys.modules[MODULE].__file__
    out["imported"] = {name: name in sys.modules for name in ("PIL", "psutil", "flatbuffers", "google.protobuf")}
    memory = importlib.import_module(MODULE + ".runtime.memory")
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
    return out


if __name__ == "__main__":
    try:
        report = main(sys.argv[1], Path(sys.argv[2]))
    except BaseException:
        report = {"error": traceback.format_exc()}
    print("RESULT " + json.dumps(report), flush=True)
