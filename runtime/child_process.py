"""``python -m lean_image_ai ...`` in a child process, pumped by a host that must neither start a
thread nor import onnxruntime nor wait (Blender: its Python threads are unsupported, and a child
that ends gives back everything it loaded).

:func:`spawn` starts the command with the host's own Python (``sys.executable``: Blender's bundled
one inside Blender) and the host's ``sys.path``, so the child imports the add-on and the wheels the
host would; or with another interpreter (``python``: the worker's engine, a studio's venv), which
then gets only the add-on's folder (:func:`environment`: its own numpy and onnxruntime must win). :class:`ChildTask` is one such command run as a job's task: the host calls
:meth:`ChildTask.pump` from its own timer (or in a loop when it has no UI); the child's progress
comes as JSON lines in a file (``--json-progress``), read by offset at each pump, no pipe and no
reader thread; :meth:`ChildTask.cancel` sends SIGTERM (the command line's Ctrl+C: it keeps what it
may keep, a download's ``.part``), then kills it after a grace time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .errors import LeanImageError, OperationCancelled
from .paths import ADDON_ROOT

PACKAGE = "lean_image_ai"  # what ``python -m`` imports: the package's top-level name
CANCEL_GRACE_S = 15.0  # SIGTERM first (pip and a download tidy up), then the process is killed
# ChildTask.wait(): a child that writes no line for this long is taken as hung (a wedged GPU driver,
# a dead network share) and killed; a download says something every few hundred kilobytes.
SILENT_LIMIT_S = 300.0
KILL_WAIT_S = 5.0  # after SIGKILL: a process in an uninterruptible sleep is left, never waited on
WAIT_STEP_S = 0.02


def _search_dir(root: Path, folder: Path) -> Path:
    """A folder from which ``import lean_image_ai`` finds ``root``: its parent for an installed
    add-on (Blender names the folder after the package), else a link made in ``folder``."""
    if root.name == PACKAGE:
        return root.parent
    (folder / PACKAGE).symlink_to(root, target_is_directory=True)
    return folder


def command(*args: str, python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", PACKAGE, *args]


def is_host_python(python: str | None) -> bool:
    """Whether ``python`` is this interpreter. A venv's ``bin/python`` links to its base Python's
    binary, which is also the host's when the host is a venv of the same base (a stock bpy venv and
    a studio's engine venv): so the folder counts, not only the file it resolves to."""
    if not python:
        return True
    same_file = os.path.realpath(python) == os.path.realpath(sys.executable)
    same_folder = os.path.realpath(os.path.dirname(os.path.abspath(python))) == os.path.realpath(
        os.path.dirname(os.path.abspath(sys.executable)))
    return same_file and same_folder


def host_environment(folder: Path, root: Path = ADDON_ROOT, *, host_paths: bool = True) -> dict:
    """The environment of a child that imports this package and, with ``host_paths``, the host's
    wheels (False: another interpreter, whose own numpy and onnxruntime must win over the host's
    compiled ones); ``folder`` may get a link to the package."""
    paths = [str(_search_dir(Path(root), folder)), *(p for p in sys.path if p and host_paths)]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONIOENCODING="utf-8")


def environment(python: str | None, folder: Path, root: Path = ADDON_ROOT) -> dict:
    """The environment of a child run by ``python``: the host's own gets the host's ``sys.path``;
    another interpreter only the add-on's folder, and no PYTHONHOME (a host's, Blender's, would
    make it load the host's standard library)."""
    if is_host_python(python):
        return host_environment(folder, root)
    env = host_environment(folder, root, host_paths=False)
    env.pop("PYTHONHOME", None)
    return env


def spawn(args: Sequence[str], folder: Path, *, root: Path = ADDON_ROOT, python: str | None = None) -> subprocess.Popen:
    """Start ``python -m lean_image_ai *args`` (the host's Python unless ``python``) with its stdout
    and stderr in ``folder``'s ``stdout.txt`` and ``stderr.txt`` (files, so the host reads them
    without a pipe to drain)."""
    env = dict(environment(python, folder, root), PYTHONUNBUFFERED="1")
    with open(folder / "stdout.txt", "wb") as out, open(folder / "stderr.txt", "wb") as err:
        return subprocess.Popen(
            command(*args, python=python), stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=str(folder),
            creationflags=getattr(subprocess, "CREATE_NO_WINDOW", 0),  # no console flashing on Windows
        )  # fmt: skip


def new_folder(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"lean_image_ai_{prefix}_"))


def emit(**fields) -> None:
    """The child's side of ``--json-progress``: one JSON line on stdout, at once."""
    print(json.dumps(fields, default=str), flush=True)


def _last_error_line(text: str) -> str:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line and not line.startswith(("Traceback", "  ")):
            return line.removeprefix("error: ")
    return ""


