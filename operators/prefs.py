"""The add-on preferences as the operators read them (bpy): device, memory, models folder.

The preferences class itself (what the artist edits) is ui/preferences.py; this module only reads
its values, so operators never import ui/.
"""

from dataclasses import dataclass, replace
from pathlib import Path

import bpy

from ..models import families
from ..models.model_run import ModelRun
from ..models.store import library
from ..models.worker import client as worker_client
from ..models.worker import host_record
from ..runtime import parse_device
from ..runtime.cuda import gpu_libraries
from ..runtime.errors import LeanImageError
from ..runtime.log import event_file
from ..runtime.paths import ADDON_ROOT
from ..runtime.providers import DEVICE_BY_KIND, RELEASE_RULES, auto_device, fallback_device, release_rule
from ..runtime.settings import MemoryBudgets, RuntimeSettings, budget_bytes
from . import sources

# "lean_image_ai.operators" -> "lean_image_ai"; installed: "bl_ext.user_default.lean_image_ai".
ADDON_ID = __package__.rpartition(".")[0] or __package__
GPU_RUNTIME_FOLDER = "gpu_runtime"


@dataclass
class DefaultPreferences:
    """The preferences' defaults, for when the package is registered without being an enabled
    add-on (a script that registers it by hand)."""

    models_dir: str = ""
    device: str = "AUTO"
    cuda_device_index: int = 0
    gpu_memory_budget_mb: int = 0
    ram_budget_mb: int = 0
    release_cpu_memory: bool = True
    ram_release_delay_s: float = 0.0
    idle_unload_minutes: int = 0
    cudnn_max_workspace: bool = False
    keep_models_loaded_on_dml_coreml: bool = False
    coreml_compute_units: str = "ALL"
    worker_python: str = ""  # empty: LEAN_IMAGE_AI_WORKER_PYTHON, else the host's Python


def get_prefs(context=None):
    context = context or bpy.context
    addon = context.preferences.addons.get(ADDON_ID)
    prefs = getattr(addon, "preferences", None) if addon is not None else None
    return prefs if prefs is not None else DefaultPreferences()


def is_extension() -> bool:
    return ADDON_ID.startswith("bl_ext.")


def models_folder(context=None, *, create: bool = False) -> Path:
    """The models folder (models/store/library.py's order): by default the per-user data folder the
    command line uses too, outside the extension's own folder (Blender deletes that one when the
    extension is uninstalled or updated). A library in the old default folder is moved there once."""
    prefs = get_prefs(context)
    choice = bpy.path.abspath(prefs.models_dir) if prefs.models_dir else ""
    folder = library.models_dir(choice)
    if folder == library.shared_models_dir():
        _migrate_old_default(folder)
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return folder


_migrated: set[str] = set()


def _old_default_models_folder() -> Path:
    """Where Blender kept models before: the extension's user folder (a legacy add-on install:
    ``<user datafiles>/lean_image_ai/models``)."""
    if is_extension():
        return Path(bpy.utils.extension_path_user(ADDON_ID, path="models", create=False))
    return Path(bpy.utils.user_resource("DATAFILES", path=f"{ADDON_ID}/models", create=False))


def _migrate_old_default(folder: Path) -> None:
    old = _old_default_models_folder()
    if str(old) in _migrated:
        return
    _migrated.add(str(old))
    left = library.migrate_models(old, folder)
    if left:
        note = old / library.MIGRATED_NOTE
        print(f"Lean Image AI: models moved to {folder}; left in {old} (why: {note}): {', '.join(left)}")


def device_string(prefs) -> str:
    """The runtime's device string for the chosen device: auto, cpu, cuda:N, directml, coreml."""
    row = DEVICE_BY_KIND.get((getattr(prefs, "device", "") or "AUTO").lower())
    if row is not None and row.index_preference:  # a device the preferences give an index
        return f"{row.kind}:{max(0, int(getattr(prefs, row.index_preference, 0)))}"
    if row is not None:
        return row.kind
    return "auto"  # AUTO, or a stored choice this onnxruntime no longer offers


def memory_budget_bytes(prefs, name: str = "gpu_memory_budget_mb") -> int | None:
    """A budget preference (``gpu_memory_budget_mb``, ``ram_budget_mb``) in bytes, None for no limit
    (runtime/settings.py's rule, as for the command line's flags)."""
    return budget_bytes(name, int(getattr(prefs, name, 0) or 0))


def budgets(prefs) -> MemoryBudgets:
    return MemoryBudgets(memory_budget_bytes(prefs, "ram_budget_mb"), memory_budget_bytes(prefs))


def configure_runtime(context) -> tuple[str, MemoryBudgets]:
    """The preferences' runtime settings, for the model worker's runtime: kept by the worker client
    and sent with each job (Blender's process has no runtime of its own); returns (device string,
    memory budgets). The budgets are not the runtime's: the family job (models/model_run.py)
    carries them to its own operation, as on the command line, which checks them before each load
    and run (runtime/measure/budget.py)."""
    prefs = get_prefs(context)
    changes = dict(
        cpu_arena=bool(prefs.release_cpu_memory),
        cudnn_max_workspace=bool(getattr(prefs, "cudnn_max_workspace", False)),
        cpu_release_delay=float(getattr(prefs, "ram_release_delay_s", 0.0)),
        keep_models_loaded_on_dml_coreml=bool(getattr(prefs, "keep_models_loaded_on_dml_coreml", False)),
        coreml_compute_units=str(getattr(prefs, "coreml_compute_units", "ALL")),
        coreml_cache_dir=str(user_folder("coreml")),
    )
    replace(RuntimeSettings(), **changes)  # checked here: a value out of range is said before the worker is asked
    worker_client.shared().settings = changes
    return device_string(prefs), budgets(prefs)


