"""Add-on preferences: models folder, inference device, memory settings, and the model list
(drawn from the model library, models/store/library.py; operators read the values via operators/prefs.py).

``bl_idname`` is the add-on's root package, which is ``lean_image_ai`` when imported from a
checkout and ``bl_ext.user_default.lean_image_ai`` when installed as an extension.
"""

# No ``from __future__ import annotations`` here: Blender reads the property annotations of the
# class below as objects at registration time.
import textwrap
import traceback

import bpy
from bpy.props import BoolProperty, EnumProperty, FloatProperty, IntProperty, StringProperty

from ..models import families
from ..models.family import command_of
from ..models.store import installer, library
from ..operators import gpu_ops
from ..operators.gpu_ops import JOB_KEY as GPU_JOB_KEY
from ..operators.jobs import downloads
from ..operators.prefs import (
    ADDON_ID,
    gpu_requirements,
    gpu_runtime_folder,
    gpu_runtime_size_text,
    models_folder,
    release_rule_lines,
)
from ..runtime.cuda import gpu_libraries  # never gpu_loading: only the model worker loads the libraries
from ..runtime.providers import AUTO_ENUM_NUMBER, DEVICE_BY_KIND, DEVICES, UNLOAD, describe_providers
from ..runtime.settings import MAX_BUDGET_MB, MAX_RELEASE_DELAY_S
from . import runtime_probe


# The numbers are what Blender stores, so they must never change (a dynamic enum is saved as int).
def _device_choices() -> tuple:
    """The device menu from the runtime's device table: (identifier, label, tooltip, provider or
    None when always offered, stable enum number), AUTO first, then by enum number."""
    ranked = sorted((d for d in DEVICES if d.auto_rank is not None), key=lambda d: d.auto_rank)
    auto_text = f"Best available: {', then '.join(d.label for d in ranked)}, else CPU"
    rows = [(d.kind.upper(), d.menu_label, d.menu_text, None if d.host else d.provider, d.enum_number)
            for d in sorted(DEVICES, key=lambda d: d.enum_number)]  # fmt: skip
    return (("AUTO", "Auto", auto_text, None, AUTO_ENUM_NUMBER), *rows)


DEVICE_CHOICES = _device_choices()

# Blender requires the strings of dynamic enum items to stay alive while the enum is used:
# the items list returned by the callback is kept in this module-level variable.
_device_items: list[tuple[str, str, str, str, int]] = []


_offered: list[str] = []


def offered_providers() -> list[str]:
    """The providers that can run here (runtime's runnable_providers: onnxruntime-gpu's CUDA and
    TensorRT only where the driver sees an NVIDIA GPU), asked once of a child process
    (ui/runtime_probe.py): CPU only until it has answered, then its answer, kept."""
    if not _offered:
        if runtime_probe.answer() is None:
            return runtime_probe.runnable()
        _offered.extend(runtime_probe.runnable())
    return _offered


def _draw_device_preferences(col, prefs, offered: list[str], *, index: bool) -> None:
    """The preferences the rows of the devices that can run here name (providers.py): each one's
    GPU index (enabled only where that device is the choice), or what shapes its options (enabled
    for its own choice, or AUTO's)."""
    for row in (d for d in DEVICES if d.provider in offered and not d.host):
        for name in (row.index_preference,) if index else row.preferences:
            if name:
                sub = col.column()
                sub.enabled = prefs.device == row.kind.upper() or (not index and prefs.device == "AUTO")
                sub.prop(prefs, name)


def _forget_guesses() -> None:
    """The probe answered: the menu and the list built on "CPU only" are made again."""
    _offered.clear()
    _device_items.clear()


def compute_device_items(providers: list[str] | None = None) -> list[tuple[str, str, str, str, int]]:
    """Enum items for what can run here: always AUTO and CPU, plus the GPU providers that can."""
    providers = offered_providers() if providers is None else providers
    return [
        (ident, label, desc, "", number)
        for ident, label, desc, provider, number in DEVICE_CHOICES
        if provider is None or provider in providers
    ]


def device_items(_self=None, _context=None):
    """Items callback of ``LeanImageAIPreferences.device`` (computed once, then cached)."""
    if not _device_items:
        if runtime_probe.answer() is None:  # a guess, not kept: built again once the child answers
            return compute_device_items()
        _device_items.extend(compute_device_items())
    return _device_items


def wrapped_labels(layout, text: str, *, width: int = 90, icon: str = "NONE", alert: bool = False):
    """Labels do not wrap in Blender: split a long message over several rows."""
    col = layout.column(align=True)
    col.alert = alert
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)  # keep paths whole
    for i, line in enumerate(lines or [""]):
        col.label(text=line, icon=icon if i == 0 else "BLANK1" if icon != "NONE" else "NONE")
    return col


