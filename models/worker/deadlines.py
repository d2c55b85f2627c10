"""How long the model worker's client waits for each thing (bpy-free): a cancel's confirmation, a
polite quit, a killed process's reap, a word from a worker with work (the heartbeat), its hello
after a start. Tests shorten the two long ones through their environment variables.
"""

from __future__ import annotations

import os

QUIT_WAIT_S = 1.0
KILL_WAIT_S = 5.0  # a killed process is reaped within this; past it, it is left to the OS
CANCEL_GRACE_S = 0.5  # a cancel the worker has not confirmed by then ends the process (the 1 s goal)
HEARTBEAT_DEADLINE_S = 15.0  # no word from a worker with work for this long: it is hung, and killed
CONNECT_DEADLINE_S = 60.0  # from start to its hello (a cold start imports numpy and onnxruntime)
HEARTBEAT_ENV = "LEAN_IMAGE_AI_WORKER_HEARTBEAT_S"  # tests shorten the deadlines
CONNECT_ENV = "LEAN_IMAGE_AI_WORKER_CONNECT_S"


def heartbeat_deadline() -> float:
    return min(HEARTBEAT_DEADLINE_S, float(os.environ.get(HEARTBEAT_ENV) or HEARTBEAT_DEADLINE_S))


def connect_deadline() -> float:
    return min(CONNECT_DEADLINE_S, float(os.environ.get(CONNECT_ENV) or CONNECT_DEADLINE_S))
