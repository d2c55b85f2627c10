"""What tells that a file is still the one a record was made of, without reading it (bpy-free).

The installer's ``.verified.json`` sidecar vouches for a hashed model file; re-hashing 1 GB on
every run is what it saves. Size and mtime alone cannot tell a file rewritten in place whose size
stayed and whose mtime was set back (``os.utime``, ``touch -r``): its ctime still moved (the OS
sets it on every write and no user call sets it back), and a file replaced by another (a copy
over it, a rename onto it) has a new inode. Any of them changed, and the file is hashed again.
"""

from __future__ import annotations

import os


def file_key(st: os.stat_result) -> dict:
    """The fields a record keeps of ``st`` (JSON-ready)."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino, "device": st.st_dev}


def unchanged(recorded: dict, st: os.stat_result) -> bool:
    """``recorded`` (holding :func:`file_key`'s fields) was made of this very file, unchanged. A
    record made before the ctime and inode were kept lacks them: one re-hash renews it."""
    return all(recorded.get(name) == value for name, value in file_key(st).items())
