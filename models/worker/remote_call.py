"""One call other than a batch run in the model worker (bpy-free), pumped like a RemoteBatchRun:
the leak check (runtime/measure/leak_check.py), which measures the process whose runtime runs
the model, so it runs there. ``pump(budget) -> bool``, ``result``, ``cancel()``, ``report``.
The client (models/worker/client.py) decides about the process: a cancel not answered within
its grace time ends it."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from ..base import RunOptions
from . import client as worker_client
from . import protocol as p

CANCEL_GRACE_S = worker_client.CANCEL_GRACE_S + 1.0  # one leak-check run is longer than a tile's answer


class RemoteCall:
    def __init__(self, message: p.Message, *, options: RunOptions, name: str,
                 client: worker_client.WorkerClient | None = None, result=lambda value: value):
        self._message, self._options, self.name = message, options, name
        self._cancel = options.cancel if isinstance(options.cancel, threading.Event) else threading.Event()
        self._client = client
        self._shape = result  # the answer's plain values as the caller's object
        self.report = SimpleNamespace(cancelled=False)
        self.result = None
        self.longest_pump_s = 0.0
        self._phase = "new"

    @property
    def client(self) -> worker_client.WorkerClient:
        if self._client is None:
            self._client = worker_client.shared()
        return self._client

    def cancel(self) -> None:
        self._cancel.set()

    def pump(self, budget: float = 0.05) -> bool:
        began = time.monotonic()
        try:
            return self._pump(budget)
        finally:
            self.longest_pump_s = max(self.longest_pump_s, time.monotonic() - began)

    def _pump(self, budget: float) -> bool:
        if self._phase == "over":
            return True
        deadline = time.monotonic() + budget
        try:
            if self._phase == "new":
                self.client.begin(self.name)
                self.client.send(self._message)
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
            if exc.cancelled or self._cancel.is_set():
                self.report.cancelled = True
                return True
            raise worker_client.WorkerEnded(f"{str(exc)[:1].upper()}{str(exc)[1:]} while running {self.name}; "
                                            "run it again.") from None
        except BaseException:
            self._phase = "over"
            self.client.end()
            raise
        self.client.end()
        return True

    def _step(self) -> bool:
        if self._cancel.is_set():
            self.client.cancel(CANCEL_GRACE_S)
        messages = self.client.messages()
        for message in messages:
            if isinstance(message, p.Progress):
                self._options.report(message.fraction, message.stage)
            elif isinstance(message, p.Answer):
                self.result, self._phase = self._shape(message.value), "over"
            elif isinstance(message, p.Failed):
                self._phase = "over"
                raise p.error_of(message)
        return bool(messages)


def leak_check_call(family: str, *, device: str, folder, budgets, runs: int, options: RunOptions, name: str,
                    client: worker_client.WorkerClient | None = None) -> RemoteCall:
    """The leak check of ``family`` in the worker; its ``result`` a runtime/measure/leak_check.py LeakResult."""
    from ...runtime.measure.leak_check import LeakResult

    message = p.LeakCheck(family, device, str(folder), runs,
                          {"ram_bytes": budgets.ram_bytes, "vram_bytes": budgets.vram_bytes},
                          (client or worker_client.shared()).job_settings(options))
    return RemoteCall(message, options=options, name=name, client=client, result=lambda value: LeakResult(**value))