def operator_model_run(context, owner, family_id: str) -> ModelRun:
    """The model run (models/model_run.py) of an operator's properties: its Model (a catalog id, never a path: files
    go in Model File) or Model File, its option values, and the preferences' device and budgets,
    applied to the runtime. Main thread: a model file never hashed is hashed by the job's first
    run, on the worker."""
    model_id = checked_model_id(getattr(owner, "model_id", ""))
    device, job_budgets = configure_runtime(context)
    family = families.get(family_id)
    model_path = getattr(owner, "model_path", "")
    return ModelRun.resolve(
        family.id,
        models_folder(context),
        model=model_id,
        model_path=str(sources.absolute_path(model_path)) if model_path else "",
        values={o.name: getattr(owner, o.name) for o in family.options},
        device=device,
        budgets=job_budgets,
    )


def checked_model_id(model_id: str) -> str:
    """``model_id`` if it can be a catalog id. One with a folder separator is refused here: looked
    up as a file it would be answered as a missing file, in words about another property."""
    if "/" in model_id or "\\" in model_id:
        raise LeanImageError(
            f"'{model_id}' is not a model id (ids have no '/' or '\\'). Use an id from the model "
            "list in the preferences or `python -m lean_image_ai models list`; for an ONNX file use Model File."
        )
    return model_id


def user_folder(name: str) -> Path:
    """``name`` in the extension's user folder, or ``<user datafiles>/lean_image_ai/<name>`` for a
    legacy add-on install (nothing is created)."""
    if is_extension():
        return Path(bpy.utils.extension_path_user(ADDON_ID, path=name, create=False))
    return Path(bpy.utils.user_resource("DATAFILES", path=f"{ADDON_ID}/{name}", create=False))


def release_rule_lines(prefs, providers_offered: list[str]) -> list[str]:
    """For the preferences: the release rule of the chosen device (AUTO: the device it picks
    first), and the device each model of the last job really ran on with the rule that applied."""
    request = parse_device(device_string(prefs))
    device = auto_device(providers_offered) if request.kind == "auto" else DEVICE_BY_KIND[request.kind]
    rule = release_rule(
        [device.provider],
        cpu_arena=bool(getattr(prefs, "release_cpu_memory", True)),
        keep_loaded=bool(getattr(prefs, "keep_models_loaded_on_dml_coreml", False)),
    )
    lines = [f"Memory on {device.label}: {RELEASE_RULES[rule]}"]
    last = host_record.last_job_memory or {}
    lines += [f"Last job ran on {note}" for note in last.get("release_rules") or ()]
    return lines


def gpu_runtime_folder(*, create_parent: bool = False) -> Path:
    """Where the NVIDIA CUDA/cuDNN libraries go (runtime/cuda/gpu_libraries.py): the extension's user
    folder (kept across add-on updates), or ``<user datafiles>/lean_image_ai/gpu_runtime`` for a
    legacy add-on install; ``LEAN_IMAGE_AI_GPU_RUNTIME_DIR`` overrides both (a farm's shared copy).

    Only the parent is ever created: the folder itself appears when an install is complete."""
    if is_extension():
        parent = Path(bpy.utils.extension_path_user(ADDON_ID, create=create_parent))
    else:
        parent = Path(bpy.utils.user_resource("DATAFILES", path=ADDON_ID, create=create_parent))
    folder = gpu_libraries.folder(parent / GPU_RUNTIME_FOLDER)
    if create_parent:
        folder.parent.mkdir(parents=True, exist_ok=True)
    return folder


def log_folder() -> Path:
    """Where the runtime's event log goes (runtime/log/event_file.py): the extension's user folder
    (``logs``), or ``<user datafiles>/lean_image_ai/logs`` for a legacy add-on install;
    ``LEAN_IMAGE_AI_LOG_DIR`` overrides both. Nothing is created here."""
    return event_file.log_folder(user_folder("logs"))


def gpu_requirements() -> Path | None:
    """The requirements file this zip ships for this platform and Blender's Python (None on macOS,
    or in a zip built for another platform)."""
    return gpu_libraries.requirements_path(ADDON_ROOT)


def gpu_runtime_size_text() -> str | None:
    """The GPU runtime's download size for this platform, from the sizes its pinned requirement
    file records (the one figure the box, the button's tooltip and the docs give); None when this
    zip has no GPU runtime or a size is unknown."""
    requirements = gpu_requirements()
    size = gpu_libraries.download_size(requirements) if requirements is not None else None
    return library.format_bytes(size) if size else None


GPU_RUNTIME_HINT = (
    "The GPU engine (CUDA/cuDNN libraries) is not installed: Edit > Preferences > Add-ons > Lean Image AI "
    "shows the terminal command that installs it."
)


def with_gpu_runtime_hint(warning: str) -> str:
    """A fallback warning of a device whose libraries the add-on installs (its row says so), plus
    the button that provides them where this zip offers them and they are not installed yet."""
    row = fallback_device(warning)
    if row is None or not row.addon_libraries or gpu_requirements() is None:
        return warning
    try:
        if gpu_libraries.installed_version(gpu_runtime_folder()):
            return warning  # installed: the cause is elsewhere (the driver), the warning says so
    except Exception:  # no user folder to look in: then nothing is installed there either
        pass
    return f"{warning} {GPU_RUNTIME_HINT}"