_STATUS_TEXT = {
    library.INSTALLED: ("Installed", "CHECKMARK"),
    library.UNVERIFIED: ("File present, checksum not verified yet (Install verifies it)", "QUESTION"),
    library.MISSING: ("Not installed", "NONE"),
    library.PARTIAL: ("Partial download (Install resumes it)", "SORTTIME"),
    library.WRONG_SIZE: ("File has the wrong size (damaged or another version)", "ERROR"),
    library.USER_FILE: ("Your file", "CHECKMARK"),
    library.USER_FILE_MISSING: ("Your file is missing", "ERROR"),
}


def draw_safely(layout, title: str, draw, *args) -> None:
    """``draw(layout, *args)``; a drawing bug shows as one line instead of taking the whole page
    (or panel) with it."""
    try:
        draw(layout, *args)
    except Exception as exc:
        traceback.print_exc()
        layout.label(text=f"{title} unavailable: {type(exc).__name__}: {exc}", icon="ERROR")


def draw_model_catalog(layout, context) -> None:
    """The catalog: every model with family, size, license and state, Install/Remove buttons,
    the running download's progress, and registration of the user's own ONNX files."""
    draw_safely(layout, "Model list", _draw_model_catalog, context)


def _draw_model_catalog(layout, context) -> None:
    layout.separator()
    layout.label(text="Models", icon="FILE_3D")
    folder = models_folder(context)
    catalog = library.catalog(folder)
    error = library.catalog_error(folder)
    if error:
        wrapped_labels(layout, error, icon="ERROR", alert=True)
    download = downloads.running()
    for family in families.ALL:
        box = layout.box()
        box.label(text=family.title)
        for entry in catalog.entries(family.id):
            _draw_entry(box, entry, folder, download)
    row = layout.row()
    row.operator_menu_enum(
        "lean_image_ai.register_user_model", "family", text="Register your own ONNX model", icon="FILEBROWSER"
    )


def _draw_entry(layout, entry, folder, download) -> None:
    status = library.status(entry, folder)
    col = layout.column(align=True)
    row = col.row()
    row.label(text=entry.title)
    text, icon = _STATUS_TEXT[status]
    row.label(text=text, icon=icon)
    col.label(text=f"{command_of(entry.family)}  |  {library.format_size(entry)}  |  license: {entry.license}")
    dest = installer.model_path(entry, folder)
    trust = installer.trust_note(entry, folder) if status == library.INSTALLED else None
    if trust:
        wrapped_labels(col, f"No catalog checksum: {trust}.", icon="INFO")

    if download is not None and download.key == entry.id:
        row = col.row()
        row.progress(factor=download.progress, type="BAR", text=download.stage)
        row.operator("lean_image_ai.cancel_download", text="Cancel", icon="CANCEL")
        return

    row = col.row()
    if entry.is_user:
        row.label(text=str(dest))
        op = row.operator("lean_image_ai.remove_model", text="Remove (keeps your file)", icon="X")
        op.model_id = entry.id
    else:
        _draw_catalog_buttons(row, col, entry, status, folder, download)
    _draw_last_failure(col, entry.id)


def _draw_catalog_buttons(row, col, entry, status, folder, download) -> None:
    """Install or Verify (or why there is nothing to install), and Remove, for a catalog model."""
    if status != library.INSTALLED:
        if entry.url or status == library.UNVERIFIED:
            sub = row.row()
            sub.enabled = download is None  # one download at a time
            label = "Verify" if status == library.UNVERIFIED else "Install"
            op = sub.operator("lean_image_ai.install_model", text=label, icon="IMPORT")
            op.model_id = entry.id
        if not entry.url and status != library.UNVERIFIED:
            wrapped_labels(
                col,
                f"No download address: download it yourself into {folder} as "
                f"{entry.filename}, or register your own ONNX.",
                icon="INFO",
            )
    if status in (library.INSTALLED, library.UNVERIFIED, library.WRONG_SIZE, library.PARTIAL):
        op = row.operator("lean_image_ai.remove_model", text="Remove", icon="TRASH")
        op.model_id = entry.id


def _draw_last_failure(layout, key: str) -> None:
    """The last download of ``key``, when it failed or was cancelled: what happened."""
    last = downloads.last
    if last is not None and last.key == key and last.state in ("failed", "cancelled"):
        wrapped_labels(layout, last.error_text, icon="ERROR", alert=last.state == "failed")


