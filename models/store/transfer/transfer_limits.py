"""How large a model download may grow and which hosts are loopback (bpy-free, stdlib only).

Apart from models/store/transfer/http_watch.py (the watch thread that enforces them) so that Blender's
process, which reads the catalog and checks installed files but downloads only in a process of
its own, never loads a module that makes threads.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})

# The largest single .onnx file onnxruntime can load: the protobuf it is parsed from is limited
# to 2 GiB (bigger models keep their weights in external data files, which a one-file catalog
# download cannot be). Nothing past this can be the model, whatever the catalog says.
HARD_MAX_BYTES = 2 << 30
# Without a catalog size or checksum, a download may be at most this many times the entry's
# approximate size, and one under 1/SIZE_FACTOR of it is taken for a transfer that was cut off.
# The approximate size is a rounded display hint ("~0.7 GB"), and a re-export at the same address
# can move it by tens of per cent; 2x still stops a server that streams forever after wasting at
# most one more model's worth of disk and time.
SIZE_FACTOR = 2


def is_loopback_http(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS


def size_ceiling(approx_size_bytes: int | None) -> int:
    """The most bytes a download whose real size the catalog does not know may bring."""
    if approx_size_bytes is None:
        return HARD_MAX_BYTES
    return min(HARD_MAX_BYTES, SIZE_FACTOR * approx_size_bytes)


def size_floor(approx_size_bytes: int | None) -> int:
    """Fewer bytes than this, for an entry of that approximate size, is a cut-off transfer."""
    return 0 if approx_size_bytes is None else approx_size_bytes // SIZE_FACTOR


@dataclass(frozen=True)
class TransferLimits:
    """When a transfer is given up: fewer than ``stall_bytes`` in ``stall_seconds`` (a server
    that stopped, or drips), or the whole download taking longer than ``deadline_seconds``
    (a 2 GiB model at 100 KB/s takes about six hours). ``poll_seconds``: how often the watch
    looks, which bounds how long a Cancel takes."""

    stall_seconds: float = 60.0
    stall_bytes: int = 64 * 1024
    deadline_seconds: float = 6 * 3600.0
    poll_seconds: float = 0.1
