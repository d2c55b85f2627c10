"""Add-on preferences: models folder, inference device, memory settings.

``bl_idname`` is the add-on's root package, which is ``lean_image_ai`` when imported from a
checkout and ``bl_ext.user_default.lean_image_ai`` when installed as an extension.
"""

# No ``from __future__ import annotations`` here: Blender reads the property annotations of the
# class below as objects at registration time.
import os
from dataclasses import dataclass
from pathlib import Path

import bpy
from bpy.props import BoolProperty, EnumProperty, IntProperty, StringProperty

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


def draw_model_catalog(layout, context, prefs) -> None:
    """HOOK (models UI, to be filled in by a later issue): draw the catalog model list here,
    one row per model with install/remove buttons and download progress. Draws nothing yet."""


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
