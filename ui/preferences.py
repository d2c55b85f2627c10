"""Add-on preferences: models folder, inference device, memory settings.

``bl_idname`` is the add-on's root package, which is ``lean_image_ai`` when imported from a
checkout and ``bl_ext.user_default.lean_image_ai`` when installed as an extension.
"""

# No ``from __future__ import annotations`` here: Blender reads the property annotations of the
# class below as objects at registration time.
import json
import os
import textwrap
import traceback
from dataclasses import dataclass
from pathlib import Path

import bpy
from bpy.props import BoolProperty, EnumProperty, IntProperty, StringProperty

from ..models import installer
from ..models.catalog import FAMILIES, Catalog
from ..runtime.errors import LeanImageError

# "lean_image_ai.ui" -> "lean_image_ai"; "bl_ext.user_default.lean_image_ai.ui" -> "bl_ext...ai".
ADDON_ID = __package__.rpartition(".")[0] or __package__

# Environment override for the default models folder (headless / farm use). An explicit
# preference still wins over it.
MODELS_DIR_ENV = "LEAN_IMAGE_AI_MODELS_DIR"

# identifier, label, description, onnxruntime provider needed (None: always offered), stable number.
# The numbers are what Blender stores, so they must never change (a dynamic enum is saved as int).
DEVICE_CHOICES = (
    ("AUTO", "Auto", "Best available: CUDA, then DirectML, then CoreML, else CPU", None, 0),
    ("CPU", "CPU", "Run on the CPU", None, 1),
    ("CUDA", "CUDA (NVIDIA)", "Run on an NVIDIA GPU with CUDA", "CUDAExecutionProvider", 2),
    ("DIRECTML", "DirectML", "Run on a DirectX 12 GPU (Windows)", "DmlExecutionProvider", 3),
    ("COREML", "CoreML (Apple)", "Run with Apple CoreML", "CoreMLExecutionProvider", 4),
)

# Blender requires the strings of dynamic enum items to stay alive while the enum is used:
# the items list returned by the callback is kept in this module-level variable.
_device_items: list[tuple[str, str, str, str, int]] = []


def available_providers() -> list[str]:
    """``onnxruntime.get_available_providers()``, or CPU only when onnxruntime is missing/broken."""
    try:
        import onnxruntime
    except Exception:  # missing wheel, DLL trouble: the CPU entry still lets users pick something
        return ["CPUExecutionProvider"]
    try:
        return list(onnxruntime.get_available_providers())
    except Exception:
        return ["CPUExecutionProvider"]


def compute_device_items(providers: list[str] | None = None) -> list[tuple[str, str, str, str, int]]:
    """Enum items for the installed onnxruntime: always AUTO and CPU, plus the GPU providers it has."""
    providers = available_providers() if providers is None else providers
    return [
        (ident, label, desc, "", number)
        for ident, label, desc, provider, number in DEVICE_CHOICES
        if provider is None or provider in providers
    ]


def device_items(_self=None, _context=None):
    """Items callback of ``LeanImageAIPreferences.device`` (computed once, then cached)."""
    if not _device_items:
        _device_items.extend(compute_device_items())
    return _device_items


def refresh_device_items() -> list[tuple[str, str, str, str, int]]:
    """Recompute the device list (e.g. after onnxruntime was installed); returns the new items."""
    _device_items[:] = compute_device_items()
    return _device_items


@dataclass
class DefaultPreferences:
    """Stand-in with the same attributes and defaults, when the add-on isn't an enabled add-on."""

    models_dir: str = ""
    device: str = "AUTO"
    cuda_device_index: int = 0
    gpu_memory_budget_mb: int = 0
    release_cpu_memory: bool = True


def get_prefs(context=None, *, fallback: bool = True):
    """The add-on preferences, or a :class:`DefaultPreferences` (None if ``fallback`` is False)
    when the package is registered without being an enabled add-on (tests, scripts)."""
    context = context or bpy.context
    addon = context.preferences.addons.get(ADDON_ID)
    prefs = getattr(addon, "preferences", None) if addon is not None else None
    if prefs is not None:
        return prefs
    return DefaultPreferences() if fallback else None


