"""The C heap's free pages go back to the OS at a CPU release (runtime.memory.trim_process_heap).

Each check runs in a fresh interpreter: RSS figures of a process that ran other tests say little.
"""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")


def run_fresh(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_freed_heap_pages_come_back_to_the_os():
    # 64 KiB blocks come from the heap (under glibc's mmap threshold); the last one stays alive so
    # free() cannot give the heap's top back on its own: only a trim can
    before, freed_rss, trimmed_rss, trimmed, freed_bytes = map(int, run_fresh(
        """
        import numpy as np
        from lean_image_ai.runtime.measure.memory import process_rss_bytes, trim_process_heap
        before = process_rss_bytes()
        blocks = [np.ones(64 * 1024 // 8) for _ in range(2048)]
        keep = blocks[-1]
        freed = sum(b.nbytes for b in blocks[:-1])
        del blocks
        freed_rss = process_rss_bytes()
        trimmed = trim_process_heap()
        print(before, freed_rss, process_rss_bytes(), int(trimmed), freed)
        """
    ))
    assert trimmed == 1
    assert freed_rss - before > freed_bytes // 2, "the freed blocks were still counted before the trim"
    assert freed_rss - trimmed_rss > freed_bytes // 2, "the trim gave most of them back"


def test_a_cpu_release_trims_the_heap_and_release_off_does_not():
    calls = run_fresh(
        """
        import numpy as np
        from lean_image_ai.runtime import Runtime, operation
        from lean_image_ai.runtime.release import on_request
        from lean_image_ai.runtime.measure import memory
        from lean_image_ai.models.adapters import upscale
        from lean_image_ai.models.base import RunOptions
        import lean_image_ai, pathlib
        model = pathlib.Path(lean_image_ai.__file__).parent / "models/assets/bicubic_x2.onnx"
        image = (np.random.default_rng(0).random((64, 96, 3)) * 255).astype(np.uint8)
        counted = []
        real = memory.trim_process_heap
        def counting():
            counted.append(1)
            return real()
        on_request.trim_process_heap = operation.trim_process_heap = counting
        for release in (True, False):
            counted.clear()
            runtime = Runtime()
            runtime.configure(cpu_arena=release)
            upscale.run(image, model, options=RunOptions(device="cpu", runtime=runtime))
            print(len(counted))
            runtime.clear("done")
        """
    )
    with_release, without = map(int, calls)
    assert with_release >= 1 and without == 0
