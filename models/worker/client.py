"""The model worker's client (bpy-free): starts the worker process, talks to it without ever
blocking, and ends it (idle, Free memory now, a cancel it did not answer, the host going away).

The worker runs under models/worker/engine_python.py's choice: by default the host's own Python
(``sys.executable``: Blender's bundled Python in Blender)
with the host's ``sys.path`` (runtime/child_process.py's ``host_environment``), running
``python -m lean_image_ai.models.worker``. The connection is a ``multiprocessing.connection``
Connection over a socket pair inherited by the child: no ``multiprocessing.Queue`` or ``Pool``
(each starts threads in the parent) and no thread here at all; every read is ``poll(0)`` first.
Arrays cross through files (models/worker/wire.py).

One client is shared by the process (:func:`shared`): the worker stays up between jobs, so a
model's session loaded by one job serves the next (models/worker/serve.py runs them on that
process's shared runtime).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from ...runtime import child_process
from ...runtime.errors import LeanImageError
from ...runtime.paths import ADDON_ROOT
from . import engine_python, wire

MODULE = f"{child_process.PACKAGE}.models.worker"
FREE_WAIT_S = 2.0  # Free memory now waits this long for the worker's own figures, then ends it anyway
QUIT_WAIT_S = 1.0


class WorkerEnded(LeanImageError):
    """The worker process ended while it had work (a crash, a kill, the OOM killer)."""


def ended_how(returncode: int | None) -> str:
    if returncode is None:
        return "without a word"
    if returncode < 0:
        return f"signal {-returncode}"
    return f"exit code {returncode}"


class WorkerClient:
    def __init__(self, *, gpu_runtime: str | os.PathLike = "", root: Path = ADDON_ROOT, env: dict | None = None,
                 python: str = ""):
        self.gpu_runtime = str(gpu_runtime or "")
        self.python = python  # the Worker Python preference (models/worker/engine_python.py); "": env, else ours
        self.root = Path(root)
        self.env = dict(env or {})  # added to the worker's environment (tests: the fault switch)
        self.process: subprocess.Popen | None = None
        self.conn = None
        self.folder: Path | None = None
        self.status: dict = {}  # the worker's latest own account (models, memory, job)
        self.job_name = ""  # the job running there now, as the client named it
        self.idle_since = time.monotonic()
        self.spawns = 0

    # -- the process ---------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.running else None

    def ensure(self) -> bool:
        """Start the worker unless it runs; True when it was started now."""
        if self.running:
            return False
        self._tidy()
        self.folder = wire.exchange_folder()
        try:
            self.process, self.conn = self._spawn(self.folder)
        except BaseException:
            self._tidy()
            raise
        self.status, self.job_name, self.spawns = {}, "", self.spawns + 1
        return True

    def _argv(self) -> list[str]:
        argv = [engine_python.worker_python(self.python), "-m", MODULE, "--exchange", str(self.folder)]
        return argv + (["--gpu-runtime", self.gpu_runtime] if self.gpu_runtime else [])

    def _spawn(self, folder: Path):
        env = {**child_process.host_environment(folder, self.root), **self.env}
        if os.name == "posix":
            import socket
            from multiprocessing.connection import Connection

            ours, theirs = socket.socketpair()
            try:
                process = subprocess.Popen(
                    [*self._argv(), "--fd", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL, env=env, cwd=str(folder),
                )
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            return process, Connection(ours.detach())
        return self._spawn_windows(env, folder)

    def _spawn_windows(self, env: dict, folder: Path):
        # Unverified here (no Windows machine): a named pipe the child connects to with a key that
        # travels on its stdin. accept() waits for the child's connect, about as long as its start.
        from multiprocessing.connection import Listener

        authkey = os.urandom(32)
        with Listener(family="AF_PIPE", authkey=authkey) as listener:
            process = subprocess.Popen(
                [*self._argv(), "--address", listener.address], stdin=subprocess.PIPE, env=env, cwd=str(folder)
            )
            process.stdin.write(authkey.hex().encode() + b"\n")
            process.stdin.close()
            return process, listener.accept()

    def kill(self) -> None:
        """End the worker now, whatever it is doing."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._tidy()

    def stop(self) -> None:
        """End the worker politely (the host unregisters or quits), else kill it."""
        if self.running:
            try:
                self.send("quit")
                self.process.wait(QUIT_WAIT_S)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def _tidy(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.folder is not None:
            wire.remove_folder(self.folder)
        self.conn, self.folder, self.job_name = None, None, ""
        self.idle_since = time.monotonic()

    # -- messages --------------------------------------------------------------------------------
    def send(self, *message) -> None:
        wire.send(self.conn, message, self.folder)

    def messages(self) -> list:
        """Every message that is there now (never waits). Raises :class:`WorkerEnded` once the
        process has gone and everything it sent before is read."""
        found = []
        try:
            while self.conn is not None and self.conn.poll(0):
                message = wire.receive(self.conn, self.folder)
                if message[0] == "status":
                    self._adopt(message[1])
                elif message[0] == "event":
                    _replay(message[1])
                else:
                    found.append(message)
        except (EOFError, OSError):
            pass
        else:
            if self.running:
                return found
        if found:
            return found  # what it said before it ended comes first
        returncode = self.process.wait() if self.process is not None else None
        self._tidy()
        raise WorkerEnded(f"the model process ended unexpectedly ({ended_how(returncode)})")

    def _adopt(self, status: dict) -> None:
        self.status = status
        if "timeline" in status:  # what the host's memory picture and Memory panel read
            from ...runtime import get_runtime

            runtime = get_runtime()
            runtime.last_timeline, runtime.last_job_memory = status.pop("timeline"), status.pop("job_memory")

    def begin(self, name: str) -> bool:
        """Before a job: the worker is up; True when it was started for this job."""
        started = self.ensure()
        self.job_name = name
        return started

    def end(self) -> None:
        self.job_name = ""
        self.idle_since = time.monotonic()

    # -- memory -------------------------------------------------------------------------------
    def state(self) -> str:
        """One line for the panel: not running / ready, model X, N MiB / running job Y."""
        if not self.running:
            return "Worker: not running"
        if self.job_name:
            return f"Worker: running {self.job_name}"
        try:
            self.messages()
            self.send("state")
        except (LeanImageError, OSError):
            return "Worker: not running"
        models = ", ".join(self.status.get("models", ())) or "no model loaded"
        rss = self.status.get("rss_bytes")
        size = f", {rss / 2**20:.0f} MiB" if rss else ""
        return f"Worker: ready, {models}{size}"

    def free_now(self) -> dict:
        """End the worker now; what it held just before (``rss_bytes``, ``vram_bytes`` where NVML
        sees it), measured by the worker itself, or by this side where the worker cannot answer."""
        if not self.running:
            self._tidy()
            return {"rss_bytes": 0, "vram_bytes": None, "was_running": False}
        figures = None
        try:
            self.send("free")
            deadline = time.monotonic() + FREE_WAIT_S
            while figures is None and time.monotonic() < deadline:
                if self.conn.poll(0.02):  # a bounded wait on a button press, not a job
                    message = wire.receive(self.conn, self.folder)
                    figures = message[1] if message[0] == "freed" else None
        except (EOFError, OSError):
            pass
        if figures is None:
            figures = {"rss_bytes": _rss_of(self.process.pid), "vram_bytes": None}
        self.kill()
        return {**figures, "was_running": True}

    def ask(self, kind: str) -> dict | None:
        """Release now / Unload all in an idle worker: its answer (what was freed), or None when
        it does not run or gives none within :data:`FREE_WAIT_S` (a bounded wait on a button)."""
        if not self.running or self.job_name:
            return None
        try:
            self.messages()
            self.send(kind)
            deadline = time.monotonic() + FREE_WAIT_S
            while time.monotonic() < deadline:
                for message in self.messages():
                    if message[0] == "answer":
                        return message[1]
                time.sleep(0.01)
        except (LeanImageError, OSError):
            pass
        return None

    def check_idle(self, idle_seconds: float, *, now: float | None = None) -> bool:
        """The host's timer: end a worker idle for ``idle_seconds`` (0: never); True when it did."""
        now = time.monotonic() if now is None else now
        if idle_seconds <= 0 or not self.running or self.job_name or now - self.idle_since < idle_seconds:
            return False
        self.stop()
        return True

    def inject_fault(self, how: str) -> None:
        """Tests only: a native fault in the worker (honoured where serve.FAULTS_ENV is set)."""
        self.send("fault", how)


def _replay(event: dict) -> None:
    """A worker's runtime event into this process's event log (and its listeners: the event file,
    the panel); the runtime here is only its log, it loads nothing."""
    from ...runtime import get_runtime

    payload = {k: v for k, v in event.items() if k not in ("event", "time")}
    get_runtime().events.emit(event["event"], **payload)


def _rss_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


_shared: WorkerClient | None = None


def shared(**settings) -> WorkerClient:
    """The process's one client; ``settings`` (gpu_runtime, env) apply to its next start."""
    global _shared
    if _shared is None:
        _shared = WorkerClient(**settings)
    else:
        for name, value in settings.items():
            setattr(_shared, name, str(value or "") if name == "gpu_runtime" else value)
    return _shared


def stop_shared() -> None:
    if _shared is not None:
        _shared.stop()


