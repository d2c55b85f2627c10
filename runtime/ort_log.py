"""onnxruntime's own log lines during one call (bpy-free).

ORT writes its C++ log (why CUDA fell back, how CoreML partitioned a graph) to file descriptor 2,
not through Python, so the only way to read it is to point fd 2 at a file for the duration of the
call. Lines are echoed back afterwards (all, or those ``echo`` keeps), so the console still shows
what it would have shown.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Callable


@contextlib.contextmanager
def captured_output(echo: Callable[[str], bool] = lambda line: True):
    """Capture fd 2 (ORT's C++ log) and Python's stdout (preload_dlls' prints) into a list."""
    lines: list[str] = []
    stdout = io.StringIO()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            with contextlib.redirect_stdout(stdout):
                yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured = sink.read().decode(errors="replace") + stdout.getvalue()
            lines.extend(ln for ln in captured.splitlines() if ln.strip())
            shown = "".join(ln + "\n" for ln in captured.splitlines() if echo(ln))
            with contextlib.suppress(Exception):  # still visible in the console, as without the capture
                sys.stderr.write(shown)


def is_warning_or_error(line: str) -> bool:
    """An ORT log line at WARNING or ERROR (``[W:onnxruntime:...]``, ``[E:...]``), or not ORT's."""
    return "onnxruntime:" not in line or "[W:onnxruntime" in line or "[E:onnxruntime" in line
