"""The runtime's settings and their limits: validated once, where they enter.

`RuntimeSettings` checks every field when it is made (also by ``replace``/``Runtime.configure``),
the environment variables of headless runs are parsed here, and Blender's preferences take their
limits from the constants below, so each setting has one accepted range and one message naming it.

Thread counts are clamped to the machine: ``intra_op_threads`` above the CPUs this process may run
on (its affinity mask, else the logical CPU count) becomes that count; 0 keeps onnxruntime's own
choice. More threads than CPUs only makes them wait on each other.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, fields

from .errors import SettingError
from .providers import CONV_ALGO_SEARCHES, COREML_COMPUTE_UNITS

MAX_RELEASE_DELAY_S = 86_400.0  # a day: longer is "never", and threading.Timer overflows near 1e9 s
MAX_BYTES = 1 << 50  # 1 PiB: no machine has more; a larger figure is a typo
RELEASE_DELAY_ENV = "LEAN_IMAGE_AI_RAM_RELEASE_DELAY"
RELEASE_CPU_ENV = "LEAN_IMAGE_AI_RELEASE_CPU"
CUDNN_MAX_WORKSPACE_ENV = "LEAN_IMAGE_AI_CUDNN_MAX_WORKSPACE"
KEEP_MODELS_LOADED_ENV = "LEAN_IMAGE_AI_KEEP_MODELS_LOADED_ON_DML_COREML"
RAM_BUDGET_ENV = "LEAN_IMAGE_AI_RAM_BUDGET_MB"
VRAM_BUDGET_ENV = "LEAN_IMAGE_AI_VRAM_BUDGET_MB"
MAX_BUDGET_MB = MAX_BYTES >> 20  # the preferences', the flags' and the variables' upper limit
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def machine_threads() -> int:
    """CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def quoted(value, limit: int = 40) -> str:
    """``value`` as a message quotes it, a long one cut (a 5000-digit value is not a message)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(str(value))} characters)"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bytes_or_none(name: str, value) -> None:
    if value is None:
        return
    if not _is_int(value) or not 1 <= value <= MAX_BYTES:
        raise SettingError(f"{name}={quoted(value)}: give a whole number of bytes from 1 to {MAX_BYTES} (2**50), or None for no limit.")


def check_release_delay(name: str, value) -> float:
    """Seconds from 0 to MAX_RELEASE_DELAY_S (the preference, the variable and the setting)."""
    ok = (_is_int(value) or isinstance(value, float)) and math.isfinite(value) and 0 <= value <= MAX_RELEASE_DELAY_S
    if not ok:
        raise SettingError(
            f"{name}={quoted(value)}: give the seconds without a job before RAM goes back, "
            f"from 0 (at each job's end) to {MAX_RELEASE_DELAY_S:.0f} (a day)."
        )
    return float(value)


def budget_bytes(name: str, value) -> int | None:
    """A memory budget given in MiB (the unit of the preferences, the command-line flags and the
    environment variables): a whole number from 0 (no limit: None) to MAX_BUDGET_MB; text is read
    as decimal digits only. Returns bytes."""
    text = value.strip() if isinstance(value, str) else None
    # more digits than the largest budget has is out of range: int() of thousands of digits raises
    if text is not None and re.fullmatch(r"[0-9]+", text) and len(text.lstrip("0")) <= len(str(MAX_BUDGET_MB)):
        value = int(text)
    if not _is_int(value) or not 0 <= value <= MAX_BUDGET_MB:
        raise SettingError(f"{name}={quoted(value)}: give a whole number of MiB from 0 (no limit) to {MAX_BUDGET_MB}.")
    return value << 20 if value else None


@dataclass(frozen=True)
class MemoryBudgets:
    """A job's RAM and VRAM budgets in bytes (None: no limit). They reach the runtime as its
    settings (:meth:`settings`); the runtime checks them before each load and run, and an
    upscale's auto tile size reads the one of the device its session really runs on
    (runtime/measure/budget.py ``budget_for``), whichever front-end gave them."""

    ram_bytes: int | None = None
    vram_bytes: int | None = None

    @classmethod
    def from_mb(cls, ram_mb, vram_mb, *, ram_name: str = "ram_budget_mb", vram_name: str = "vram_budget_mb"):
        return cls(budget_bytes(ram_name, ram_mb), budget_bytes(vram_name, vram_mb))

    def settings(self) -> dict:
        """The runtime settings they set; the VRAM budget also caps the CUDA arena."""
        return {
            "ram_budget_bytes": self.ram_bytes,
            "vram_budget_bytes": self.vram_bytes,
            "gpu_mem_limit_bytes": self.vram_bytes,
        }


@dataclass(frozen=True)
class RuntimeSettings:
    release_memory: bool = True
    """Shrink arenas at the end of every operation (the spec). Off only for comparisons."""
    cpu_arena: bool = True
    """Give CPU sessions a shrinkable (kSameAsRequested) process-wide arena, so RAM comes back too."""
    cpu_arena_max_bytes: int | None = None
    """Cap for that arena. Applied when the arena is first registered (once per process)."""
    gpu_mem_limit_bytes: int | None = None
    """CUDA arena budget (`gpu_mem_limit`)."""
    ram_budget_bytes: int | None = None
    """Process RAM (RSS) a CPU job may bring this process to; checked before each load and run."""
    vram_budget_bytes: int | None = None
    """This process's memory on a GPU (NVML), the same check for CUDA jobs."""
    cudnn_max_workspace: bool = False
    """`cudnn_conv_use_max_workspace`: on, cuDNN may take most free VRAM, outside the budget."""
    cudnn_conv_algo_search: str = "HEURISTIC"
    """`cudnn_conv_algo_search` (HEURISTIC, EXHAUSTIVE or DEFAULT); see providers.py."""
    intra_op_threads: int = 0
    """Threads per model run; 0: onnxruntime's choice; more than the machine's CPUs: clamped (module doc)."""
    cpu_release_delay: float = 0.0
    """Seconds without a job before RAM goes back; 0 releases in each job's last run (deferred_release.py)."""
    keep_models_loaded_on_dml_coreml: bool = False
    """DirectML/CoreML have no arena to shrink: their release rule unloads a job's sessions at its
    end (providers.py). On: models stay loaded between jobs (faster; their memory stays taken)."""
    coreml_compute_units: str = "ALL"
    """CoreML ``MLComputeUnits``: ALL, CPUAndGPU or CPUAndNeuralEngine."""
    coreml_cache_dir: str | None = None
    """CoreML ``ModelCacheDirectory`` (compiled models); None: ``<per-user cache>/coreml``."""

    def budgets(self) -> MemoryBudgets:
        """The budgets of a job that brings none of its own (a script's configure(), the environment)."""
        return MemoryBudgets(self.ram_budget_bytes, self.vram_budget_bytes)

    def __post_init__(self):
        for name in ("release_memory", "cpu_arena", "cudnn_max_workspace", "keep_models_loaded_on_dml_coreml"):
            if not isinstance(getattr(self, name), bool):
                raise SettingError(f"{name}={getattr(self, name)!r}: give True or False.")
        for name in ("cpu_arena_max_bytes", "gpu_mem_limit_bytes", "ram_budget_bytes", "vram_budget_bytes"):
            _bytes_or_none(name, getattr(self, name))
        if self.cudnn_conv_algo_search not in CONV_ALGO_SEARCHES:
            raise SettingError(
                f"cudnn_conv_algo_search={self.cudnn_conv_algo_search!r}: give one of {', '.join(CONV_ALGO_SEARCHES)}."
            )
        if self.coreml_compute_units not in COREML_COMPUTE_UNITS:
            raise SettingError(
                f"coreml_compute_units={self.coreml_compute_units!r}: give one of {', '.join(COREML_COMPUTE_UNITS)}."
            )
        if self.coreml_cache_dir is not None and not (isinstance(self.coreml_cache_dir, str) and self.coreml_cache_dir.strip()):
            raise SettingError(f"coreml_cache_dir={self.coreml_cache_dir!r}: give a folder path, or None for the default.")
        threads = self.intra_op_threads
        if not _is_int(threads) or threads < 0:
            raise SettingError(f"intra_op_threads={threads!r}: give 0 (onnxruntime's choice) or a number of threads.")
        object.__setattr__(self, "intra_op_threads", min(threads, machine_threads()))
        object.__setattr__(self, "cpu_release_delay", check_release_delay("cpu_release_delay", self.cpu_release_delay))

    @property
    def ram_kept_between_jobs(self) -> bool:
        """RAM is not due back at each job's end: releasing is off, or put off until jobs stop."""
        return not self.release_memory or self.cpu_release_delay > 0


