"""One call other than a batch run in the model worker (bpy-free), pumped like a RemoteBatchRun:
the leak check (runtime/measure/leak_check.py), which measures the process whose runtime runs
the model, so it runs there. ``pump(budget) -> bool``, ``result``, ``cancel()``, ``report``."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from ..base import RunOptions
from . import client as worker_client
from .remote_batch import CANCEL_GRACE_S


class RemoteCall:
    def __init__(self, kind: str, spec: dict, *, options: RunOptions, name: str,
                 client: worker_client.WorkerClient | None = None):
        self._kind, self._spec, self._options, self.name = kind, spec, options, name
        self._cancel = options.cancel if isinstance(options.cancel, threading.Event) else threading.Event()
        self._client = client
        self.report = SimpleNamespace(cancelled=False)
        self.result = None
        self._phase, self._cancel_sent_at = "new", 0.0

    @property
    def client(self) -> worker_client.WorkerClient:
        if self._client is None:
            self._client = worker_client.shared()
        return self._client

    def cancel(self) -> None:
        self._cancel.set()

    def pump(self, budget: float = 0.05) -> bool:
        if self._phase == "over":
            return True
        deadline = time.monotonic() + budget
        try:
            if self._phase == "new":
                self.client.begin(self.name)
                self.client.send(self._kind, {**self._spec, "settings": self._options.get_runtime().settings})
                self._phase = "running"
            while self._phase != "over":
                if self._step():
                    continue
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.002)
        except worker_client.WorkerEnded as exc:
            self._phase = "over"
            self.client.end()
            if self._cancel_sent_at:
                self.report.cancelled = True
                return True
            raise worker_client.WorkerEnded(f"{exc} while running {self.name}; run it again") from None
        self.client.end()
        return True

    def _step(self) -> bool:
        if self._cancel.is_set() and not self._cancel_sent_at:
            self._cancel_sent_at = time.monotonic()
            self.client.send("cancel")
        if self._cancel_sent_at and time.monotonic() - self._cancel_sent_at > CANCEL_GRACE_S + 1.0:
            self.client.kill()  # a run that never looks at the cancel: the process ends
            self.report.cancelled, self._phase = True, "over"
            return True
        messages = self.client.messages()
        for message in messages:
            if message[0] == "progress":
                self._options.report(message[1], message[2])
            elif message[0] == "answer":
                self.result, self._phase = message[1], "over"
            elif message[0] == "error":
                self._phase = "over"
                self.client.end()
                raise message[1]
        return bool(messages)
