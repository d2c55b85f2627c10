"""Starting the model worker process (bpy-free): its command line, its environment, its connection.

Two ways to connect, one per platform family, both without a thread and without a blocking wait
in the host:

- POSIX: a socket pair; the child inherits its end (``pass_fds``). Connected before the child runs.
- Windows (no fork, no inherited socket): the host listens on a loopback socket, the child dials in
  and proves itself with a key it read on its stdin (never on its command line, which other users
  may read); the host's :meth:`Launch.poll_connect` accepts without waiting (``select`` with no
  timeout), and the client's connect deadline ends a child that never dials in. ``creationflags``
  carries ``CREATE_NO_WINDOW`` (no console window per worker). Tests run this branch on Linux with
  an AF_UNIX listener in place of the loopback one.

The worker runs ``python`` (the host's own by default: Blender's bundled Python). With the host's
Python it gets the host's ``sys.path``; with another interpreter only the add-on's own folder (its
numpy and onnxruntime come from its own environment: a host's compiled wheels would not load there).
"""

from __future__ import annotations

import os
import secrets
import select
import socket
import subprocess
from multiprocessing.connection import Connection
from pathlib import Path

from ...runtime import child_process

MODULE = f"{child_process.PACKAGE}.models.worker"
CREATE_NO_WINDOW = 0x08000000  # subprocess.CREATE_NO_WINDOW, which exists only on Windows' Python


class Launch:
    """One started worker process and its connection (None until it dialled in)."""

    def __init__(self, process: subprocess.Popen, conn: Connection | None, listener: socket.socket | None = None,
                 key: str = ""):
        self.process, self.conn, self.listener, self.key = process, conn, listener, key

    def poll_connect(self) -> Connection | None:
        """The connection once the child dialled in (never waits)."""
        if self.conn is None and self.listener is not None:
            readable, _, _ = select.select([self.listener], [], [], 0)
            if readable:
                accepted, _ = self.listener.accept()  # non-blocking listener (_start_listening): never waits
                accepted.setblocking(True)
                self.conn = Connection(accepted.detach())
                self.close_listener()
        return self.conn

    def close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None


def argv(python: str, exchange, gpu_runtime: str) -> list[str]:
    memory, disk = exchange.folders["m"], exchange.folders["d"]
    args = [python, "-m", MODULE, "--exchange", str(memory), "--spill", str(disk)]
    return args + (["--gpu-runtime", gpu_runtime] if gpu_runtime else [])


def environment(python: str, folder: Path, root: Path, extra: dict) -> dict:
    return {**child_process.environment(python, folder, root), **extra}


STDERR = "worker_stderr.txt"  # in the exchange's disk folder: a crash's last words, for the event log


def start(python: str, exchange, gpu_runtime: str, root: Path, extra_env: dict, *, listen: bool) -> Launch:
    folder = exchange.folders["m"]
    args, env = argv(python, exchange, gpu_runtime), environment(python, folder, root, extra_env)
    with open(exchange.folders["d"] / STDERR, "wb") as stderr:
        if listen:
            return _start_listening(args, env, folder, stderr)
        return _start_paired(args, env, folder, stderr)


def last_words(exchange, limit: int = 8000) -> str:
    """The end of what the worker wrote to its stderr (a traceback, a fatal error)."""
    try:
        with open(exchange.folders["d"] / STDERR, "rb") as err:
            err.seek(0, os.SEEK_END)
            err.seek(max(0, err.tell() - limit))
            return err.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _start_paired(args: list[str], env: dict, folder: Path, stderr) -> Launch:
    ours, theirs = socket.socketpair()
    try:
        process = subprocess.Popen(
            [*args, "--fd", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL, stderr=stderr, env=env, cwd=str(folder),
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return Launch(process, Connection(ours.detach()))


def listener_family() -> int:
    """The Windows branch's listener: loopback TCP there (select works on sockets only), AF_UNIX
    where a test forces this branch on Linux."""
    return socket.AF_INET if os.name == "nt" else socket.AF_UNIX


def _start_listening(args: list[str], env: dict, folder: Path, stderr) -> Launch:
    family = listener_family()
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_UNIX:
            address = str(folder / "connect.sock")
            listener.bind(address)
        else:
            listener.bind(("127.0.0.1", 0))
            host, port = listener.getsockname()[:2]
            address = f"{host}:{port}"
        listener.listen(1)
        listener.setblocking(False)
        key = secrets.token_hex(32)
        process = subprocess.Popen(
            [*args, "--address", address], stdin=subprocess.PIPE, stderr=stderr, env=env, cwd=str(folder),
            creationflags=CREATE_NO_WINDOW,
        )
        try:
            process.stdin.write(key.encode() + b"\n")
            process.stdin.close()
        except OSError:  # it died at once: the client's next look says how
            pass
    except BaseException:
        listener.close()
        raise
    return Launch(process, None, listener, key)


def dial(address: str) -> Connection:
    """The worker's side of the listening branch."""
    if ":" in address and not os.path.exists(address):
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address)
    return Connection(sock.detach())