def is_extension() -> bool:
    return ADDON_ID.startswith("bl_ext.")


def get_models_dir(context=None, *, create: bool = True) -> Path:
    """Folder holding downloaded models.

    Order: the ``models_dir`` preference; else ``$LEAN_IMAGE_AI_MODELS_DIR``; else the extension's
    user folder (``extension_path_user(<package>, "models")``) when installed as an extension;
    else ``<Blender user datafiles>/lean_image_ai/models``.
    """
    prefs = get_prefs(context)
    if prefs.models_dir:
        path = Path(bpy.path.abspath(prefs.models_dir))
    elif os.environ.get(MODELS_DIR_ENV):
        path = Path(os.environ[MODELS_DIR_ENV]).expanduser()
    elif is_extension():
        return Path(bpy.utils.extension_path_user(ADDON_ID, path="models", create=create))
    else:
        return Path(bpy.utils.user_resource("DATAFILES", path=f"{ADDON_ID}/models", create=create))
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def get_device_string(prefs) -> str:
    """The runtime's device string for the chosen device: auto, cpu, cuda:N, directml, coreml."""
    device = (getattr(prefs, "device", "") or "AUTO").upper()
    if device == "CPU":
        return "cpu"
    if device == "CUDA":
        return f"cuda:{max(0, int(getattr(prefs, 'cuda_device_index', 0)))}"
    if device == "DIRECTML":
        return "directml"
    if device == "COREML":
        return "coreml"
    return "auto"  # AUTO, or a stored choice this onnxruntime no longer offers


def get_memory_budget_bytes(prefs) -> int | None:
    """``gpu_memory_budget_mb`` in bytes, None for no limit."""
    mb = int(getattr(prefs, "gpu_memory_budget_mb", 0) or 0)
    return mb * 1024 * 1024 if mb > 0 else None


# ---- the model catalog as Blender sees it ---------------------------------------------------

USER_MODELS_FILE = "user_models.json"

FAMILY_TITLES = {
    "ben2": "Background removal (BEN2)",
    "da3": "Depth (Depth Anything 3)",
    "moge2": "Geometry (MoGe-2)",
    "upscale": "Upscale",
}

# One Catalog per models folder, reloaded when user_models.json changes on disk. Tests replace
# ``get_catalog`` itself (callers look it up on this module, never ``from ... import`` it).
_catalog_cache = {"key": None, "catalog": None, "error": None}


def user_models_file(context=None) -> Path:
    return get_models_dir(context, create=False) / USER_MODELS_FILE


def _mtime_ns(path: Path):
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def get_catalog(context=None) -> Catalog:
    """The built-in models plus the user's registered ONNX files (from ``user_models.json``)."""
    store = user_models_file(context)
    key = (str(store), _mtime_ns(store))
    if _catalog_cache["key"] == key and _catalog_cache["catalog"] is not None:
        return _catalog_cache["catalog"]
    catalog = Catalog()
    error = None
    try:
        catalog.load_user_models(store)
    except LeanImageError as exc:  # a broken JSON must not hide the built-in models
        error = str(exc)
    _catalog_cache.update(key=key, catalog=catalog, error=error)
    return catalog


def catalog_load_error() -> str | None:
    """Why the saved user models could not be read (None when they could)."""
    return _catalog_cache["error"]


def save_user_catalog(catalog: Catalog, context=None) -> Path:
    """Persist the catalog's user models to ``user_models.json`` in the models folder."""
    store = get_models_dir(context, create=True) / USER_MODELS_FILE
    catalog.save_user_models(store)
    _catalog_cache.update(key=(str(store), _mtime_ns(store)), catalog=catalog, error=None)
    return store


# Display states of a catalog entry. USABLE ones count as installed for the panel's model menus
# (an unverified file is checked against its sha256 when it is first used or installed).
INSTALLED, UNVERIFIED, MISSING, PARTIAL, WRONG_SIZE, USER_FILE, USER_FILE_MISSING = (
    "installed",
    "unverified",
    "missing",
    "partial",
    "wrong_size",
    "user_file",
    "user_file_missing",
)
USABLE = frozenset({INSTALLED, UNVERIFIED, USER_FILE})


