"""Structured runtime events: one logging record with a JSON payload each, plus a bounded
in-memory history that the UI can show (newest last)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

logger = logging.getLogger("lean_image_ai.runtime")

WARNING_KINDS = frozenset({"provider_fallback", "out_of_memory", "tile_split", "release_unsupported"})


class EventLog:
    def __init__(self, maxlen: int = 500):
        self._events: deque[dict] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._listeners: list[Callable[[dict], None]] = []

    def emit(self, kind: str, **payload) -> dict:
        event = {"event": kind, "time": time.time(), **payload}
        with self._lock:
            self._events.append(event)
            listeners = list(self._listeners)
        level = logging.WARNING if kind in WARNING_KINDS else logging.INFO
        logger.log(level, json.dumps(event, default=str, sort_keys=True))
        for listener in listeners:
            try:
                listener(event)
            except Exception:  # a broken UI listener must never break inference
                logger.exception("event listener failed")
        return event

    def recent(self, kind: str | None = None, limit: int | None = None) -> list[dict]:
        with self._lock:
            events = [e for e in self._events if kind is None or e["event"] == kind]
        return events[-limit:] if limit else events

    def clear(self) -> None:
        with self._lock:
            self._events.clear()

    def subscribe(self, listener: Callable[[dict], None]) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe():
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe
