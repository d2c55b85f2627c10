"""A partial download on disk: the ``.part`` file and the record of the server's validator beside
it (bpy-free). Apart from models/store/transfer/download.py (the transfer, with its watch thread) because
Blender's process removes models, and with them their partial downloads, but never downloads."""

from __future__ import annotations

from pathlib import Path

from ... import files


def record_path(part: Path) -> Path:
    """Where the validator of the server's file, seen when ``part`` was started, is kept."""
    return part.with_name(part.name + ".json")


def discard_part(part: Path) -> bool:
    """Delete a partial download and its validator record; True if the .part was there."""
    files.remove_if_present(record_path(part))
    return files.remove_if_present(part)
