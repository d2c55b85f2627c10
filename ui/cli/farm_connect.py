"""Joining or starting Ray for the farm runner (ui/cli/farm_ray.py), in bounded time.

``ray.init(address=...)`` waits without end for a cluster that it finds but that does not answer
(``--address auto`` meeting another process's private ``--address local`` instance, a HOST:PORT
whose listener never speaks GCS): it prints its own warnings every 5 s and never returns or
raises. It waits in Ray's C++ client (its warnings come from there), out of reach of a Python
timeout, so the first connection is tried in a child process that can be stopped: only once
that child has connected does this process call ``ray.init`` itself.
"""

from __future__ import annotations

import os
import subprocess
import sys

from ...runtime.errors import first_line
from .cli_job import CommandLineError

CONNECT_TIMEOUT_S = 60.0  # a cluster that answers connects in seconds, also on a loaded 2-core machine
# the child connects, says so, and leaves: Ray's warnings stay in its captured stderr
_PROBE = "import sys, ray\nray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\nray.shutdown()\n"


def connect(ray, address: str) -> bool:
    """Join or start Ray; True when this call started it (and so shuts it down)."""
    if ray.is_initialized():  # a caller (a pipeline script, the tests) already holds a connection
        return False
    if address != "local":  # "local" starts its own instance: nothing to wait for
        probe(address)
    try:
        if address == "local":
            ray.init(address="local", include_dashboard=False)
        else:
            ray.init(address=address)
    except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ImportError...
        raise CommandLineError(f"--address {address}: Ray could not connect ({first_line(exc)}); {_hint(address)}.") from None
    return True


def probe(address: str, timeout: float | None = None) -> None:
    """CommandLineError unless a Ray cluster at ``address`` lets a driver connect within ``timeout``."""
    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, address], capture_output=True, text=True, timeout=timeout,
            env=dict(os.environ), stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise CommandLineError(
            f"--address {address}: no Ray cluster answered within {timeout:.0f} s (Ray found an address but "
            f"nothing there let a driver connect); {_hint(address)}."
        ) from None
    if done.returncode != 0:
        raise CommandLineError(f"--address {address}: Ray could not connect ({_last_error(done.stderr)}); {_hint(address)}.")


def _hint(address: str) -> str:
    if address == "auto":
        return ("no shared Ray cluster is running here (another process's private --address local instance "
                "cannot be joined); start one (`ray start --head`) or use --address local")
    return "check the address, that the cluster is up, and for ray:// that ray[client] is installed"


def _last_error(stderr: str) -> str:
    """The exception line of the child's traceback (Ray's own log lines before it are noise here)."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line.split(":", 1)[0]]
    return (errors or lines or ["no reason given"])[-1][:300]
