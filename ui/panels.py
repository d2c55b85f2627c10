"""The "Lean Image AI" sidebar tab (N-panel) in the Image Editor and the 3D Viewport.

Both editors show the same panel, its "Memory" sub-panel and that one's "Details": the classes
differ only in ``bl_space_type`` and share one draw function each. Drawn as an artist reads it:
one box per task, titled once, with a labelled model menu, only the options that task's button
uses in the current mode, and a button that names the image it will work on, disabled with the
reason shown when it cannot run. Drawing never raises: a section that fails shows its error as
text instead.
"""

from pathlib import Path

import bpy

from ..models import families
from ..models.adapters import shot_depth
from ..operators import options, prefs, sources
from ..operators.jobs import manager
from . import panel_memory, preferences, runtime_probe
from . import settings as scene_settings
from .panel_memory import cached_memory_snapshot, invalidate_memory_snapshot  # noqa: F401 (the panel's API)

CATEGORY = "Lean Image AI"
ADDON_MODULE = __package__.rpartition(".")[0]  # "lean_image_ai", or "bl_ext.<repo>.lean_image_ai"

NO_IMAGE = {
    "IMAGE_EDITOR": "Open an image in this editor first",
    "VIEW_3D": "Select an object whose active Image Texture node has an image",
}
NO_FRAMES = "Give Frames From, or open an image sequence in the Image Editor"
NO_MODEL = "No model installed"


def _operator(layout, idname, *, text, icon, **props):
    """``layout.operator`` with its properties set; a property the operator lacks is shown as an
    error row instead of breaking the panel."""
    op = layout.operator(idname, text=text, icon=icon)
    if op is None:  # operator not registered (partial install)
        return None
    for name, value in props.items():
        try:
            setattr(op, name, value)
        except (AttributeError, TypeError, ValueError) as exc:
            layout.label(text=f"{idname}: cannot set {name}: {exc}", icon="ERROR")
    return op


# ---- main panel -----------------------------------------------------------------------------


def draw_main(layout, context) -> None:
    """Everything of the main panel: the four actions, the job, the device."""
    preferences.draw_safely(layout, "Actions", _draw_actions, context)
    preferences.draw_safely(layout, "Job status", _draw_job, context)
    preferences.draw_safely(layout, "Device", _draw_device, context)


def _job_busy() -> bool:
    return manager.running() is not None


def _onnxruntime_problem() -> str | None:
    """Asked once per session of a child process (ui/runtime_probe.py): an import that failed
    stays failed until Blender restarts; None while it has not answered."""
    return runtime_probe.onnxruntime_problem()


def _draw_actions(layout, context) -> None:
    s = scene_settings.get_settings(context)
    if s is None:
        layout.label(text="Scene settings are not available (add-on not fully registered).", icon="ERROR")
        return
    problem = _onnxruntime_problem()
    if problem:
        preferences.wrapped_labels(layout, problem, width=60, icon="ERROR", alert=True)
    col = layout.column()
    col.enabled = not _job_busy() and not problem  # one job at a time; the operator refuses a second one anyway
    box = col.box()  # the checkbox is the box's title
    box.prop(s, "use_sequence", icon="SEQUENCE")
    if s.use_sequence:
        for name in ("sequence_source", "sequence_frames", "sequence_output", "skip_existing"):
            box.prop(s, name)
    for family in families.ALL:
        _draw_family(col.box(), s, context, family)


def _draw_family(box, s, context, family) -> None:
    """One task: its title, its model menu, the options its button uses now, the button."""
    box.label(text=family.panel_heading, icon=family.icon)
    installed = scene_settings.compute_model_items(family.id, context)[0][0] != scene_settings.NONE_ID
    if installed:
        box.prop(s, f"{family.id}_model", text="Model")
    sequence = s.use_sequence
    if not sequence and not family.operator:  # a family without a single-image operator
        box.label(text="Works on image sequences: tick Sequence above.", icon="INFO")
        return
    # the sequence operators never read the options about Blender data (replace, plane, camera)
    values = {o.name: getattr(s, o.name) for o in family.options if not (sequence and o.blender_only)}
    for name in values:
        box.prop(s, name)
    shot = _draw_shot_options(box, s, family) if sequence else {}
    target, reason = _sequence_target(s, context) if sequence else _image_target(context)
    reason = (None if installed else NO_MODEL) or reason or _shot_problem(s, shot)
    model_id, model_path = scene_settings.selected_model(s, family.id, context)
    common = dict(model_id=model_id, model_path=model_path, **values, **shot)
    col = box.column(align=True)
    col.enabled = reason is None
    text = family.button_text(target or "…")
    _draw_buttons(col, s, context, family, text, common)
    if reason:
        _why_not(box, reason)


