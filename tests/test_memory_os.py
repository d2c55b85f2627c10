"""runtime/measure/memory.py reads memory from the OS itself (a stock Blender has no psutil); psutil, installed
in the dev venv, is the reference. Comparisons are ratios, never absolute figures."""

from __future__ import annotations

import ctypes
import json
import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bh.import_package()
from lean_image_ai.runtime.measure import memory  # noqa: E402

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _touched(nbytes: int) -> np.ndarray:
    """A fresh anonymous mapping with every page written (really resident). Not from malloc: a
    heap that kept an earlier test's freed block resident would hand those pages back, and RSS
    would grow by less than the block (seen in a full suite run: 64 of 128 MB)."""
    block = np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)  # the array keeps the mapping alive
    block[:] = 1
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
    ours, reference = memory.os_available_memory_bytes(), psutil.virtual_memory().available
    assert 0.8 < ours / reference < 1.25  # other processes move it between the two reads
    assert memory.available_system_memory_bytes() <= ours  # never more than the OS has


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prlimit and /proc/self/status are Linux")
def test_an_address_space_limit_is_what_the_process_can_still_allocate(tmp_path):
    """`prlimit --as`: the OS still says gigabytes are free, but this process can map far less."""
    code = (
        "import json, resource\n"
        "from lean_image_ai.runtime.measure import memory\n"
        "def figures(): return {'os': memory.os_available_memory_bytes(), 'as': memory.address_space_headroom_bytes(),\n"
        "    'all': memory.available_system_memory_bytes()}\n"
        "before = figures()\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_AS)\n"
        "in_use = memory._status_kib('VmSize') * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (in_use + (200 << 20), hard))\n"
        "print(json.dumps({'before': before, 'after': figures()}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["before"]["as"] is None  # no limit set: not a figure
    after = result["after"]
    assert after["as"] is not None and after["as"] <= 200 << 20
    assert after["all"] == min(after["os"], after["as"]) and after["all"] < after["os"]


def test_the_cgroup_limit_is_read_from_the_tightest_cgroup(tmp_path):
    """cgroup v2 (the process's own cgroup and the ones above it) and v1, from their real files."""
    proc = tmp_path / "cgroup"
    proc.write_text("0::/slurm/job_7/step_0\n")
    job = tmp_path / "sys" / "slurm" / "job_7"
    (job / "step_0").mkdir(parents=True)
    (job / "memory.max").write_text("1073741824\n")  # the job's 1 GiB
    (job / "memory.current").write_text("268435456\n")
    (job / "step_0" / "memory.max").write_text("max\n")  # the step itself: no limit of its own
    (job / "step_0" / "memory.current").write_text("268435456\n")
    assert memory.cgroup_headroom_bytes(str(proc), str(tmp_path / "sys")) == (1 << 30) - (1 << 28)
    proc.write_text("4:memory:/docker/abc\n1:cpu:/docker/abc\n")
    v1 = tmp_path / "sys" / "memory" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(512 << 20))
    (v1 / "memory.usage_in_bytes").write_text(str(100 << 20))
    (tmp_path / "sys" / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712")  # none
    (tmp_path / "sys" / "memory" / "memory.usage_in_bytes").write_text(str(5 << 30))
    assert memory.cgroup_headroom_bytes(str(proc), str(tmp_path / "sys")) == 412 << 20
    proc.write_text("0::/\n")
    assert memory.cgroup_headroom_bytes(str(proc), str(tmp_path / "empty")) is None


def test_everything_works_without_psutil_or_nvidia_ml_py(tmp_path):
    """What a stock Blender sees: the two modules cannot be imported at all."""
    search = bh.package_search_dir(tmp_path / "path")
    code = (
        "import json, sys\n"
        "sys.modules['psutil'] = None; sys.modules['pynvml'] = None  # import now raises ImportError\n"
        "from lean_image_ai.runtime.measure import memory\n"
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
        "from lean_image_ai.runtime.measure import memory\n"
        "assert memory.process_rss_bytes() is None or memory.process_rss_bytes() > 0\n"
        "print('OK')\n"
    )
    proc = bh.run_python(code, env=bh.isolated_blender_env(tmp_path / "u", pythonpath=[search]), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout
