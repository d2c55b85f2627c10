"""The memory sampler's thread is parked once a job's timeline has stopped: no round after
``Timeline.stop()`` returns. In Blender's Python 3.11 builds a thread of ours running Python while
a script's ``bpy.ops`` call returns crashes Blender (runtime/measure/timeline.py says how); the
stock test's undo steps on bpy 5.0.1 segfaulted about one run in five before."""

from __future__ import annotations

import threading
import time

from lean_image_ai.runtime.measure import timeline as tl


def test_no_sample_is_read_after_stop_returns_and_the_sampler_is_parked(monkeypatch):
    stopped = threading.Event()
    late = []

    def read(self):
        if stopped.is_set():
            late.append(threading.current_thread().name)
        return {"ram": 1, "vram": None}

    monkeypatch.setattr(tl.Timeline, "_read", read)
    for attempt in range(25):
        stopped.clear()
        timeline = tl.Timeline(interval=0.004).start()
        deadline = time.monotonic() + 10.0  # a loaded machine may not schedule the sampler for a while
        while not timeline.samples and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.001 * (attempt % 4))  # stop at varied points of the sampler's cycle
        timeline.stop()
        stopped.set()
        assert tl._sampler._parked, attempt
        time.sleep(0.012)  # a round still due would have read by now
        assert late == [], f"attempt {attempt}: read after stop() on {late}"
        assert timeline.samples, attempt  # it did sample while running


def test_two_timelines_keep_sampling_the_one_still_running():
    first, second = tl.Timeline(interval=0.002).start(), tl.Timeline(interval=0.002).start()
    first.stop()
    count = len(second.samples)
    time.sleep(0.05)
    assert len(second.samples) > count
    second.stop()
    assert tl._sampler._parked