def _draw_buttons(col, s, context, family, text: str, common: dict) -> None:
    """The family's button: Process Sequence (and the shot's buttons) on a sequence, else its
    single-image operator."""
    if not s.use_sequence:
        _operator(col, options.operator_idname(family), text=text, icon=family.icon, **common)
        return
    source = _sequence_source(s, context)
    _operator(
        col, "lean_image_ai.process_sequence", text=text, icon=family.icon, family=family.id, **source,
        frames=s.sequence_frames, output=s.sequence_output, skip_existing=s.skip_existing, **common,
    )
    _shot_buttons(col, s, family, {**source, **common})


def _why_not(box, reason: str) -> None:
    row = box.row()
    row.label(text=reason, icon="INFO")
    if reason == NO_MODEL:
        _operator(row, "preferences.addon_show", text="Get Models", icon="PREFERENCES", module=ADDON_MODULE)


def _draw_shot_options(box, s, family) -> dict:
    """The shot options of this family's sequences (depth: range and alignment; geometry: the
    camera), drawn and returned as the operators take them."""
    shot = scene_settings.shot_values(s)
    names = []
    if "depth" in family.shot:
        box.prop(s, "depth_range")
        if s.depth_range == shot_depth.GIVEN:
            row = box.row(align=True)
            row.prop(s, "depth_black")
            row.prop(s, "depth_white")
        box.prop(s, "align_depth")
        names += ["depth_range", "align_depth"]
    if "camera" in family.shot:
        box.prop(s, "shot_camera")
        box.prop(s, "shot_fov")
        names += ["shot_camera", "shot_fov"]
    return {name: shot[name] for name in names}


def _shot_problem(s, shot: dict) -> str | None:
    if "depth_range" in shot and s.depth_range == shot_depth.GIVEN and s.depth_black >= s.depth_white:
        return "Black At must be nearer than White At"
    return None


def _shot_buttons(col, s, family, common) -> None:
    """Preview Frame (this frame, no file), and for MoGe-2 the shot as meshes under one camera."""
    row = col.row(align=True)
    _operator(row, "lean_image_ai.preview_frame", text="Preview Frame", icon="HIDE_OFF", family=family.id, **common)
    if "camera" in family.shot:
        _operator(row, "lean_image_ai.reconstruct_shot", text="Reconstruct Shot", icon="CAMERA_DATA", frames=s.sequence_frames, **common)


def _image_target(context) -> tuple[str | None, str | None]:
    """The name of the image a single-image button will use (the operator's own rule,
    operators/sources.py), or why there is none."""
    image = sources._editor_image(context) or sources._texture_node_image(context)
    if image is None:
        space = getattr(getattr(context, "space_data", None), "type", "")
        return None, NO_IMAGE.get(space, NO_IMAGE["VIEW_3D"])
    return image.name, None


def _sequence_target(s, context) -> tuple[str | None, str | None]:
    if s.sequence_source:
        return Path(s.sequence_source.rstrip("/\\")).name or s.sequence_source, None
    image = sources._editor_image(context)
    return (image.name, None) if image is not None else (None, NO_FRAMES)


def _sequence_source(settings, context) -> dict:
    if settings.sequence_source:
        return {"source": settings.sequence_source}
    image = sources._editor_image(context)
    return {"image_name": image.name} if image is not None else {}


_STATE_ICONS = {"finished": "CHECKMARK", "failed": "ERROR", "cancelled": "CANCEL", "running": "SORTTIME"}


