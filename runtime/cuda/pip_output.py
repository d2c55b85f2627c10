"""What pip prints while it installs the GPU libraries, read for the progress bar and, when it
fails, for one message saying why (bpy-free; runtime/cuda/gpu_libraries.py runs pip)."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import GpuRuntimeError

# Share of the progress bar for each phase. pip reports no byte progress that every pip version
# prints the same way, so downloads advance per wheel, weighted by the sizes the file records.
DOWNLOAD_SHARE = 0.9
INSTALL_SHARE = 0.08

COLLECTING = re.compile(r"^\s*(?:Collecting|Processing|Obtaining)\s+(\S+)")


def normalized(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def progress_from_line(line: str, requirements: list, state: dict) -> tuple[float, str] | None:
    """(fraction, stage) for one line of pip's output, or None when the line says nothing new;
    ``requirements`` are gpu_libraries' Requirements (name, size)."""
    sized = all(r.size for r in requirements)  # by bytes when every size is known, else per wheel
    weight = {normalized(r.name): r.size if sized else 1 for r in requirements}
    total = sum(weight.values())
    collecting = COLLECTING.match(line)
    if collecting:
        spec = collecting.group(1)
        name = normalized(re.split(r"[=<>~!\[ ]", Path(spec).name.split("-")[0] if spec.endswith(".whl") else spec)[0])
        if name in weight and name not in state["seen"]:
            # the previous wheel is complete once pip moves on to the next one
            state["done"] += state.pop("current_weight", 0)
            state["seen"].add(name)
            state["current_weight"] = weight[name]
            return DOWNLOAD_SHARE * state["done"] / total, f"downloading {name} ({len(state['seen'])}/{len(requirements)})"
        return None
    if line.startswith("Installing collected packages"):
        state["done"] += state.pop("current_weight", 0)
        return DOWNLOAD_SHARE, "installing"
    return None


def pip_failure(returncode: int, lines: list[str], python: str) -> GpuRuntimeError:
    """The error for a pip that exited ``returncode`` having printed ``lines``."""
    text = "\n".join(lines)
    tail = " | ".join(ln.strip() for ln in lines[-6:] if ln.strip())
    if "No module named pip" in text:
        return GpuRuntimeError(
            f"The Python at {python} has no pip, so the GPU libraries cannot be installed. Run "
            f"'{python} -m ensurepip' once, then install again."
        )
    if "DO NOT MATCH THE HASHES" in text:
        return GpuRuntimeError(
            "A downloaded GPU library does not match the checksum this add-on version expects, so "
            f"nothing was installed (pip: {tail}). Check pip's index settings, or update the add-on."
        )
    return GpuRuntimeError(
        f"pip could not install the GPU libraries (exit {returncode}); nothing was installed. "
        f"Check the network and pip's settings. pip said: {tail or 'nothing'}"
    )
