"""NVIDIA's CUDA 13 and cuDNN 9 libraries for onnxruntime-gpu, in a folder the add-on owns (bpy-free).

onnxruntime-gpu's CUDA provider needs cudart, cuBLAS, cuFFT, cuRAND and cuDNN, which a Blender
user rarely has. NVIDIA publishes them as wheels (the `cuda` and `cudnn` extras of onnxruntime-gpu
name them). The zips carry the CPU onnxruntime, so onnxruntime-gpu comes with those libraries: the
add-on ships, per platform and Python, a requirements file pinning onnxruntime-gpu and each
library wheel by version, sha256 and size (`gpu_requirements/<platform>-cp<XY>.txt`, written by
tools/build_extension.py), and installs them with pip into its own folder (the GPU runtime; pip and its output reader
are runtime/cuda/gpu_install.py's, loaded only where an install runs):

    size = download_size(requirements)                          # bytes, before starting
    gpu_install.install(folder, requirements, progress=cb, cancel=flag)  # pip --target, all or nothing
    activation = activate(folder)                               # preload_dlls() from that folder
    installed_version(folder); remove(folder)

pip runs as a subprocess of the given Python (Blender's own, inside Blender) with its ordinary
configuration: the index, proxies and certificates the user set up for pip, and the standard
PIP_* environment variables. Nothing here names an index host.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import GpuRuntimeError, user_path
from .gpu_install_lock import one_install_at_a_time
from .pip_output import normalized

REQUIREMENTS_DIR = "gpu_requirements"
FOLDER_ENV = "LEAN_IMAGE_AI_GPU_RUNTIME_DIR"  # headless/farm: a folder of libraries set up once
MARKER = "lean_image_ai_gpu_runtime.json"  # written last, inside staging: its presence means complete
# Written first into a staging folder the add-on made: only a leftover carrying it is deleted.
STAGING_MARKER = "lean_image_ai_gpu_staging"
_STAGING_SUFFIX = ".staging"
_OLD_SUFFIX = ".old"

_LINE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s+--hash=sha256:([0-9a-fA-F]{64})\s*(?:#(.*))?$")
_SIZE = re.compile(r"\bsize:\s*(\d+)")


@dataclass(frozen=True)
class Requirement:
    name: str
    version: str
    sha256: str
    size: int | None  # bytes of the wheel, from the file's "# size: N" comment


# --- requirement files ----------------------------------------------------------------------------


def platform_name(system: str | None = None, machine: str | None = None) -> str | None:
    """The Blender platform whose GPU libraries this machine takes ("linux-x64", "windows-x64"), or None."""
    system = system or platform.system()
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64"):
        return None  # NVIDIA's CUDA 13 wheels for onnxruntime-gpu: x86-64 Linux and Windows only
    return {"Linux": "linux-x64", "Windows": "windows-x64"}.get(system)


def requirements_path(root: str | os.PathLike, plat: str | None = None, python: str | None = None) -> Path | None:
    """`<root>/gpu_requirements/<platform>-cp<XY>.txt` for this machine and Python, when it exists."""
    plat = plat or platform_name()
    if plat is None:
        return None
    python = python or f"{sys.version_info.major}{sys.version_info.minor}"
    path = Path(root) / REQUIREMENTS_DIR / f"{plat}-cp{python.replace('.', '')}.txt"
    return path if path.is_file() else None


def folder(host_default: str | os.PathLike) -> Path:
    """The install folder: LEAN_IMAGE_AI_GPU_RUNTIME_DIR when set, else the host's default."""
    override = os.environ.get(FOLDER_ENV, "").strip()
    return user_path(override) if override else Path(host_default)


def parse_requirements(path: str | os.PathLike) -> list[Requirement]:
    found = []
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            raise GpuRuntimeError(f"{path}, line {number}: expected 'name==version --hash=sha256:...', got {line!r}.")
        name, version, digest, comment = match.groups()
        size = _SIZE.search(comment or "")
        found.append(Requirement(name, version, digest.lower(), int(size.group(1)) if size else None))
    if not found:
        raise GpuRuntimeError(f"{path} lists no libraries.")
    return found


def download_size(requirements: str | os.PathLike | Iterable[Requirement]) -> int | None:
    """Total bytes pip will download, from the sizes the file records; None when one is unknown."""
    if isinstance(requirements, (str, os.PathLike)):
        requirements = parse_requirements(requirements)
    sizes = [r.size for r in requirements]
    return None if any(s is None for s in sizes) else sum(sizes)


# --- what is installed ----------------------------------------------------------------------------


