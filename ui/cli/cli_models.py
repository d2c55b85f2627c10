"""`python -m lean_image_ai models list | install ID | register FAMILY FILE | remove ID | verify`.

The same model library as Blender's preferences (models/store/library.py: the same folder by default,
the same installer with its resume, checksums and lock, the same family check when registering).
Exit codes as the jobs': 0 done, 2 an error (one line on stderr says why), 130 interrupted.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from ...models import families
from ...models.store import library, user_models
from ...runtime import get_runtime
from ...runtime.child_process import emit
from ...runtime.errors import LeanImageError, OperationCancelled, printable
from . import cli_job
from .cli_job import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK


def _folder(args):
    return library.models_dir(args.models_dir or "")


def _readable_folder(args) -> Path:
    """The models folder that list and verify look into: one this user cannot enter is said as
    such, not a traceback nor every model shown as missing (one not made yet holds no model)."""
    folder = _folder(args)
    try:
        with os.scandir(folder):
            pass
    except FileNotFoundError:
        return folder
    except PermissionError:
        raise LeanImageError(
            f"Permission denied opening the models folder {folder}: this user may not enter or read it. "
            "Give your user read and enter rights on it (and on the folders above it), or choose another with --models-dir."
        ) from None
    except NotADirectoryError:
        raise LeanImageError(
            f"The models folder {folder} is not a folder (a file, or a path through one): choose a folder with --models-dir."
        ) from None
    except OSError as exc:  # a path too long for the OS, a link loop, a drive gone
        raise LeanImageError(
            f"Cannot open the models folder {folder}: {exc.strerror or exc}. Choose another with --models-dir."
        ) from None
    return folder


def _lookup(folder, model_id: str):
    known = library.catalog(folder)
    try:
        return known, known.get(model_id)
    except KeyError:
        raise LeanImageError(
            f"No model with id {model_id!r}. `python -m lean_image_ai models list` shows the ids."
        ) from None


def _list(args) -> int:
    folder = _readable_folder(args)
    known = library.catalog(folder)
    print(printable(f"models folder: {folder}"))
    if library.catalog_error(folder):
        print(printable(f"warning: {library.catalog_error(folder)}"), file=sys.stderr)
    for entry in known.entries(args.family):
        state = library.status(entry, folder)
        where = f"  {library.installer.model_path(entry, folder)}" if state != library.MISSING else ""
        command = families.get(entry.family).command if entry.family in families.IDS else entry.family
        print(printable(f"{entry.id:40s} {command:17s} {state:18s} {library.format_size(entry):>10s}  {entry.title}{where}"))
    for family in families.ALL:
        if family.fallback_model is not None and args.family in (None, family.id):
            print(printable(_embedded_row(family)))
    return EXIT_OK


def _embedded_row(family) -> str:
    """The model shipped inside the add-on, which a job of its family runs when none is installed:
    listed like the others, with nothing to install or remove."""
    path = family.fallback_model
    size = library.format_bytes(path.stat().st_size if path.is_file() else None)
    name = f"{path.stem} (embedded)"
    title = f"built in, the default when no {family.command} model is installed"
    return f"{name:40s} {family.command:17s} {'embedded':18s} {size:>10s}  {title}  {path}"


class _DownloadProgress:
    """One line per 10% (or per 50 MB when the size is unknown), as the job progress lines."""

    def __init__(self):
        self.last = -1

    def __call__(self, done: int, total: int | None) -> None:
        step = int(done * 10 / total) if total else done // 50_000_000
        if step != self.last:
            self.last = step
            size = library.format_bytes(total) if total else "unknown size"
            percent = f"[{min(100, int(done * 100 / total)):3d}%] " if total else ""
            print(f"  {percent}downloading: {library.format_bytes(done)} / {size}", flush=True)


class _JsonProgress:
    """``--json-progress``: the stage a host shows (Blender's preferences), at most ten lines a
    second (a 1 GB model is four thousand chunks)."""

    def __init__(self, interval: float = 0.1):
        self.interval, self.last, self.stage = interval, 0.0, ""

    def __call__(self, done: int, total: int | None) -> None:
        stage = "verifying" if total and done >= total else "downloading"
        now = time.monotonic()
        if stage == self.stage and now - self.last < self.interval:
            return
        self.last, self.stage = now, stage
        size = library.format_bytes(total) if total else "unknown size"
        emit(progress=min(1.0, done / total) if total else 0.0,
             stage=f"{stage}: {library.format_bytes(done)} / {size}")  # fmt: skip


def _install(args) -> int:
    folder = _folder(args)
    _known, entry = _lookup(folder, args.model_id)
    if entry.is_user:
        raise LeanImageError(f"{entry.title} is your own file: there is nothing to download.")
    print(printable(f"installing {entry.title} ({library.format_size(entry)}) into {folder}"), file=_text(args))
    # the event the first Ctrl+C or SIGTERM sets (ui/cli/cli_job.Interrupts): the download's watch
    # polls it ten times a second and ends the transfer; a second signal raises Stopped at once
    interrupts = getattr(args, "interrupts", None)
    cancel = interrupts.event if interrupts is not None else threading.Event()
    if interrupts is not None:
        interrupts.stops = "the download now, keeping what arrived"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        progress = _JsonProgress() if args.json_progress else _DownloadProgress()
        path = library.fetch(entry, folder, progress=progress, cancel=cancel.is_set)
    except (OperationCancelled, KeyboardInterrupt):
        cancel.set()
        name = interrupts.name if interrupts is not None else "Ctrl+C"
        print(f"Stopped by {name}; the partial download is kept and `models install {entry.id}` resumes it.",
              file=sys.stderr)
        return interrupts.exit_code if interrupts is not None else EXIT_INTERRUPTED
    except OSError as exc:
        raise LeanImageError(f"Cannot write to the models folder {folder}: {exc}. Give --models-dir another folder.") from exc
    text = f"Installed {entry.title} ({library.format_bytes(path.stat().st_size)}) at {path}"
    print(printable(text[0].lower() + text[1:]), file=_text(args))
    if args.json_progress:
        emit(result={"path": str(path), "text": text})
    return EXIT_OK


def _text(args):
    """Where the human lines go: stdout, or stderr when stdout carries ``--json-progress``."""
    return sys.stderr if getattr(args, "json_progress", False) else sys.stdout


def _register(args) -> int:
    folder = _folder(args)

    def progress(fraction, stage):
        if args.json_progress:
            emit(progress=fraction, stage=stage)
        else:
            print(printable(f"  {stage}"), flush=True)

    registered = user_models.register(args.family_id, args.file, folder, progress=progress)
    print(printable(registered.summary()), file=_text(args))
    print(printable(f"id: {registered.entry.id}"), file=_text(args))
    if args.json_progress:
        emit(result={"id": registered.entry.id, "text": registered.summary(),
                     "warning": bool(registered.verdict.warning)})  # fmt: skip
    return EXIT_OK


def _remove(args) -> int:
    folder = _folder(args)
    known, entry = _lookup(folder, args.model_id)
    if entry.is_user:
        store = user_models.unregister(entry.id, folder)
        print(printable(f"unregistered {entry.title}; your file {entry.path} was left in place (list saved in {store})"))
        return EXIT_OK
    dest = library.installer.model_path(entry, folder)
    try:
        removed = library.remove(entry, folder, get_runtime())
    except OSError as exc:
        raise LeanImageError(f"Could not delete {dest}: {exc}.") from exc
    if not removed:
        raise LeanImageError(f"{entry.title} is not installed in {folder}; nothing was removed.")
    print(printable(f"removed {entry.title} ({dest})"))
    return EXIT_OK


def _verify_one(args) -> int:
    """``verify ID --json-progress``: the one model's check as a host's task (its error is the
    command's one line)."""
    folder = _readable_folder(args)
    _known, entry = _lookup(folder, args.model_id)
    interrupts = getattr(args, "interrupts", None)
    cancel = interrupts.event.is_set if interrupts is not None else None
    emit(progress=0.0, stage="verifying")
    path = library.installer.verify_installed(entry, folder, cancel=cancel)
    emit(result={"path": str(path), "text": f"Verified {entry.title} at {path}"})
    return EXIT_OK


def _verify(args) -> int:
    """Each model with a file (or a partial one) checked against the catalog: size, sha256."""
    if args.json_progress and args.model_id:
        return _verify_one(args)
    folder = _readable_folder(args)
    known = _lookup(folder, args.model_id)[0] if args.model_id else library.catalog(folder)
    checked = failed = 0
    for entry in known.entries():
        if args.model_id and entry.id != args.model_id:
            continue
        if library.status(entry, folder) == library.MISSING and not args.model_id:
            continue
        checked += 1
        try:
            path = library.installer.verify_installed(entry, folder)
        except LeanImageError as exc:
            failed += 1
            print(printable(f"FAILED {entry.id}: {exc}"))
            continue
        print(printable(f"ok     {entry.id}: {path}"))
    print(printable(f"{checked} checked, {failed} failed ({folder})"))
    if failed:
        print(f"error: {failed} model(s) failed verification; remove and install them again.", file=sys.stderr)
    return EXIT_ERROR if failed else EXIT_OK


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list, install, register, remove or verify models (the same folder as Blender's)",
        description="The model library Blender's preferences show: the same folder by default "
        f"(the per-user data folder, now {library.shared_models_dir()}; "
        f"${library.MODELS_DIR_ENV} or --models-dir override it).",
    )
    actions = parser.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    def action(name, handler, help_text):
        sub = actions.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--models-dir", help="models folder (default: the shared one)")
        sub.add_argument("--json-progress", action="store_true",
                         help="progress and the result as JSON lines on stdout (for a host such as Blender)")
        sub.set_defaults(handler=handler)
        return sub

    listing = action("list", _list, "every known model: id, family, state, size, title, file")
    listing.add_argument("--family", type=cli_job.family_arg, metavar=cli_job.family_metavar(),
                         help="only the models of this command")
    action("install", _install, "download a built-in model (resumes a partial download; checks size and sha256)").add_argument(
        "model_id", metavar="ID"
    )
    register = action("register", _register, "check your own ONNX file against a family and add it to the list")
    register.add_argument("family_id", metavar="COMMAND", type=cli_job.family_arg,
                          help=f"the command that will run it: {cli_job.family_metavar()}")
    register.add_argument("file", metavar="FILE")
    action("remove", _remove, "delete an installed model's file, or unregister your own (your file is kept)").add_argument(
        "model_id", metavar="ID"
    )
    action("verify", _verify, "check installed models against the catalog (size, sha256)").add_argument(
        "model_id", metavar="ID", nargs="?", default=""
    )


__all__ = ["add_parser"]
