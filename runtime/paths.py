"""The add-on's per-user folder outside Blender (bpy-free): models, logs and caches go under it
unless a front-end names its own (Blender: the extension's user folder)."""

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
