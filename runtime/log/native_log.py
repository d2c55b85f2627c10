"""onnxruntime's own C++ log, kept instead of printed (bpy-free).

ORT writes its log lines (``[E:onnxruntime:Default, provider_bridge_ort.cc...] Failed to load
library ...``) straight to the process's stderr, coloured, from C++: Python's logging never sees
them, and the Python API has no log callback. A CUDA session that cannot start prints several
such lines before the runtime's own one-line warning. So while a session is created, fd 2 goes to
a temporary file; ORT's lines are cleaned and returned (the runtime puts them in its event log,
``doctor`` shows them), anything else written there meanwhile is passed on to the real stderr.
Sessions get ``log_severity_level`` ERROR, so a run's warnings stay quiet too.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
import threading

SESSION_LOG_SEVERITY = 3  # ERROR: a run's warnings (e.g. Memcpy nodes added) are not the user's business
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ORT_LINE = re.compile(r"^\S+ \S+ \[([EWIVF]):onnxruntime:[^\]]*\]\s*")
_lock = threading.RLock()  # one redirection at a time (fd 2 is process-wide); nested ones chain


def clean(line: str) -> str:
    """An ORT log line without its colour codes, timestamp and ``[E:onnxruntime:...]`` prefix."""
    return ORT_LINE.sub("", ANSI.sub("", line)).strip()


def is_onnxruntime_line(line: str) -> bool:
    return ORT_LINE.match(ANSI.sub("", line)) is not None


@contextlib.contextmanager
def captured(*, python_stdout: bool = False):
    """Capture fd 2 during the block into the yielded list (ORT's lines, cleaned; with
    ``python_stdout``, Python's prints too, as they are). Lines that are not ORT's go on to
    stderr afterwards. Where fd 2 cannot be redirected (a GUI process without one), nothing is
    captured and nothing changes."""
    lines: list[str] = []
    with _lock:
        try:
            sys.stderr.flush()
        except Exception:
            pass
        try:
            saved = os.dup(2)
        except OSError:
            yield lines
            return
        stdout = io.StringIO()
        with tempfile.TemporaryFile(mode="w+b") as sink:
            os.dup2(sink.fileno(), 2)
            try:
                with contextlib.redirect_stdout(stdout) if python_stdout else contextlib.nullcontext():
                    yield lines
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                sink.seek(0)
                text = sink.read().decode(errors="replace")
                others = []
                pending_ort = False
                for raw in text.splitlines():
                    if is_onnxruntime_line(raw):
                        lines.append(clean(raw))
                        pending_ort = True
                    elif pending_ort and not ANSI.sub("", raw).strip():
                        continue  # the blank tail ORT prints after a coloured multi-line error
                    else:
                        pending_ort = False
                        others.append(raw)
                lines.extend(ln for ln in stdout.getvalue().splitlines() if ln.strip())
                if others:
                    with contextlib.suppress(Exception):
                        sys.stderr.write("\n".join(others) + "\n")


__all__ = ["SESSION_LOG_SEVERITY", "captured", "clean", "is_onnxruntime_line"]