SETTING_NAMES = tuple(f.name for f in fields(RuntimeSettings))


# ---- environment variables (headless and farm runs) --------------------------------------------


def env_flag(name: str, default: bool) -> bool:
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise SettingError(f"{name}={quoted(os.environ[name])}: give 1 or 0 (also true/false, yes/no, on/off).")


def release_delay_from_environment() -> float:
    """`LEAN_IMAGE_AI_RAM_RELEASE_DELAY` in seconds; 0 when unset."""
    text = os.environ.get(RELEASE_DELAY_ENV, "").strip()
    if not text:
        return 0.0
    try:
        return check_release_delay(RELEASE_DELAY_ENV, float(text))
    except ValueError:  # SettingError is one too: say it again with the text as it was given
        return check_release_delay(RELEASE_DELAY_ENV, text)


def budgets_from_environment() -> MemoryBudgets:
    """`LEAN_IMAGE_AI_RAM_BUDGET_MB` and `LEAN_IMAGE_AI_VRAM_BUDGET_MB` (0 or unset: no limit)."""
    return MemoryBudgets.from_mb(
        os.environ.get(RAM_BUDGET_ENV, "").strip() or 0,
        os.environ.get(VRAM_BUDGET_ENV, "").strip() or 0,
        ram_name=RAM_BUDGET_ENV,
        vram_name=VRAM_BUDGET_ENV,
    )


def settings_from_environment() -> RuntimeSettings:
    """Headless/farm knobs; Blender preferences call `Runtime.configure()` instead."""
    return RuntimeSettings(
        **budgets_from_environment().settings(),
        cpu_arena=env_flag(RELEASE_CPU_ENV, True),
        cudnn_max_workspace=env_flag(CUDNN_MAX_WORKSPACE_ENV, False),
        keep_models_loaded_on_dml_coreml=env_flag(KEEP_MODELS_LOADED_ENV, False),
        cpu_release_delay=release_delay_from_environment(),
    )