def installed_packages(target_dir: str | os.PathLike) -> dict[str, str]:
    """{distribution: version} of a complete install in target_dir (empty when there is none)."""
    target = Path(target_dir)
    if not (target / MARKER).is_file():
        return {}
    packages = {}
    for info in target.glob("*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        packages[normalized(name)] = version
    return packages


def installed_version(target_dir: str | os.PathLike) -> str | None:
    """"CUDA 13.5.37, cuDNN 9.28.1.4" for a complete install, None when none is there."""
    packages = installed_packages(target_dir)
    if not packages:
        return None
    cuda = packages.get("nvidia-cuda-runtime")
    cudnn = next((v for n, v in packages.items() if n.startswith("nvidia-cudnn")), None)
    parts = [f"CUDA {cuda}" if cuda else "", f"cuDNN {cudnn}" if cudnn else ""]
    return ", ".join(p for p in parts if p) or ", ".join(f"{n} {v}" for n, v in sorted(packages.items()))


def installed_requirements(target_dir: str | os.PathLike) -> str | None:
    """The sha256 of the requirements file the install in target_dir was made from."""
    try:
        return json.loads((Path(target_dir) / MARKER).read_text(encoding="utf-8")).get("requirements_sha256")
    except (OSError, ValueError):
        return None


def _sha256_text(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def is_current(target_dir: str | os.PathLike, requirements_file: str | os.PathLike) -> bool:
    """True when target_dir holds a complete install of exactly this requirements file."""
    return installed_requirements(target_dir) == _sha256_text(Path(requirements_file))


# --- install / remove -----------------------------------------------------------------------------


def _carries(folder: Path, marker: str) -> bool:
    mark = folder / marker
    return mark.is_file() and not mark.is_symlink()


def _not_ours(path: Path, what: str, marker: str) -> GpuRuntimeError:
    return GpuRuntimeError(
        f"{path} {what}, and it was not made by this add-on (it has no {marker} in it), so it is "
        f"left alone: nothing was deleted. Point {FOLDER_ENV} at a new or empty folder for the GPU "
        "libraries, or move that folder away yourself."
    )


def _check_ours(path: Path, marker: str) -> bool:
    """May ``path`` be deleted? True for a folder the add-on made (it carries ``marker``) or an
    empty one, False when nothing is there; raises GpuRuntimeError naming anything else."""
    if path.is_symlink():
        raise _not_ours(path, "is a symbolic link", marker)
    if not path.exists():
        return False
    if not path.is_dir():
        raise _not_ours(path, "is a file, not a folder", marker)
    if _carries(path, marker):
        return True
    try:
        empty = next(path.iterdir(), None) is None
    except OSError as exc:
        raise GpuRuntimeError(f"Cannot look into {path}: {exc}. Nothing was deleted.") from exc
    if not empty:
        raise _not_ours(path, "holds files", marker)
    return True


def _remove_ours(path: Path, marker: str) -> bool:
    """Delete ``path`` when the add-on made it (see :func:`_check_ours`); False when it was not there."""
    if not _check_ours(path, marker):
        return False
    if _carries(path, marker):
        shutil.rmtree(path)
    else:
        path.rmdir()  # an empty folder: rmdir fails rather than delete anything put there meanwhile
    return True


def check_replaceable(target_dir: str | os.PathLike) -> None:
    """Raise GpuRuntimeError (naming the folder) when an install could not replace what is at
    ``target_dir`` and its leftovers without deleting something the add-on did not make."""
    target = Path(target_dir).resolve()
    _check_ours(_beside(target, ""), MARKER)  # the target itself; the root is refused first
    _check_ours(_beside(target, _OLD_SUFFIX), MARKER)
    _check_ours(_beside(target, _STAGING_SUFFIX), STAGING_MARKER)


def _beside(target: Path, suffix: str) -> Path:
    if not target.name:  # "/" (also "//", "/tmp/.."): no room beside it, and never a folder to empty
        raise GpuRuntimeError(f"{target} is the root of the file system, not a folder for the GPU libraries: "
                              f"point {FOLDER_ENV} at a folder of their own. Nothing was deleted.")
    return target.with_name(target.name + suffix)


def remove(target_dir: str | os.PathLike) -> bool:
    """Delete the installed libraries; False when there was nothing to remove.

    Only folders the add-on made are deleted: one that carries no marker of the add-on (a shared
    folder, $HOME, named by LEAN_IMAGE_AI_GPU_RUNTIME_DIR) raises GpuRuntimeError naming it, and
    nothing is deleted. Libraries already loaded stay in this process until Blender quits (Windows
    refuses to delete them: that is reported as GpuRuntimeError with what to do).
    """
    target = Path(target_dir).resolve()
    owned = [(target, MARKER), (_beside(target, _OLD_SUFFIX), MARKER), (_beside(target, _STAGING_SUFFIX), STAGING_MARKER)]
    if not any(path.exists() or path.is_symlink() for path, _marker in owned):
        return False
    with one_install_at_a_time(target):  # never pulls the staging folder from under a running install
        return _remove(target, owned)


def _remove(target: Path, owned: list) -> bool:
    for path, marker in owned:  # all checked before anything goes
        _check_ours(path, marker)
    present = _carries(target, MARKER)
    try:
        for path, marker in owned:
            if path == target and not present:
                continue  # an empty folder the user made for the libraries stays
            _remove_ours(path, marker)
    except OSError as exc:
        raise GpuRuntimeError(
            f"Cannot delete {target}: {exc}. The libraries are in use by this Blender: restart Blender "
            "and remove them again (or delete the folder by hand)."
        ) from exc
    return present