def _draw_job(layout, context) -> None:
    box = layout.box()
    job = manager.current
    if job is not None and not job.done:
        box.label(text=f"Running: {job.name}", icon="SORTTIME")
        text = f"{job.stage} ({job.progress:.0%})"
        row = box.row()
        try:
            row.progress(factor=float(job.progress), type="BAR", text=text)
        except (AttributeError, TypeError):  # Blender before 4.0 has no progress widget
            row.label(text=text)
        _operator(row, "lean_image_ai.cancel_job", text="Cancel", icon="CANCEL")
    last = manager.last
    if last is not None:
        box.label(text=f"Last job: {last.name}: {last.state}", icon=_STATE_ICONS.get(last.state, "INFO"))
        if last.error_text:
            preferences.wrapped_labels(box, last.error_text, width=60, alert=last.state == "failed")
    elif job is None:
        box.label(text="No job has run yet.")


def _draw_device(layout, context) -> None:
    box = layout.box()
    box.label(text=f"Device setting: {prefs.device_string(prefs.get_prefs(context))}", icon="PREFERENCES")
    handles, names = panel_memory.loaded_sessions(), panel_memory.worker_models()
    if not handles and not names:
        box.label(text="No model loaded.")
    for name in names:
        box.label(text=f"{name}: in the model process")
    for handle in handles:
        box.label(text=f"{handle.model_name}: {handle.device_label}")
        if handle.fallback_warning:
            hinted = prefs.with_gpu_runtime_hint(handle.fallback_warning)
            preferences.wrapped_labels(box, hinted, width=60, icon="ERROR", alert=True)


# ---- classes ----------------------------------------------------------------------------------


class _MainPanel:
    bl_label = "Lean Image AI"
    bl_region_type = "UI"
    bl_category = CATEGORY

    def draw(self, context):
        draw_main(self.layout, context)


class _MemoryPanel:
    bl_label = "Memory"
    bl_region_type = "UI"
    bl_category = CATEGORY
    bl_options = {"DEFAULT_CLOSED"}

    def draw(self, context):
        panel_memory.draw_memory(self.layout, context)


class _DetailsPanel:
    bl_label = "Details"
    bl_region_type = "UI"
    bl_category = CATEGORY
    bl_options = {"DEFAULT_CLOSED"}

    def draw(self, context):
        panel_memory.draw_details(self.layout, context)


class LEAN_IMAGE_AI_PT_image_editor(_MainPanel, bpy.types.Panel):
    bl_idname = "LEAN_IMAGE_AI_PT_image_editor"
    bl_space_type = "IMAGE_EDITOR"


class LEAN_IMAGE_AI_PT_view3d(_MainPanel, bpy.types.Panel):
    bl_idname = "LEAN_IMAGE_AI_PT_view3d"
    bl_space_type = "VIEW_3D"


class LEAN_IMAGE_AI_PT_image_editor_memory(_MemoryPanel, bpy.types.Panel):
    bl_idname = "LEAN_IMAGE_AI_PT_image_editor_memory"
    bl_space_type = "IMAGE_EDITOR"
    bl_parent_id = LEAN_IMAGE_AI_PT_image_editor.bl_idname


class LEAN_IMAGE_AI_PT_view3d_memory(_MemoryPanel, bpy.types.Panel):
    bl_idname = "LEAN_IMAGE_AI_PT_view3d_memory"
    bl_space_type = "VIEW_3D"
    bl_parent_id = LEAN_IMAGE_AI_PT_view3d.bl_idname


class LEAN_IMAGE_AI_PT_image_editor_memory_details(_DetailsPanel, bpy.types.Panel):
    bl_idname = "LEAN_IMAGE_AI_PT_image_editor_memory_details"
    bl_space_type = "IMAGE_EDITOR"
    bl_parent_id = LEAN_IMAGE_AI_PT_image_editor_memory.bl_idname


class LEAN_IMAGE_AI_PT_view3d_memory_details(_DetailsPanel, bpy.types.Panel):
    bl_idname = "LEAN_IMAGE_AI_PT_view3d_memory_details"
    bl_space_type = "VIEW_3D"
    bl_parent_id = LEAN_IMAGE_AI_PT_view3d_memory.bl_idname


classes = (
    LEAN_IMAGE_AI_PT_image_editor,
    LEAN_IMAGE_AI_PT_view3d,
    LEAN_IMAGE_AI_PT_image_editor_memory,
    LEAN_IMAGE_AI_PT_view3d_memory,
    LEAN_IMAGE_AI_PT_image_editor_memory_details,
    LEAN_IMAGE_AI_PT_view3d_memory_details,
)
