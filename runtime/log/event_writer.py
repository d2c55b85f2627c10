"""The event log's writer thread (runtime/log/event_file.py), for the front-ends where threads are
fine: the command line, a farm worker, the model worker. Blender's process writes its log from a
timer instead and never loads this module."""

from __future__ import annotations

import queue
import threading

from .event_file import EventFile


class ThreadedEventFile(EventFile):
    """An :class:`EventFile` whose lines one long-lived writer thread appends."""

    def __init__(self, folder, **keywords):
        super().__init__(folder, **keywords)
        self._thread = threading.Thread(target=self._loop, name="lean-image-ai-event-log", daemon=True)
        self._thread.start()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until what was queued so far is on disk (or failed); False on timeout."""
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop listening, write what is queued, end the writer."""
        super().close(timeout)
        self._enqueue(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            self._append(item)
