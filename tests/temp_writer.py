"""A writer stopped half-way inside ``files.atomic_path``: what a live writer of an output holds,
and (killed) what a killed one leaves. Run as a script (argv: the target), it prints its
temporary file's path and waits to be killed; :func:`start` runs it in a process of its own."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def start(target: Path) -> tuple[subprocess.Popen, Path]:
    """The writer's process, once it holds its temporary file, and that file's path."""
    process = subprocess.Popen([sys.executable, __file__, str(target)], stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline().strip()
    if not line:
        process.kill()
        raise RuntimeError(f"the writer of {target} ended before it made its temporary file")
    return process, Path(line)


def kill(process: subprocess.Popen) -> None:
    process.kill()  # SIGKILL: its `finally` never runs, as when a run is killed mid-write
    process.wait()


if __name__ == "__main__":
    from lean_image_ai.models import files

    with files.atomic_path(sys.argv[1]) as tmp:
        tmp.write_bytes(b"half a frame")
        print(tmp, flush=True)
        time.sleep(300)
