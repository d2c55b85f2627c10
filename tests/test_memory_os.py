"""runtime/memory.py reads memory from the OS itself (a stock Blender has no psutil); psutil, installed
in the dev venv, is the reference. Comparisons are ratios, never absolute figures."""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bh.import_package()
from lean_image_ai.runtime import memory  # noqa: E402

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _touched(nbytes: int) -> np.ndarray:
    block = np.ones(nbytes, dtype=np.uint8)  # ones, not zeros: every page is really resident
    return block


@linux_only
def test_rss_agrees_with_psutil():
    block = _touched(64 << 20)
    ours, reference = memory.process_rss_bytes(), psutil.Process().memory_info().rss
    assert 0.95 < ours / reference < 1.05
    del block


@linux_only
def test_statm_and_status_readers_agree():
    statm = memory._statm_rss_bytes()
    status = memory._status_kib("VmRSS") * 1024
    assert 0.95 < statm / status < 1.05


@linux_only
def test_rss_follows_an_allocation():
    before = memory.process_rss_bytes()
    size = 128 << 20
    block = _touched(size)
    grown = memory.process_rss_bytes() - before
    assert 0.8 < grown / size < 1.2
    del block


@linux_only
def test_peak_rss_holds_the_high_water_mark():
    size = 96 << 20
    block = _touched(size)
    during = memory.process_rss_bytes()
    del block
    peak = memory.peak_rss_bytes()
    assert peak / during >= 0.99
    assert peak >= memory.process_rss_bytes()


def test_available_memory_agrees_with_psutil():
    ours, reference = memory.available_system_memory_bytes(), psutil.virtual_memory().available
    assert 0.8 < ours / reference < 1.25  # other processes move it between the two reads


def test_everything_works_without_psutil_or_nvidia_ml_py(tmp_path):
    """What a stock Blender sees: the two modules cannot be imported at all."""
    search = bh.package_search_dir(tmp_path / "path")
    code = (
        "import json, sys\n"
        "sys.modules['psutil'] = None; sys.modules['pynvml'] = None  # import now raises ImportError\n"
        "from lean_image_ai.runtime import memory\n"
        "print(json.dumps({'rss': memory.process_rss_bytes(), 'peak': memory.peak_rss_bytes(),\n"
        "    'available': memory.available_system_memory_bytes(), 'gpus': memory.nvidia_gpu_count(),\n"
        "    'snapshot': memory.memory_snapshot(0)}))\n"
    )
    proc = bh.run_python(code, env=bh.isolated_blender_env(tmp_path / "u", pythonpath=[search]), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if sys.platform.startswith("linux"):
        assert out["rss"] > 0 and out["peak"] >= out["rss"] and out["available"] > 0
    assert out["snapshot"]["gpu"]["available"] is False  # NVML stats are optional: a field, not a crash
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        driver = True
    except OSError:
        driver = False
    if sys.platform.startswith("linux") and not driver:
        assert out["gpus"] == 0  # no driver library: 'auto' goes straight to CPU
    else:
        assert out["gpus"] is None or out["gpus"] >= 0


def test_os_structures_match_their_c_layouts():
    # Sizes from <psapi.h>, <sysinfoapi.h> (64-bit) and <mach/task_info.h> (MACH_TASK_BASIC_INFO_COUNT
    # 12 natural_t): a wrong field would make the OS reject the call or shift every value.
    if ctypes.sizeof(ctypes.c_void_p) == 8:
        assert ctypes.sizeof(memory._ProcessMemoryCounters) == 72
    assert ctypes.sizeof(memory._MemoryStatusEx) == 64
    assert ctypes.sizeof(memory._MachTaskBasicInfo) == 12 * 4


def test_runtime_and_models_never_import_psutil_or_pil(tmp_path):
    """The add-on's Blender path: psutil and Pillow are absent in a stock Blender."""
    search = bh.package_search_dir(tmp_path / "path")
    code = (
        "import importlib, pkgutil, sys\n"
        "sys.modules['psutil'] = None; sys.modules['PIL'] = None\n"
        "import lean_image_ai\n"
        "for sub in ('runtime', 'models'):\n"
        "    pkg = importlib.import_module('lean_image_ai.' + sub)\n"
        "    for info in pkgutil.iter_modules(pkg.__path__):\n"
        "        importlib.import_module(f'lean_image_ai.{sub}.{info.name}')\n"
        "from lean_image_ai.runtime import memory\n"
        "assert memory.process_rss_bytes() is None or memory.process_rss_bytes() > 0\n"
        "print('OK')\n"
    )
    proc = bh.run_python(code, env=bh.isolated_blender_env(tmp_path / "u", pythonpath=[search]), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout
