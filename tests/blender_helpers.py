"""Shared helpers for tests that use real Blender (bpy 5.0.1 as a module).

Import from a test file with::

    sys.path.insert(0, str(Path(__file__).parent))   # pytest runs with --import-mode=importlib
    import blender_helpers as bh

Nothing here imports bpy at module level, so bpy-free tests may import it too.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "lean_image_ai"


def bpy_scripts_dir() -> Path:
    """``.../bpy/<version>/scripts`` of the bpy module this Python has (without importing bpy)."""
    spec = importlib.util.find_spec("bpy")
    if spec is not None and spec.origin:
        base = Path(spec.origin).parent
        found = sorted(p for p in base.glob("*/scripts") if p.is_dir())
        if found:
            return found[-1]
    raise RuntimeError("bpy (Blender as a Python module) is not installed in this Python")


# Blender's own extension CLI and its list of valid tags (what `blender --command extension` uses).
def extension_cli() -> Path:
    return bpy_scripts_dir() / "addons_core" / "bl_pkg" / "cli" / "blender_ext.py"


def valid_tags_file() -> Path:
    return bpy_scripts_dir() / "modules" / "_bpy_internal" / "extensions" / "tags.py"


def run_extension_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run Blender's extension CLI (``validate``/``build`` ...) in a fresh Python."""
    return subprocess.run(
        [sys.executable, str(extension_cli()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def import_package():
    """``import lean_image_ai`` from this checkout (the repository root *is* the package).

    If nothing on sys.path provides it, the checkout is loaded under that name by file location,
    so its relative imports work without installing it.
    """
    module = sys.modules.get(PACKAGE)
    if module is not None:
        return module
    try:
        return importlib.import_module(PACKAGE)
    except ModuleNotFoundError as ex:
        if ex.name != PACKAGE:
            raise
    spec = importlib.util.spec_from_file_location(
        PACKAGE, REPO_ROOT / "__init__.py", submodule_search_locations=[str(REPO_ROOT)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(PACKAGE, None)
        raise
    return module


def import_submodule(name: str):
    """``import lean_image_ai.<name>`` (e.g. ``"operators.image_io"``)."""
    import_package()
    return importlib.import_module(f"{PACKAGE}.{name}")


def package_search_dir(tmp_dir: Path) -> Path:
    """A folder holding a ``lean_image_ai`` link to the checkout: put it on PYTHONPATH of a subprocess."""
    tmp_dir = Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    link = tmp_dir / PACKAGE
    if not link.exists():
        link.symlink_to(REPO_ROOT, target_is_directory=True)
    return tmp_dir


def isolated_blender_env(root: Path, *, pythonpath: list[Path] | None = None) -> dict[str, str]:
    """Environment for a fresh Blender/bpy process whose user files all live under ``root``."""
    root = Path(root)
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_DATA_HOME=str(home / ".local" / "share"),  # the shared models folder
        BLENDER_USER_RESOURCES=str(root / "blender_user"),
        BLENDER_USER_CONFIG=str(root / "blender_user" / "config"),
        BLENDER_USER_SCRIPTS=str(root / "blender_user" / "scripts"),
        BLENDER_USER_DATAFILES=str(root / "blender_user" / "datafiles"),
        BLENDER_USER_EXTENSIONS=str(root / "blender_user" / "extensions"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.pop("PYTHONPATH", None)
    env.pop("LEAN_IMAGE_AI_MODELS_DIR", None)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return env


def run_python(
    code: str, *, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this venv (bpy is importable there)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(cwd) if cwd else None,
        timeout=timeout,
    )


def reset_blender(*, use_empty: bool = True) -> None:
    """Back to factory settings with an empty scene (fast: ~50 ms). Manually registered
    classes stay registered; every image, object and scene datablock is gone."""
    import bpy

    bpy.ops.wm.read_factory_settings(use_empty=use_empty)


def fresh_blender(tmp_path: Path, monkeypatch, *, make_models_dir: bool = True):
    """The body of an operator test module's autouse fixture (``yield from``): an empty models
    folder of the test's own (no catalog model counts as installed unless the test says so; named
    only, not made, for tests that list ``tmp_path``), a factory-reset Blender before and after,
    and no job left running. Yields the models folder."""
    from lean_image_ai.models.store import library
    from lean_image_ai.operators import jobs

    models_dir = tmp_path / "models"
    if make_models_dir:
        models_dir.mkdir(exist_ok=True)  # a named models folder that is missing is an error (for a catalog model)
    monkeypatch.setenv(library.MODELS_DIR_ENV, str(models_dir))
    reset_blender()
    yield models_dir
    assert jobs.manager.current is None, "a job was left running"
    reset_blender()


def remove_all_images() -> None:
    import bpy

    for image in list(bpy.data.images):
        bpy.data.images.remove(image)


def make_image(
    name: str,
    width: int,
    height: int,
    *,
    float_buffer: bool = False,
    pixels=None,
    alpha: bool = True,
    colorspace: str | None = None,
):
    """A generated image; ``pixels`` is an ``(H, W, 4)`` array, *top row first*, or None
    (then a gradient with distinct values per pixel/channel is written). Returns the image."""
    import bpy
    import numpy as np

    image = bpy.data.images.new(name, width, height, alpha=alpha, float_buffer=float_buffer)
    if colorspace is not None:
        image.colorspace_settings.name = colorspace  # before pixels: this regenerates the buffer
    if pixels is None:
        pixels = gradient(width, height)
    flat = np.ascontiguousarray(np.asarray(pixels, dtype=np.float32)[::-1]).reshape(-1)
    image.pixels.foreach_set(flat)
    return image


def gradient(width: int, height: int, *, seed: int = 0):
    """Deterministic ``(H, W, 4)`` float32 test pattern in [0, 1], top row first."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.random((height, width, 4), dtype=np.float32)


def read_pixels_bottom_up(image):
    """Blender's own layout: ``(H, W, C)`` float32 with row 0 at the *bottom*."""
    import numpy as np

    width, height = image.size
    flat = np.empty(len(image.pixels), dtype=np.float32)
    image.pixels.foreach_get(flat)
    return flat.reshape(height, width, -1)


@contextlib.contextmanager
def registered_addon():
    """``lean_image_ai.register()`` for the duration of the block (always unregistered after)."""
    package = import_package()
    package.register()
    try:
        yield package
    finally:
        package.unregister()


@contextlib.contextmanager
def registered_classes(classes):
    """Register whichever of `classes` are not registered yet; unregister those after."""
    import bpy

    mine = [cls for cls in classes if not cls.is_registered]
    for cls in mine:
        bpy.utils.register_class(cls)
    try:
        yield
    finally:
        for cls in reversed(mine):
            bpy.utils.unregister_class(cls)
