"""Loading NVIDIA's CUDA/cuDNN wheels before the first CUDA session, and saying which library
failed when that session then did not get CUDA (bpy-free).

``onnxruntime.preload_dlls()`` does not raise for a library it cannot load: it prints
``Failed to load <path or name>: <reason>`` (and a pointer to the install guide) and returns, so
an ``except`` around it never fires. What proves the libraries loaded is what a CUDA session
really gets: ``CUDAExecutionProvider`` in ``session.get_providers()``. This module keeps what
preload_dlls printed, and the runtime reports it once a CUDA session has landed elsewhere.
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass, field

from ..errors import first_line

# preload_dlls' own line for a required library it could not load (onnxruntime/__init__.py, 1.31:
# f"Failed to load {dll_path}: {e}"); the path may hold a drive colon and spaces on Windows
_FAILED_LINE = re.compile(r"^Failed to load (.+?\.(?:dll|so(?:\.\d+)*)):\s*(.*)$", re.IGNORECASE)


@dataclass
class Preload:
    failed: dict[str, str] = field(default_factory=dict)  # library file name -> loader's reason
    messages: list[str] = field(default_factory=list)  # everything preload_dlls printed
    error: str | None = None  # preload_dlls raised (a bad folder) or is missing

    def describe(self) -> str:
        if self.error:
            return self.error
        return "; ".join(f"{name}: {_reason(name, why)}" for name, why in self.failed.items())


def _reason(name: str, why: str) -> str:
    """The loader's reason without the library's name again (glibc starts its reason with the
    name, Windows says "Could not find module 'name'"): each library is named once."""
    if why.startswith(f"{name}:"):
        why = why[len(name) + 1 :].strip()
    return why.replace(f"Could not find module '{name}'", "not found")


def preload(ort) -> Preload:
    """Call ``ort.preload_dlls()`` with its prints captured and parsed."""
    result = Preload()
    printed = io.StringIO()
    function = getattr(ort, "preload_dlls", None)
    if function is None:
        result.error = f"onnxruntime {getattr(ort, '__version__', '?')} cannot preload the CUDA libraries (this release has no preload step)"
        return result
    try:
        with contextlib.redirect_stdout(printed):
            function()
    except Exception as exc:
        result.error = f"onnxruntime could not preload the CUDA libraries: {first_line(exc)}"
    result.messages, result.failed = parse(printed.getvalue())
    return result


def parse(printed: str) -> tuple[list[str], dict[str, str]]:
    """(lines, {library file name: reason}) from what preload_dlls() printed."""
    lines, failed = [], {}
    for line in printed.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()
        if not line:
            continue
        lines.append(line)
        match = _FAILED_LINE.match(line)
        if match:
            name = match.group(1).replace("\\", "/").rsplit("/", 1)[-1]
            failed.setdefault(name, match.group(2).strip())
    return lines, failed


def failure(preload_result: Preload | None, providers: list[str]) -> dict | None:
    """The ``cuda_preload_failed`` payload when a CUDA session did not get CUDA and preload_dlls
    had reported a failure; None when CUDA works, or when nothing it loads was to blame."""
    if preload_result is None or providers[:1] == ["CUDAExecutionProvider"]:
        return None
    if not preload_result.failed and not preload_result.error:
        return None
    return {
        "libraries": dict(preload_result.failed),
        "error": preload_result.error,
        "providers": list(providers),
        "messages": list(preload_result.messages),
    }
