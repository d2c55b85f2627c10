"""Where the models folder is, and its own cache folder (bpy-free, imports only runtime/): the
library (models/store/library.py) and the tiler's caches (models/tiles/reach_cache.py) both ask
here, so a cache never lands beside a user's own model file.

Models folder, first that is set: the front-end's explicit choice (Blender's "Models Folder"
preference, the CLI's ``--models-dir``); ``$LEAN_IMAGE_AI_MODELS_DIR``; one per-user data folder
that Blender and the command line share (runtime/paths.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from ...runtime.errors import user_path
from ...runtime.paths import user_data_root

MODELS_DIR_ENV = "LEAN_IMAGE_AI_MODELS_DIR"
CACHE_FOLDER = ".cache"  # inside the models folder: what can be made again from its models

# Folders someone named (a preference, --models-dir, the environment): one that is missing is an
# error when a model is looked up there, not an empty folder to fall back from.
named: dict[str, str] = {}


def models_dir(choice: str | os.PathLike = "") -> Path:
    """The models folder (see module doc); nothing is created."""
    if choice:
        folder = user_path(choice)
        named[str(folder)] = "the chosen models folder"
        return folder
    if os.environ.get(MODELS_DIR_ENV):
        folder = user_path(os.environ[MODELS_DIR_ENV])
        named[str(folder)] = MODELS_DIR_ENV
        return folder
    return shared_models_dir()


def shared_models_dir() -> Path:
    """``<the per-user data folder>/models`` (runtime/paths.py): Blender's and the CLI's default."""
    return user_data_root() / "models"


def cache_dir() -> Path:
    """The models folder's own cache folder (nothing is created here)."""
    return models_dir() / CACHE_FOLDER