def draw_gpu_runtime(layout, context) -> None:
    """NVIDIA's CUDA/cuDNN libraries: installed or not, the download size, Install/Remove, and the
    install's progress with Cancel (drawn from the download lane, like the model list)."""
    draw_safely(layout, "GPU runtime box", _draw_gpu_runtime, context)


def _draw_gpu_runtime(layout, context) -> None:
    requirements = gpu_requirements()
    if requirements is None:
        return  # no CUDA build for this platform / Python (macOS): nothing to offer
    box = layout.box()
    box.label(text="GPU Runtime (NVIDIA CUDA 13 + cuDNN 9)", icon="MEMORY")
    folder = gpu_runtime_folder()
    version = gpu_libraries.installed_version(folder)
    if version:
        _draw_gpu_installed(box, folder, version, requirements)
    else:
        size = gpu_runtime_size_text()
        box.label(text="Not installed: models run on the CPU (needed for the CUDA device).", icon="NONE")
        box.label(text=f"Download: {size or 'size unknown'}, into {folder}")
    _draw_gpu_buttons(box, folder, version, requirements)
    _draw_last_failure(box, GPU_JOB_KEY)


def _draw_gpu_installed(box, folder, version: str, requirements) -> None:
    box.label(text=f"Installed: {version}", icon="CHECKMARK")
    wrapped_labels(box, f"Folder: {folder}")
    if not gpu_libraries.is_current(folder, requirements):
        box.label(text="This add-on version pins other library versions: Install updates them.", icon="INFO")


def _draw_gpu_buttons(box, folder, version, requirements) -> None:
    """The install's progress with Cancel, else Install or Update, and Remove."""
    job = downloads.running()
    row = box.row()
    if job is not None and job.key == GPU_JOB_KEY:
        row.progress(factor=job.progress, type="BAR", text=job.stage)
        row.operator("lean_image_ai.cancel_download", text="Cancel", icon="CANCEL")
    else:
        sub = row.row()
        sub.enabled = job is None  # one download at a time
        label = "Update" if version and not gpu_libraries.is_current(folder, requirements) else "Install"
        if not version or label == "Update":
            sub.operator("lean_image_ai.install_gpu_runtime", text=label, icon="IMPORT")
        if version:
            row.operator("lean_image_ai.remove_gpu_runtime", text="Remove", icon="TRASH")


def draw_doctor(layout) -> None:
    """The doctor's box: its button, and its last report (what the command line's prints)."""
    draw_safely(layout, "Doctor", _draw_doctor)


def _draw_doctor(layout) -> None:
    box = layout.box()
    row = box.row()
    row.label(text="Doctor: which onnxruntime, GPUs, CUDA/cuDNN libraries, what a session gets", icon="INFO")
    sub = row.row()
    sub.enabled = not gpu_ops.doctor_running()
    sub.operator("lean_image_ai.run_doctor", text="Run Doctor", icon="VIEWZOOM")
    run = gpu_ops.doctor["run"]
    if run is None:
        return
    if run.running:
        box.label(text="Running python -m lean_image_ai doctor...", icon="SORTTIME")
        return
    col = box.column(align=True)
    col.alert = not run.ok
    for line in run.text.splitlines():
        wrapped_labels(col, line, width=110)
    box.label(text=f"Also in the Text Editor: {gpu_ops.DOCTOR_TEXT}")


