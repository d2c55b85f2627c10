"""The model worker's client (bpy-free): the one owner of the worker's life.

It alone decides when the worker starts (a job needs it and none runs, or its exchange folder was
removed), is reused (the next job), is told to cancel and then killed (:meth:`cancel`: no answer
within :data:`CANCEL_GRACE_S`), ends when idle (:meth:`check_idle`), on Free Memory Now
(:meth:`free_now`), when it crashed, when it speaks another protocol version, when it stopped
answering (no heartbeat for :func:`heartbeat_deadline`), when it did not connect in time
(:func:`connect_deadline`), and when a message could not be received. A worker that says nothing
from the moment a job begins (stopped or hung while it was idle) is replaced once, and the new one
runs the job: the messages sent since the job began are kept until the worker's first word, and
sent again to the new one. The remote runners
(remote_batch.py, remote_call.py) and the operators ask it; none of them ends the process.

Nothing here starts a thread or waits without a deadline: every read is ``poll(0)`` first and takes
a message only once all of it is there (models/worker/wire.py's receive), and each ``process.wait``
has a timeout. The worker is ``python -m lean_image_ai.models.worker``
(models/worker/launch.py) under the interpreter models/worker/engine_python.py chooses (the
``python`` given: the Worker Python preference; else ``LEAN_IMAGE_AI_WORKER_PYTHON``; else the
host's own); the
messages are models/worker/protocol.py's, arrays cross through models/worker/wire.py's exchange.

One client is shared by the process (:func:`shared`): the worker stays up between jobs, so a
model's session loaded by one job serves the next. What the host keeps of the worker's jobs (their
memory figures, its event log) is models/worker/host_record.py's; the memory requests
(Free Memory Now, Release now, the idle end) are models/worker/memory_requests.py's.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import time
import weakref
from pathlib import Path

from ...runtime.errors import LeanImageError
from ...runtime.paths import ADDON_ROOT
from . import engine_python, host_record, launch, outcome, wire
from . import protocol as p
from .deadlines import (  # noqa: F401 - the client's deadlines, named where its callers and tests look
    CANCEL_GRACE_S,
    CONNECT_DEADLINE_S,
    CONNECT_ENV,
    HEARTBEAT_DEADLINE_S,
    HEARTBEAT_ENV,
    KILL_WAIT_S,
    QUIT_WAIT_S,
    connect_deadline,
    heartbeat_deadline,
)
from .memory_requests import MemoryRequests


class WorkerEnded(LeanImageError):
    """The worker process is gone while it had work; the text says how, in a sentence.
    ``cancelled``: the client ended it because a cancel was not answered in time."""

    def __init__(self, text: str, *, cancelled: bool = False, connected: bool = True, last_words: str = ""):
        super().__init__(text)
        self.cancelled, self.connected = cancelled, connected  # not connected: no frame reached it
        self.last_words = last_words  # the last line of its stderr (its whole end is in the event log)


class WorkerClient(MemoryRequests):
    def __init__(self, *, gpu_runtime: str | os.PathLike = "", root: Path = ADDON_ROOT, env: dict | None = None,
                 python: str | os.PathLike = "", listen: bool | None = None):
        self.gpu_runtime = str(gpu_runtime or "")
        self.root = Path(root)
        self.env = dict(env or {})  # added to the worker's environment (tests: the fault switch)
        self.python = str(python or "")  # the Worker Python preference ("": the variable, else the host's own)
        self.listen = os.name == "nt" if listen is None else listen  # the Windows way to connect (launch.py)
        self.launch: launch.Launch | None = None
        self.exchange: wire.Exchange | None = None
        self.status: dict = {}  # the worker's latest own account (models, memory, job)
        self.peer: p.Hello | None = None  # the worker's hello, once it came
        self.job_name = ""  # the job running there now, as the client named it
        self.settings: dict = {}  # RuntimeSettings' fields the host's preferences set: sent with each job
        self.job_notices: list[str] = []  # what the report of the job running now says of the worker
        self.idle_since = time.monotonic()
        self.spawns = 0
        self._started_at = self._heard_at = 0.0
        self._started_with: tuple[str, str] = ("", "")  # (interpreter, gpu_runtime) of the running worker
        self._cancel_at: float | None = None
        self._cancel_grace = CANCEL_GRACE_S
        self._outbox: list[p.Message] = []  # sent before a dialling worker's hello: sent after it
        self._unanswered: list[p.Message] | None = None  # sent since the job began, while nothing was heard
        self._replaced = False  # this job's worker was replaced once already
        self._asked_alive_at: float | None = None  # the idle timer's last question (check_alive)
        _clients.add(self)

    # -- the process ---------------------------------------------------------------------------
    @property
    def process(self) -> subprocess.Popen | None:
        return self.launch.process if self.launch is not None else None

    @property
    def conn(self):
        return self.launch.conn if self.launch is not None else None

    @property
    def folder(self) -> Path | None:
        return self.exchange.folders["m"] if self.exchange is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.running else None

    def interpreter(self) -> str:
        """The Python the worker runs under (models/worker/engine_python.py's choice)."""
        return engine_python.worker_python(self.python)

    def ensure(self) -> bool:
        """Start the worker unless it runs; True when it was started now."""
        if self.running and self.exchange is not None and not self.exchange.usable():
            self._note("worker_restart", reason="its exchange folder was removed")
            self.kill()
        if self.running and not self.job_name and self._started_with != (self.interpreter(), self.gpu_runtime):
            # the Worker Python preference (or the GPU engine) changed since: the next job is the new one's
            self._note("worker_restart", reason="its Python or GPU engine was changed")
            self.stop()
        if self.running:
            return False
        self._tidy()
        if self.spawns == 0:
            wire.remove_stale()  # folders of hosts that were killed before they could remove them
        self.exchange = wire.Exchange.create(in_memory=not self.listen)
        try:
            self.launch = launch.start(self.interpreter(), self.exchange, self.gpu_runtime, self.root,
                                       self.env, listen=self.listen)
        except OSError as exc:
            self._tidy()
            raise LeanImageError(f"Could not start the model process ({self.interpreter()}): {exc}.") from exc
        except BaseException:
            self._tidy()
            raise
        self.status, self.peer, self.job_name, self.spawns = {}, None, "", self.spawns + 1
        self._started_at = self._heard_at = time.monotonic()
        self._started_with = (self.interpreter(), self.gpu_runtime)
        return True

    def _argv(self) -> list[str]:
        """The worker's command line (before a start, with stand-ins for its exchange folders)."""
        exchange = self.exchange or wire.Exchange(Path("<memory>"), Path("<disk>"))
        return launch.argv(self.interpreter(), exchange, self.gpu_runtime)

    def kill(self) -> None:
        """End the worker now, whatever it is doing."""
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()
            try:
                process.wait(KILL_WAIT_S)
            except subprocess.TimeoutExpired:  # stuck in the kernel (a driver call): the OS reaps it
                pass
        self._tidy()

    def stop(self) -> None:
        """End the worker politely (the host unregisters or quits), else kill it."""
        if self.running and self.peer is not None:
            try:
                self.send(p.Quit())
                self.process.wait(QUIT_WAIT_S)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def _tidy(self) -> None:
        if self.launch is not None:
            if self.launch.conn is not None:
                self.launch.conn.close()
            self.launch.close_listener()
        if self.exchange is not None:
            self.exchange.remove()
        self.launch, self.exchange, self.job_name, self._cancel_at = None, None, "", None
        self._outbox, self._unanswered, self._asked_alive_at = [], None, None
        self.idle_since = time.monotonic()

    # -- messages --------------------------------------------------------------------------------
    def send(self, message: p.Message) -> None:
        """Send now; where the worker dials in (Windows), once it proved itself in its hello
        (nothing waits for it: the outbox goes when the hello comes)."""
        if self.launch is None:
            raise OSError("the model process is not running")
        if self._unanswered is not None:
            self._unanswered.append(message)
        if self.conn is None or (self.peer is None and self.launch.key):
            self._outbox.append(message)
            return
        try:
            wire.send(self.conn, message, self.exchange)
        except wire.ExchangeError as exc:
            self.kill()  # the next job starts a fresh worker with fresh folders
            raise LeanImageError(str(exc)) from None
        except (OSError, ValueError):  # the connection is gone: say how the process ended
            self.messages()
            raise self._ended() from None

    def messages(self) -> list[p.Message]:
        """Every message that is there now (never waits). Raises :class:`WorkerEnded` (gone,
        hung, ended for a cancel) or a LeanImageError (a message it could not receive, another
        protocol version, no connection in time) in one line; the worker is reset then."""
        found: list[p.Message] = []
        if self.launch is None:
            return found
        try:
            conn = self.launch.poll_connect()
            while conn is not None and conn.poll(0):
                message = wire.receive(conn, self.exchange)
                if message is None:  # its frame is not all there yet: the next look reads it
                    break
                self._heard_at, self._unanswered = time.monotonic(), None
                if self._own(message):
                    found.append(message)
        except (EOFError, ConnectionError):
            pass
        except (OSError, MemoryError, p.ProtocolError) as exc:
            self.kill()
            raise LeanImageError(outcome.receive_failure(exc)) from None
        if found:
            return found  # what it said before it ended comes first
        self._check_deadlines()
        return found

    def _own(self, message: p.Message) -> bool:
        """Handle what is the client's own business; False when the message was that."""
        if self.peer is None:
            self._greet(message)
            return False
        if isinstance(message, p.Status):
            self._adopt(message.fields)
        elif isinstance(message, p.Event):
            host_record.replay(message.event)
        elif isinstance(message, p.Failed) and message.traceback:
            self._note("worker_traceback", text=message.text, traceback=message.traceback)
            return True
        else:
            return not isinstance(message, p.Heartbeat)
        return False

    def _greet(self, message: p.Message) -> None:
        version = getattr(message, "version", None)
        if not isinstance(message, p.Hello) or version != p.VERSION:
            self.kill()
            raise LeanImageError(
                f"The model process speaks protocol version {version}, this add-on version {p.VERSION}: "
                "its interpreter runs another copy of Lean Image AI; point it at this add-on's.")
        if self.launch is not None and self.launch.key and message.key != self.launch.key:
            self.kill()
            raise LeanImageError("Something else connected in place of the model process; run it again.")
        self.peer = message
        waiting, self._outbox = self._outbox, []
        for queued in waiting:
            self.send(queued)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        if not self.running or (self.conn is None and self.launch.listener is None):
            raise self._ended()
        if self._cancel_at is not None and now - self._cancel_at > self._cancel_grace:
            self.kill()  # one long native call does not look at the cancel: the process ends
            raise WorkerEnded("the model process was ended for the cancel", cancelled=True)
        if self.peer is None and now - self._started_at > connect_deadline():
            self.kill()
            raise LeanImageError(f"The model process did not connect within {connect_deadline():.0f} s; "
                                 "it was ended. Run it again (a slow disk or antivirus may delay its start).")
        if self.job_name and self.peer is not None and now - self._heard_at > heartbeat_deadline():
            if self._unanswered is not None and not self._replaced:
                self._replace(now - self._heard_at)
                return
            self.kill()
            raise WorkerEnded(f"the model process stopped answering for {heartbeat_deadline():.0f} s "
                              "(hung?) and was ended")

    def _replace(self, silent_s: float) -> None:
        """The worker said nothing since this job began (stopped or hung while idle): a new one
        runs the job, sent what the old one was sent (once per job; said in the job's report)."""
        name, unanswered = self.job_name, self._unanswered or []
        self.kill()
        text = (f"The model process did not answer for {silent_s:.0f} s when {name} began (stopped or hung "
                "while idle); it was ended and a new one ran the job.")
        self._note("worker_restart", reason=text)
        self.begin(name)
        self._replaced = True
        self.job_notices.append(text)
        for message in unanswered:
            self.send(message)

    def _ended(self) -> WorkerEnded:
        returncode = None
        if self.process is not None:
            try:
                returncode = self.process.wait(QUIT_WAIT_S)
            except subprocess.TimeoutExpired:  # its connection closed but it lives on: end it
                self.kill()
        cancelled = self._cancel_at is not None
        connected = self.peer is not None
        words = launch.last_words(self.exchange) if self.exchange is not None else ""
        how = f"the model process {outcome.ended_how(returncode)}"
        if words and not cancelled:
            self._note("worker_traceback", text=how, traceback=words)
        self._tidy()
        last = outcome.last_line(words) if not cancelled else ""
        if not connected:
            return WorkerEnded(f"{how} before it connected", connected=False, last_words=last)
        return WorkerEnded(how, cancelled=cancelled, last_words=last)

    def _adopt(self, status: dict) -> None:
        self.status = status
        if "timeline" in status:  # what the host's memory picture and Memory panel read
            host_record.job_figures(status.pop("timeline"), status.pop("job_memory"))

    def _note(self, event: str, **fields) -> None:
        host_record.note(event, **fields)

    def job_settings(self, options) -> dict:
        """The runtime settings a job sends: those of its own runtime where a caller gave one (a
        headless script's), else the host's preferences' (:attr:`settings`; none: the worker's own)."""
        runtime = getattr(options, "runtime", None)
        return p.settings_values(runtime.settings) if runtime is not None else dict(self.settings)

    # -- jobs ------------------------------------------------------------------------------------
    def begin(self, name: str) -> bool:
        """Before a job: the worker is up; True when it was started for this job."""
        started = self.ensure()
        self.job_name, self._cancel_at, self._heard_at = name, None, time.monotonic()
        self._unanswered, self._replaced, self.job_notices = [], False, []
        return started

    def end(self) -> list[str]:
        """After a job; what its report says of the worker (a replaced one)."""
        self.job_name, self._cancel_at, self._unanswered = "", None, None
        self.idle_since = time.monotonic()
        for notice in self.exchange.notices if self.exchange is not None else ():
            self._note("exchange_spill", text=notice)
        if self.exchange is not None:
            self.exchange.notices.clear()
        return list(self.job_notices)

    def cancel(self, grace: float = CANCEL_GRACE_S) -> None:
        """Tell the job to stop; the worker is killed if it has not finished ``grace`` s later."""
        if self._cancel_at is not None or not self.running:
            return
        self._cancel_at, self._cancel_grace = time.monotonic(), grace
        self.send(p.Cancel())

    def inject_fault(self, how: str) -> None:
        """Tests only: a fault in the worker (honoured where serve.FAULTS_ENV is set)."""
        self.send(p.Fault(how))


_shared: WorkerClient | None = None
_clients: weakref.WeakSet = weakref.WeakSet()


def shared(**settings) -> WorkerClient:
    """The process's one client; ``settings`` (gpu_runtime, env, python) apply to its next start."""
    global _shared
    if _shared is None:
        _shared = WorkerClient(**settings)
    else:
        for name, value in settings.items():
            setattr(_shared, name, str(value or "") if name in ("gpu_runtime", "python") else value)
    return _shared


def stop_shared() -> None:
    if _shared is not None:
        _shared.stop()


@atexit.register
def _at_exit() -> None:
    """A headless script that ends without stop_shared(): no worker and no exchange folder stay."""
    for client in list(_clients):
        try:
            client.stop()
        except Exception:  # noqa: BLE001 - the interpreter is going; the next start removes what is left
            pass