def model_status(entry, models_dir) -> str:
    """Installed state without hashing anything (this runs on every redraw): a stat, plus the
    installer's small sidecar when the catalog knows a sha256."""
    dest = installer.model_path(entry, models_dir)
    if entry.is_user:
        return USER_FILE if dest.is_file() else USER_FILE_MISSING
    try:
        st = dest.stat()
    except OSError:
        return PARTIAL if installer.part_path(entry, models_dir).is_file() else MISSING
    if entry.size_bytes is not None and st.st_size != entry.size_bytes:
        return WRONG_SIZE
    if entry.sha256 is None:
        return INSTALLED
    try:
        recorded = json.loads(installer.sidecar_path(entry, models_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return UNVERIFIED
    if (
        isinstance(recorded, dict)
        and recorded.get("sha256") == entry.sha256
        and recorded.get("size") == st.st_size
        and recorded.get("mtime_ns") == st.st_mtime_ns
    ):
        return INSTALLED
    return UNVERIFIED


def installed_entries(family: str, context=None) -> list:
    """Catalog entries of ``family`` whose file is there (catalog order: built-ins, then user's)."""
    models_dir = get_models_dir(context, create=False)
    return [e for e in get_catalog(context).entries(family) if model_status(e, models_dir) in USABLE]


def format_size(entry) -> str:
    if entry.size_bytes is not None:
        return format_bytes(entry.size_bytes)
    if entry.approx_size_bytes is not None:
        return "~" + format_bytes(entry.approx_size_bytes)
    return "size unknown"


def format_bytes(count) -> str:
    if count is None:
        return "?"
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= factor:
            return f"{count / factor:.1f} {unit}"
    return f"{count} B"


def wrapped_labels(layout, text: str, *, width: int = 90, icon: str = "NONE", alert: bool = False):
    """Labels do not wrap in Blender: split a long message over several rows."""
    col = layout.column(align=True)
    col.alert = alert
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)  # keep paths whole
    for i, line in enumerate(lines or [""]):
        col.label(text=line, icon=icon if i == 0 else "BLANK1" if icon != "NONE" else "NONE")
    return col


_STATUS_TEXT = {
    INSTALLED: ("Installed", "CHECKMARK"),
    UNVERIFIED: ("File present, checksum not verified yet (Install verifies it)", "QUESTION"),
    MISSING: ("Not installed", "NONE"),
    PARTIAL: ("Partial download (Install resumes it)", "SORTTIME"),
    WRONG_SIZE: ("File has the wrong size (damaged or another version)", "ERROR"),
    USER_FILE: ("Your file", "CHECKMARK"),
    USER_FILE_MISSING: ("Your file is missing", "ERROR"),
}


def draw_model_catalog(layout, context, prefs) -> None:
    """The catalog: every model with family, size, license and state, Install/Remove buttons,
    the running download's progress, and registration of the user's own ONNX files."""
    try:
        _draw_model_catalog(layout, context)
    except Exception as exc:  # a drawing bug must not take the whole preferences page with it
        traceback.print_exc()
        layout.label(text=f"Model list unavailable: {type(exc).__name__}: {exc}", icon="ERROR")


def _draw_model_catalog(layout, context) -> None:
    from ..operators import model_ops  # the download state lives with the install operator

    layout.separator()
    layout.label(text="Models", icon="FILE_3D")
    models_dir = get_models_dir(context, create=False)
    catalog = get_catalog(context)
    error = catalog_load_error()
    if error:
        wrapped_labels(layout, error, icon="ERROR", alert=True)
    download = model_ops.downloads.current
    last = model_ops.downloads.last
    busy = download is not None and not download.finished
    for family in FAMILIES:
        box = layout.box()
        box.label(text=FAMILY_TITLES[family])
        for entry in catalog.entries(family):
            _draw_entry(box, entry, models_dir, download if busy else None, last, busy)
    row = layout.row()
    row.operator_menu_enum(
        "lean_image_ai.register_user_model", "family", text="Register your own ONNX model", icon="FILEBROWSER"
    )


def _draw_entry(layout, entry, models_dir, download, last, busy) -> None:
    status = model_status(entry, models_dir)
    col = layout.column(align=True)
    row = col.row()
    row.label(text=entry.title)
    text, icon = _STATUS_TEXT[status]
    row.label(text=text, icon=icon)
    col.label(text=f"{entry.family}  |  {format_size(entry)}  |  license: {entry.license}")
    dest = installer.model_path(entry, models_dir)

    if download is not None and download.entry_id == entry.id:
        total = format_bytes(download.total) if download.total else "unknown size"
        row = col.row()
        row.progress(
            factor=download.fraction,
            type="BAR",
            text=f"{download.stage}: {format_bytes(download.done)} / {total}",
        )
        row.operator("lean_image_ai.cancel_download", text="Cancel", icon="CANCEL")
        return

    row = col.row()
    if entry.is_user:
        row.label(text=str(dest))
        op = row.operator("lean_image_ai.remove_model", text="Remove (keeps your file)", icon="X")
        op.model_id = entry.id
    else:
        if status != INSTALLED:
            if entry.url or status == UNVERIFIED:
                sub = row.row()
                sub.enabled = not busy  # one download at a time
                label = "Verify" if status == UNVERIFIED else "Install"
                op = sub.operator("lean_image_ai.install_model", text=label, icon="IMPORT")
                op.model_id = entry.id
            if not entry.url and status != UNVERIFIED:
                wrapped_labels(
                    col,
                    f"No download address: download it yourself into {models_dir} as "
                    f"{entry.filename}, or register your own ONNX.",
                    icon="INFO",
                )
        if status in (INSTALLED, UNVERIFIED, WRONG_SIZE, PARTIAL):
            op = row.operator("lean_image_ai.remove_model", text="Remove", icon="TRASH")
            op.model_id = entry.id
    if last is not None and last.entry_id == entry.id and last.state in ("failed", "cancelled"):
        wrapped_labels(col, last.error_text, icon="ERROR", alert=last.state == "failed")


class LeanImageAIPreferences(bpy.types.AddonPreferences):
    bl_idname = ADDON_ID

    models_dir: StringProperty(
        name="Models Folder",
        description="Where models are downloaded and looked up. Empty: the add-on's own user folder",
        subtype="DIR_PATH",
        default="",
    )
    device: EnumProperty(
        name="Device",
        description="Where models run. Only devices the installed onnxruntime offers are listed",
        items=device_items,
        default=0,  # AUTO (dynamic enums take the item number, not a string)
    )
    cuda_device_index: IntProperty(
        name="CUDA Device",
        description="Index of the NVIDIA GPU to use (0 is the first)",
        default=0,
        min=0,
        max=63,
    )
    gpu_memory_budget_mb: IntProperty(
        name="GPU Memory Budget (MB)",
        description="Cap on the inference arena's GPU memory, in MB. 0: no limit",
        default=0,
        min=0,
        soft_max=262144,
    )
    release_cpu_memory: BoolProperty(
        name="Release CPU Memory After Each Job",
        description="Give system memory (RAM) back after each job on the CPU too, not only GPU memory",
        default=True,
    )

    def draw(self, context):
        layout = self.layout
        col = layout.column()
        col.prop(self, "device")
        sub = col.column()
        sub.enabled = self.device == "CUDA"
        sub.prop(self, "cuda_device_index")
        col.prop(self, "gpu_memory_budget_mb")
        col.prop(self, "release_cpu_memory")
        col.label(text="onnxruntime providers: " + ", ".join(available_providers()))

        layout.separator()
        col = layout.column()
        col.prop(self, "models_dir")
        col.label(text=f"Models are stored in: {get_models_dir(context, create=False)}")

        # ---- HOOK: catalog model list (install/remove with progress) -- a later issue fills
        # ---- draw_model_catalog(); keep this call at the end of draw().
        draw_model_catalog(layout, context, self)


classes = (LeanImageAIPreferences,)
