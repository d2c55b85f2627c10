"""One install of a loopback catalog entry in its own process (two of these share a models folder).

argv: url, models folder, size or "-", sha256 or "-", lock wait in seconds. Prints "waiting: ..."
when another process holds the install, then one JSON line: the outcome.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lean_image_ai.models.store import installer  # noqa: E402
from lean_image_ai.runtime.errors import ModelInstallError  # noqa: E402
from model_server import loopback_entry, loopback_http  # noqa: E402

url, folder, size, sha, wait = sys.argv[1:6]
entry = loopback_entry(
    url, None, size_bytes=None if size == "-" else int(size), sha256=None if sha == "-" else sha
)
try:
    with loopback_http():
        path = installer.install(
            entry,
            folder,
            chunk_size=16 * 1024,
            lock_wait=float(wait),
            waiting=lambda holder: print(f"waiting: {holder}", flush=True),
        )
    print(json.dumps({"ok": True, "path": str(path)}), flush=True)
except ModelInstallError as exc:
    print(json.dumps({"ok": False, "error": str(exc)}), flush=True)
    sys.exit(2)
