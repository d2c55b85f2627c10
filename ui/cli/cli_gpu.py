"""`python -m lean_image_ai gpu install [--target FOLDER] [--requirements FILE] | remove [--target FOLDER]`:
the GPU engine, onnxruntime-gpu with NVIDIA's CUDA/cuDNN libraries (runtime/cuda/gpu_libraries.py),
pinned, hash-checked, all or nothing.

The user runs it in a terminal: the add-on never runs pip (Blender's preferences show this command
for the machine, runtime/cuda/engine_command.py). Ctrl+C stops pip and leaves nothing behind.
``--target`` defaults to ``LEAN_IMAGE_AI_GPU_RUNTIME_DIR`` (render nodes). ``gpu-runtime`` is the
command's former name, still accepted.
"""

from __future__ import annotations

import os
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


def _target(args) -> Path:
    chosen = args.target or os.environ.get(gpu_libraries.FOLDER_ENV, "").strip()
    if not chosen:
        raise LeanImageError(
            f"No engine folder: give --target FOLDER (Blender's preferences show the command with its folder), "
            f"or set {gpu_libraries.FOLDER_ENV}."
        )
    return user_path(chosen)


def _install(args) -> int:
    target = _target(args)
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
    target = _target(args)
    if not gpu_libraries.remove(target):
        raise LeanImageError(f"No GPU runtime is installed in {target}; nothing was removed.")
    print(printable(f"removed the GPU runtime from {target}"))
    return EXIT_OK


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "gpu", aliases=["gpu-runtime"],
        help="install or remove the GPU engine: onnxruntime-gpu with NVIDIA's CUDA/cuDNN libraries",
        description="pip installs the pinned wheels into a staging folder beside FOLDER; only a complete, "
        "checked install is moved into place. pip uses its own configuration and PIP_* variables.",
    )
    actions = parser.add_subparsers(dest="gpu_command", metavar="ACTION", required=True)
    install = actions.add_parser("install", help="download and install the libraries into --target")
    install.add_argument("--target", default="", metavar="FOLDER",
                         help=f"the engine folder (default: {gpu_libraries.FOLDER_ENV})")
    install.add_argument("--requirements", default="", metavar="FILE",
                         help="pinned requirements file (default: the one the add-on ships for this platform)")
    install.add_argument("--json-progress", action="store_true",
                         help="progress and the result as JSON lines on stdout (for a program that drives the install)")
    install.set_defaults(handler=_install)
    remove = actions.add_parser("remove", help="delete the libraries the add-on installed in --target")
    remove.add_argument("--target", default="", metavar="FOLDER",
                        help=f"the engine folder (default: {gpu_libraries.FOLDER_ENV})")
    remove.set_defaults(handler=_remove)