class LeanImageAIPreferences(bpy.types.AddonPreferences):
    bl_idname = ADDON_ID

    models_dir: StringProperty(
        name="Models Folder",
        description="Where models are downloaded and looked up. Empty: the per-user folder the command line "
        "shares (kept when the add-on is updated or uninstalled), unless LEAN_IMAGE_AI_MODELS_DIR is set",
        subtype="DIR_PATH",
        default="",
    )
    device: EnumProperty(
        name="Device",
        description="Where models run. Only devices that can run here are listed (CUDA: where an NVIDIA GPU is found)",
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
        name="GPU Memory Budget (MiB)",
        description="Most GPU memory this process may use for a job, in MiB (NVML's figure), checked before "
        "each job: arenas are released, least-recently-used models unloaded, tiles made smaller, or the job "
        "refused with what it needs. Also caps the inference arena. 0: no limit",
        default=0,
        min=0,
        max=MAX_BUDGET_MB,
        soft_max=262144,
    )
    ram_budget_mb: IntProperty(
        name="RAM Budget (MiB)",
        description="Most system memory Blender may use (its RSS) for a job on the CPU, in MiB, checked before "
        "each job like the GPU budget. 0: no limit (only the memory the system has free)",
        default=0,
        min=0,
        max=MAX_BUDGET_MB,
        soft_max=1048576,
    )
    idle_unload_minutes: IntProperty(
        name="Unload Models Idle For (min)",
        description="Unload a model (its weights too) after this many minutes unused. 0: keep them loaded",
        default=0,
        min=0,
        soft_max=240,
    )
    cudnn_max_workspace: BoolProperty(
        name="Fastest GPU Convolutions (Uses More VRAM)",
        description=(
            "Let cuDNN size its convolution workspace from free GPU memory (up to about 90% of it, "
            "outside the budget) for each new tile shape. Faster on some models; Blender may run out of VRAM"
        ),
        default=False,
    )
    release_cpu_memory: BoolProperty(
        name="Release CPU Memory After Each Job",
        description="Give system memory (RAM) back after each job on the CPU too, not only GPU memory",
        default=True,
    )
    keep_models_loaded_on_dml_coreml: BoolProperty(
        name="Keep Models Loaded on DirectML/CoreML",
        description="DirectML and CoreML have no memory pool the add-on can empty, so it unloads a job's "
        "models when the job ends and the next job loads them again (seconds for large models). On: models "
        "stay loaded between jobs (faster); their GPU memory is not given back to Blender until you unload them",
        default=False,
    )
    coreml_compute_units: EnumProperty(
        name="CoreML Compute Units",
        description="Which Apple silicon units CoreML may use",
        items=(
            ("ALL", "All", "CPU, GPU and Neural Engine: CoreML chooses"),
            ("CPUAndGPU", "CPU and GPU", "Leave the Neural Engine out"),
            ("CPUAndNeuralEngine", "CPU and Neural Engine", "Leave the GPU to Blender"),
        ),
        default="ALL",
    )
    ram_release_delay_s: FloatProperty(
        name="Give RAM Back After (s)",
        description="Seconds without a job before system memory goes back, so jobs run one after another "
        "(a script's loop) reuse it instead of paging it in again. 0: at the end of each job. GPU memory "
        "always goes back at the end of each job",
        default=0.0,
        min=0.0,
        max=MAX_RELEASE_DELAY_S,  # the limits RuntimeSettings checks (runtime/settings.py)
        soft_max=60.0,
        step=50,
        precision=1,
    )

    def draw(self, context):
        layout = self.layout
        col = layout.column()
        col.prop(self, "device")
        offered = offered_providers()
        _draw_device_preferences(col, self, offered, index=True)
        col.prop(self, "gpu_memory_budget_mb")
        col.prop(self, "ram_budget_mb")
        _draw_device_preferences(col, self, offered, index=False)
        sub = col.column()
        # the devices whose release rule unloads (DirectML, CoreML), or AUTO that may pick one
        chosen = DEVICE_BY_KIND.get(self.device.lower())
        sub.enabled = chosen is None or chosen.release == UNLOAD
        sub.prop(self, "keep_models_loaded_on_dml_coreml")
        col.prop(self, "release_cpu_memory")
        sub = col.column()
        sub.enabled = self.release_cpu_memory
        sub.prop(self, "ram_release_delay_s")
        col.prop(self, "idle_unload_minutes")
        problem = runtime_probe.onnxruntime_problem()
        if runtime_probe.answer() is None:
            col.label(text="Checking which devices can run here...", icon="SORTTIME")
        elif problem:  # the line already says what to do (install the zip built for this Blender)
            wrapped_labels(col, problem, icon="ERROR", alert=True)
        else:
            col.label(text="Can run on: " + ", ".join(describe_providers([p]) for p in offered))
            unused = [p for p in runtime_probe.installed() if p not in offered]
            if unused:
                names = ", ".join(describe_providers([p]) for p in unused)
                wrapped_labels(col, f"No NVIDIA GPU found, so {names} cannot run here.")
            for line in release_rule_lines(self, offered):
                wrapped_labels(col, line)
        draw_gpu_runtime(layout, context)
        draw_doctor(layout)

        layout.separator()
        col = layout.column()
        col.prop(self, "models_dir")
        folder = models_folder(context)
        shared = " (shared with the command line; kept on uninstall)" if folder == library.shared_models_dir() else ""
        col.label(text=f"Models are stored in: {folder}{shared}")
        draw_model_catalog(layout, context)


classes = (LeanImageAIPreferences,)


def post_register():
    runtime_probe.on_answer.append(_forget_guesses)


def pre_unregister():
    # the timer Blender holds would keep this module, and bpy, alive after an uninstall
    runtime_probe.forget()
    if _forget_guesses in runtime_probe.on_answer:
        runtime_probe.on_answer.remove(_forget_guesses)
