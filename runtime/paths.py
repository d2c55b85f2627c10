"""The add-on's per-user folders outside Blender's own (bpy-free): the data folder holds the models
Blender and the command line share (an extension's own folder goes when it is uninstalled or
updated); the cache folder holds logs and what can be made again."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def user_cache_root() -> Path:
    """Linux ``$XDG_CACHE_HOME`` or ``~/.cache``, macOS ``~/Library/Caches``, Windows
    ``%LOCALAPPDATA%``; then ``lean_image_ai``. Nothing is created."""
    home = Path.home()
    if sys.platform.startswith("win"):
        base = os.environ.get("LOCALAPPDATA")
        root = Path(base) if base else home / "AppData" / "Local"
    elif sys.platform == "darwin":
        root = home / "Library" / "Caches"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".cache"
    return root / "lean_image_ai"


def user_data_root() -> Path:
    """Where the user's own data lives, kept across add-on updates and uninstalls: Linux
    ``$XDG_DATA_HOME`` or ``~/.local/share``, macOS ``~/Library/Application Support``, Windows
    ``%LOCALAPPDATA%``; then ``lean_image_ai``. Nothing is created."""
    home = Path.home()
    if sys.platform.startswith("win"):
        base = os.environ.get("LOCALAPPDATA")
        root = Path(base) if base else home / "AppData" / "Local"
    elif sys.platform == "darwin":
        root = home / "Library" / "Application Support"
    else:
        xdg = os.environ.get("XDG_DATA_HOME")
        root = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".local" / "share"
    return root / "lean_image_ai"
