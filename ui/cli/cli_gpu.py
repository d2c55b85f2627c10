"""`python -m lean_image_ai gpu-runtime install --target FOLDER --requirements FILE | remove --target FOLDER`:
NVIDIA's CUDA/cuDNN libraries for onnxruntime-gpu (runtime/cuda/gpu_libraries.py), all or nothing.

Blender's Install GPU Runtime button runs ``install --json-progress`` in a child process (pip and
its output reader live there, not in Blender's process); SIGTERM, its Cancel, stops pip and
leaves nothing behind.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from ...models.store import library
from ...runtime.child_process import emit
from ...runtime.cuda import gpu_install, gpu_libraries
from ...runtime.errors import LeanImageError, printable, user_path
from .cli_job import EXIT_OK


def _requirements(args) -> Path:
    if args.requirements:
        path = user_path(args.requirements)
        if not path.is_file():
            raise LeanImageError(f"No requirements file at {path}.")
        return path
    from ...runtime.paths import ADDON_ROOT

    shipped = gpu_libraries.requirements_path(ADDON_ROOT)
    if shipped is None:
        raise LeanImageError(
            f"This add-on has no CUDA libraries for {sys.platform} / Python {sys.version_info.major}."
            f"{sys.version_info.minor}: CUDA is offered on Linux and Windows x64. Give --requirements FILE."
        )
    return shipped


def _install(args) -> int:
    target = user_path(args.target)
    requirements = _requirements(args)
    size = gpu_libraries.download_size(requirements)
    interrupts = getattr(args, "interrupts", None)
    cancel = interrupts.event if interrupts is not None else threading.Event()
    if interrupts is not None:
        interrupts.stops = "pip now; nothing is installed"

    def progress(fraction: float, stage: str) -> None:
        total = f" of {library.format_bytes(size)}" if size else ""
        stage = f"{stage}{total}" if stage.startswith("downloading") else stage
        if args.json_progress:
            emit(progress=fraction, stage=stage)
        else:
            print(printable(f"  [{int(fraction * 100):3d}%] {stage}"), flush=True)

    folder = gpu_install.install(target, requirements, progress=progress, cancel=cancel.is_set)
    version = gpu_libraries.installed_version(folder)
    print(printable(f"installed {version} in {folder}"), file=sys.stderr if args.json_progress else sys.stdout)
    if args.json_progress:
        emit(result={"folder": str(folder), "version": version})
    return EXIT_OK


def _remove(args) -> int:
    target = user_path(args.target)
    if not gpu_libraries.remove(target):
        raise LeanImageError(f"No GPU runtime is installed in {target}; nothing was removed.")
    print(printable(f"removed the GPU runtime from {target}"))
    return EXIT_OK


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "gpu-runtime",
        help="install or remove NVIDIA's CUDA/cuDNN libraries for onnxruntime-gpu (what Blender's button does)",
        description="pip installs the pinned wheels into a staging folder beside FOLDER; only a complete, "
        "checked install is moved into place. pip uses its own configuration and PIP_* variables.",
    )
    actions = parser.add_subparsers(dest="gpu_command", metavar="ACTION", required=True)
    install = actions.add_parser("install", help="download and install the libraries into --target")
    install.add_argument("--target", required=True, metavar="FOLDER", help="the GPU runtime folder")
    install.add_argument("--requirements", default="", metavar="FILE",
                         help="pinned requirements file (default: the one the add-on ships for this platform)")
    install.add_argument("--json-progress", action="store_true",
                         help="progress and the result as JSON lines on stdout (for a host such as Blender)")
    install.set_defaults(handler=_install)
    remove = actions.add_parser("remove", help="delete the libraries the add-on installed in --target")
    remove.add_argument("--target", required=True, metavar="FOLDER", help="the GPU runtime folder")
    remove.set_defaults(handler=_remove)
