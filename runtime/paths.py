"""The add-on's per-user folders outside Blender's own (bpy-free): the data folder holds the models
Blender and the command line share (an extension's own folder goes when it is uninstalled or
updated); the cache folder holds logs and what can be made again. Nothing is created here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# the add-on's own folder (the package root: blender_manifest.toml, gpu_requirements/), wherever
# Blender installed it
ADDON_ROOT = Path(__file__).resolve().parents[1]


def _per_user(mac: tuple[str, ...], xdg_variable: str, xdg_default: tuple[str, ...]) -> Path:
    """Windows ``%LOCALAPPDATA%``, macOS ``~/Library/<mac>``, elsewhere ``$<xdg_variable>`` or
    ``~/<xdg_default>``; then ``lean_image_ai``."""
    home = Path.home()
    if sys.platform.startswith("win"):
        base = os.environ.get("LOCALAPPDATA")
        root = Path(base) if base else home / "AppData" / "Local"
    elif sys.platform == "darwin":
        root = home.joinpath("Library", *mac)
    else:
        xdg = os.environ.get(xdg_variable)
        root = Path(xdg) if xdg and os.path.isabs(xdg) else home.joinpath(*xdg_default)
    return root / "lean_image_ai"


def user_cache_root() -> Path:
    """Linux ``$XDG_CACHE_HOME`` or ``~/.cache``, macOS ``~/Library/Caches``, Windows ``%LOCALAPPDATA%``."""
    return _per_user(("Caches",), "XDG_CACHE_HOME", (".cache",))


def user_data_root() -> Path:
    """Where the user's own data lives, kept across add-on updates and uninstalls: Linux
    ``$XDG_DATA_HOME`` or ``~/.local/share``, macOS ``~/Library/Application Support``, Windows
    ``%LOCALAPPDATA%``."""
    return _per_user(("Application Support",), "XDG_DATA_HOME", (".local", "share"))
