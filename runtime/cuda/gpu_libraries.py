"""NVIDIA's CUDA 13 and cuDNN 9 libraries for onnxruntime-gpu, in a folder the add-on owns (bpy-free).

onnxruntime-gpu's CUDA provider needs cudart, cuBLAS, cuFFT, cuRAND and cuDNN, which a Blender
user rarely has. NVIDIA publishes them as wheels (the `cuda` and `cudnn` extras of onnxruntime-gpu
name them). The zips carry the CPU onnxruntime, so onnxruntime-gpu comes with those libraries: the
add-on ships, per platform and Python, a requirements file pinning onnxruntime-gpu and each
library wheel by version, sha256 and size (`gpu_requirements/<platform>-cp<XY>.txt`, written by
tools/build_extension.py), and installs them with pip into its own folder (the GPU runtime):

    size = download_size(requirements)                          # bytes, before starting
    install(folder, requirements, progress=cb, cancel=flag)     # pip --target, all or nothing
    activation = activate(folder)                               # preload_dlls() from that folder
    installed_version(folder); remove(folder)

pip runs as a subprocess of the given Python (Blender's own, inside Blender) with its ordinary
configuration: the index, proxies and certificates the user set up for pip, and the standard
PIP_* environment variables. Nothing here names an index host.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import GpuRuntimeError, OperationCancelled, user_path
from .gpu_install_lock import one_install_at_a_time
from .pip_output import DOWNLOAD_SHARE, INSTALL_SHARE, normalized, pip_failure, progress_from_line

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


def install(target_dir: str | os.PathLike, requirements_file: str | os.PathLike, **options) -> Path:
    """Install the wheels of `requirements_file` into target_dir with pip; all or nothing.

    pip installs into a staging folder beside target_dir; only a complete, verified install is
    renamed into place (replacing an older one), so a failure, a cancel or a crash never leaves a
    half-filled folder that activate() would load from. Raises OperationCancelled when `cancel()`
    turns true (pip is terminated, the staging folder removed), GpuRuntimeError on failure, and
    at once when another process is installing into or removing target_dir (an OS lock,
    runtime/cuda/gpu_install_lock.py, is held for the whole install: staging, pip, marking it
    complete). Options: python, index_args, progress(fraction, stage), cancel(), poll_interval.
    """
    target = Path(target_dir).resolve()
    _beside(target, _STAGING_SUFFIX)  # the root of the file system is refused before any lock
    with one_install_at_a_time(target) as lock_fd:
        return _install(target, requirements_file, lock_fd=lock_fd, **options)


def _install(
    target_dir: Path,
    requirements_file: str | os.PathLike,
    *,
    python: str = sys.executable,
    index_args: Iterable[str] = (),
    progress: Callable[[float, str], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    poll_interval: float = 0.1,
    lock_fd: int | None = None,
) -> Path:
    target = Path(target_dir).resolve()
    requirements_file = Path(requirements_file).resolve()
    requirements = parse_requirements(requirements_file)
    report = progress or (lambda fraction, stage: None)
    cancelled = cancel or (lambda: False)
    staging = _beside(target, _STAGING_SUFFIX)
    check_replaceable(target)  # before pip downloads a gigabyte it could not put in place
    _remove_ours(staging, STAGING_MARKER)  # left by an install that was killed (its lock went with it)
    staging.mkdir()
    (staging / STAGING_MARKER).write_text("made by Lean Image AI's GPU runtime installer\n", encoding="utf-8")
    site = staging / "site"
    tmp = staging / "tmp"
    tmp.mkdir()
    command = [
        python, "-m", "pip", "install", "--target", str(site),
        "--no-deps", "--require-hashes", "--only-binary=:all:", "--no-input",
        "--disable-pip-version-check", "--progress-bar", "off", "--no-warn-script-location",
        # ~1 GB of wheels: a second copy in pip's cache would double what the artist gives up
        "--no-cache-dir",
        *index_args, "-r", str(requirements_file),
    ]  # fmt: skip
    env = dict(os.environ)
    for key in ("TMPDIR", "TEMP", "TMP"):  # pip's own temporary files go with the staging folder
        env[key] = str(tmp)
    env["PYTHONUNBUFFERED"] = "1"
    report(0.0, "starting pip")
    try:
        try:
            process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                text=True,
                errors="replace",
                creationflags=getattr(subprocess, "CREATE_NO_WINDOW", 0),  # no console flashing on Windows
                # pip holds the install's lock too: killed, this process leaves a pip that still
                # writes into the staging folder, and no other install may take it meanwhile
                pass_fds=(lock_fd,) if lock_fd is not None and os.name != "nt" else (),
            )
        except OSError as exc:
            raise GpuRuntimeError(f"Cannot run {python} to install the GPU libraries: {exc}.") from exc
        lines: list[str] = []
        output: queue.Queue = queue.Queue()

        def read():  # a reader thread, so cancel is seen while pip is silent in a long download
            for line in process.stdout:
                output.put(line.rstrip("\n"))
            output.put(None)

        reader = threading.Thread(target=read, name="lean_image_ai:pip-output", daemon=True)
        reader.start()
        state = {"done": 0, "seen": set()}
        finished = False
        while not finished:
            if cancelled():
                _terminate(process)
                reader.join(5)
                raise OperationCancelled("Installing the GPU libraries was cancelled; nothing was installed.")
            try:
                line = output.get(timeout=poll_interval)
            except queue.Empty:
                continue
            if line is None:
                finished = True
                continue
            lines.append(line)
            step = progress_from_line(line, requirements, state)
            if step is not None:
                report(*step)
        returncode = process.wait()
        reader.join(5)
        if returncode != 0:
            raise pip_failure(returncode, lines, python)
        if cancelled():
            raise OperationCancelled("Installing the GPU libraries was cancelled; nothing was installed.")
        report(DOWNLOAD_SHARE + INSTALL_SHARE, "checking")
        _check_installed(site, requirements)
        (site / MARKER).write_text(
            json.dumps(
                {
                    "requirements": requirements_file.name,
                    "requirements_sha256": _sha256_text(requirements_file),
                    "packages": {r.name: r.version for r in requirements},
                    "installed": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
                indent=1,
            ),
            encoding="utf-8",
        )
        _move_into_place(site, target)
    finally:
        # Never masks the real outcome; a staging folder Windows kept locked is removed by the next install.
        shutil.rmtree(staging, ignore_errors=True)
    report(1.0, "installed")
    return target


def _terminate(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _check_installed(site: Path, requirements: list[Requirement]) -> None:
    """pip said it succeeded; make sure each pinned distribution is really there."""
    have = {}
    for info in site.glob("*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        have[normalized(name)] = version
    wrong = [f"{r.name}=={r.version}" for r in requirements if have.get(normalized(r.name)) != r.version]
    if wrong:
        raise GpuRuntimeError(f"pip finished but did not install {', '.join(wrong)}; nothing was installed.")


def _move_into_place(site: Path, target: Path) -> None:
    old = _beside(target, _OLD_SUFFIX)
    _remove_ours(old, MARKER)
    if _check_ours(target, MARKER):
        try:
            target.rename(old)
        except OSError as exc:  # Windows: libraries of the old install are loaded in this Blender
            raise GpuRuntimeError(
                f"Cannot replace the GPU libraries in {target}: {exc}. Restart Blender, then install again."
            ) from exc
    site.rename(target)
    with contextlib.suppress(OSError):
        _remove_ours(old, MARKER)


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


