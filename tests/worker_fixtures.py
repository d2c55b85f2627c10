"""What the worker-boundary tests share (test_worker_process, test_worker_reports,
test_worker_deadlines) besides conftest.py's fixtures (``client``, ``small_model``,
``slow_model``): the size of a slow tile and a test picture."""

from __future__ import annotations

import numpy as np

SLOW = 192  # one tile of a wide compact net: long enough that a cancel lands inside it


def image(size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((size, size, 4), dtype=np.float32)
