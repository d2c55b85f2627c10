"""Waiting in tests for what another thread or process does, with a generous limit (slow CI)."""

import time


def wait_until(condition, what: str, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)