class ChildTask:
    """One command line run in a child, as a job's task: ``pump(budget) -> bool`` (True once
    over; it waits at most about ``budget`` seconds), ``cancel()``, then ``result()`` (the child's
    ``{"result": ...}`` line, or the LeanImageError / OperationCancelled it ended with).

    ``report(fraction, stage)`` is told each ``{"progress": f, "stage": s}`` line; ``cancelled()``
    is asked at each pump (a job's cancel flag), as well as :meth:`cancel` being called;
    ``on_over(task)`` is called once, when it is over, before that pump returns True (a job engine
    that expects its task to leave the outcome in the job).
    """

    def __init__(self, args: Sequence[str], *, report: Callable[[float, str], None] | None = None,
                 cancelled: Callable[[], bool] | None = None, cancel_text: str = "Cancelled.",
                 grace_s: float = CANCEL_GRACE_S, root: Path = ADDON_ROOT,
                 on_over: Callable[[ChildTask], None] | None = None, python: str | None = None):  # fmt: skip
        self.args = list(args)
        self.python = python or sys.executable
        self._report = report
        self._cancelled = cancelled
        self.cancel_text = cancel_text
        self.grace_s = grace_s
        self._on_over = on_over
        self.folder = new_folder("task")
        self._offset = 0
        self._partial = b""
        self._outcome: dict | None = None  # the child's result line, or the error the host raises
        self._cancel_at: float | None = None
        self._stopped_text = ""  # why the host stopped a child that said nothing
        self.done = False
        try:
            self.process = spawn(self.args, self.folder, root=root, python=python)
        except OSError as exc:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise LeanImageError(f"Could not start {self.python} for this task: {exc}.") from exc
        self._heard_at = time.monotonic()

    # -- the host's side --------------------------------------------------------------------------
    def pump(self, budget: float = 0.0) -> bool:
        if self.done:
            return True
        deadline = time.monotonic() + max(0.0, budget)
        while True:
            if self._cancel_at is None and self._cancelled is not None and self._cancelled():
                self.cancel()
            self._read_lines()
            if self.process.poll() is not None:
                self._finish()
                return True
            if self._cancel_at is not None and time.monotonic() - self._cancel_at > self.grace_s:
                self.process.kill()
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(WAIT_STEP_S, left))

    def cancel(self) -> None:
        if self.done or self._cancel_at is not None:
            return
        self._cancel_at = time.monotonic()
        if self.process.poll() is None:
            self.process.terminate()

    def wait(self, poll_s: float = 0.1, silent_s: float = SILENT_LIMIT_S):
        """Pump until over, then the result (a host without a UI: Blender in background mode).
        A child that writes no line for ``silent_s`` is killed: a LeanImageError in one line."""
        while not self.pump(poll_s):
            if time.monotonic() - self._heard_at > silent_s:
                self._stop_silent(silent_s)
        return self.result()

    def _stop_silent(self, silent_s: float) -> None:
        self._stopped_text = (
            f"`{' '.join(self.args[:2])}` said nothing for {silent_s:.0f} s and was stopped (a hung GPU driver "
            f"or disk?); run it in a terminal to see where: {self.python} -m {PACKAGE} {' '.join(self.args)}"
        )
        self.process.kill()
        if not self.pump(KILL_WAIT_S):  # unkillable for now (uninterruptible sleep): left, not waited on
            self._finish()

    def result(self):
        if not self.done:
            raise RuntimeError("ChildTask.result() before the task is over")
        outcome = self._outcome or {}
        if "result" in outcome:
            return outcome["result"]
        if outcome.get("cancelled"):
            raise OperationCancelled(outcome.get("error") or self.cancel_text)
        raise LeanImageError(outcome.get("error") or "The task ended without a result.")

    # -- reading the child ------------------------------------------------------------------------
    def _read_lines(self) -> None:
        try:
            with open(self.folder / "stdout.txt", "rb") as out:
                out.seek(self._offset)
                chunk = out.read()
        except OSError:
            return
        self._offset += len(chunk)
        if chunk:
            self._heard_at = time.monotonic()
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for raw in lines:
            self._line(raw)

    def _line(self, raw: bytes) -> None:
        try:
            message = json.loads(raw)
        except ValueError:  # a plain line of the command (its usual text): not for the host
            return
        if not isinstance(message, dict):
            return
        if "progress" in message and self._report is not None:
            self._report(float(message["progress"]), str(message.get("stage", "")))
        if "result" in message:
            self._outcome = {"result": message["result"]}

    def _finish(self) -> None:
        self._read_lines()
        self._line(self._partial)
        code = self.process.returncode
        if self._stopped_text:
            self._outcome = {"error": self._stopped_text}
        elif self._outcome is None or code != 0:
            err = (self.folder / "stderr.txt").read_text(encoding="utf-8", errors="replace")
            line = _last_error_line(err)
            if self._cancel_at is not None:
                self._outcome = {"cancelled": True, "error": self.cancel_text}
            else:
                self._outcome = {"error": line or f"The task ended with exit code {code} and said nothing."}
        self.done = True
        shutil.rmtree(self.folder, ignore_errors=True)
        if self._on_over is not None:
            self._on_over(self)
