"""The terminal command that installs the GPU engine (bpy-free): the add-on never runs pip itself
(extensions.blender.org, "Be Self Contained": software that cannot be bundled "can be run by the
user"), so the preferences show this command, for this machine, with a Copy button.

The command runs the add-on folder by path (``python FOLDER gpu install``: its ``__main__.py``
imports the folder as the package), so it needs no ``cd`` and no PYTHONPATH, in a POSIX shell or
Windows' Command Prompt alike. The Python is Blender's own: the engine's wheels are built for its
version, and it brings pip.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from ..paths import ADDON_ROOT


def _quoted(text: str, windows: bool) -> str:
    if windows:  # cmd.exe: double quotes; a path cannot hold one
        return f'"{text}"'
    return shlex.quote(text)


def gpu_command(action: str, python: str, target: str | os.PathLike, *, root: str | os.PathLike = ADDON_ROOT,
                windows: bool | None = None) -> str:
    """``"<python>" "<add-on folder>" gpu <action> --target "<folder>"``, quoted for this system's shell."""
    windows = os.name == "nt" if windows is None else windows
    words = [_quoted(str(python), windows), _quoted(str(Path(root)), windows), "gpu", action,
             "--target", _quoted(str(target), windows)]  # fmt: skip
    return " ".join(words)


def install_command(python: str, target: str | os.PathLike, **kwargs) -> str:
    return gpu_command("install", python, target, **kwargs)

