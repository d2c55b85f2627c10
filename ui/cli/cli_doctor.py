"""`python -m lean_image_ai doctor`: why the GPU is or is not used: which Python runs the worker,
which onnxruntime and from where, which providers can run, which are installed but cannot and why,
and the one thing to do next. Blender's Run Doctor button runs this command in a child process (Blender's own process never
imports onnxruntime)."""

from __future__ import annotations

import json
import sys

from ...runtime.child_process import emit
from .cli_job import EXIT_ERROR, EXIT_OK


def _providers() -> int:
    """``doctor --providers``: one JSON line, what Blender's device menu and panel need to know
    (asked by Blender in a child once a session, so Blender's own process never imports onnxruntime)."""
    from ...runtime.log import diagnostics
    from ...runtime.session import installed_providers, runnable_providers

    problem = diagnostics.onnxruntime_import_error()
    installed = [] if problem else installed_providers()
    runnable = [] if problem else runnable_providers(installed)
    # which interpreter and onnxruntime answered: the worker's, which may not be the host's
    version = "" if problem else getattr(sys.modules["onnxruntime"], "__version__", "?")
    emit(result={"onnxruntime_error": problem, "installed": installed, "runnable": runnable,
                 "python": sys.executable, "onnxruntime": version})  # fmt: skip
    return EXIT_OK


def _doctor(args) -> int:
    if args.gpu_runtime:  # as the model worker does, so the report is what its sessions get
        from ...runtime.cuda import gpu_loading

        gpu_loading.activate(args.gpu_runtime)
    if args.providers:
        return _providers()
    from ...runtime.log import diagnostics

    report = diagnostics.collect(cuda_probe=not args.no_cuda_probe)
    report.worker_python = _worker_python(args.worker_python)
    print(diagnostics.format_report(report))
    if args.json:
        import dataclasses

        print(json.dumps(dataclasses.asdict(report), default=str))
    return EXIT_OK if report.onnxruntime_error is None else EXIT_ERROR


def _worker_python(preference: str) -> dict:
    """The worker's interpreter when it is not this one (the preference, or
    LEAN_IMAGE_AI_WORKER_PYTHON), asked in a child: what it has, or its one line."""
    from ...models.worker import engine_python

    choice = engine_python.choose(preference)
    if choice.source == "host":
        return {}
    found = {"path": choice.path, "source": choice.described}
    try:
        facts = engine_python.check(choice.path)
    except engine_python.EnginePythonError as exc:
        return {**found, "problem": str(exc)}
    found["facts"] = (f"Python {facts.version_text}, numpy {facts.numpy}, onnxruntime {facts.onnxruntime} from "
                      f"{facts.onnxruntime_file}, providers {', '.join(facts.providers)}")  # fmt: skip
    return found


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="what onnxruntime, the GPU and its CUDA/cuDNN libraries look like from here",
        description="onnxruntime's version and where it was imported from, its providers, the NVIDIA "
        "driver and GPUs, where each CUDA/cuDNN library was found, and what a CUDA session really gets.",
    )
    parser.add_argument("--no-cuda-probe", action="store_true", help="do not try a CUDA session")
    parser.add_argument("--json", action="store_true", help="also print the report as one JSON line")
    parser.add_argument("--providers", action="store_true",
                        help="only one JSON line: the import error, the installed and the runnable providers")
    parser.add_argument(
        "--gpu-runtime", metavar="FOLDER", default="",
        help="load the CUDA/cuDNN libraries the add-on installed in FOLDER first (its GPU runtime folder)",
    )  # fmt: skip
    parser.add_argument(
        "--worker-python", metavar="PYTHON", default="",
        help="the worker's Python (Blender's Worker Python preference); default: LEAN_IMAGE_AI_WORKER_PYTHON",
    )  # fmt: skip
    parser.set_defaults(handler=_doctor)
