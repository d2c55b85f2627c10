"""The shot options in Blender (bpy): one depth range and aligned depth for a depth sequence, one
camera for a MoGe-2 sequence. The same properties on Process Sequence, Preview Frame and the
scene settings (functions: Blender needs a fresh definition per class); the maths is
models/adapters/shot_depth.py and models/adapters/shot_camera.py, the two passes models/batch/runner.py."""

from bpy.props import BoolProperty, EnumProperty, FloatProperty, StringProperty

from ..models.adapters import shot_camera, shot_depth
from ..models.batch.shot_batch import ShotSettings
from ..models.job_spec import ShotOptions


def shot_properties() -> dict:
    return {
        "depth_range": StringProperty(
            name="Depth Range",
            description="How depth maps to 0..1 in 8/16-bit files: per-frame (each frame's own min..max), "
            "auto-shot (a first pass finds one range for the whole shot, so a still wall keeps its grey), "
            "or A:B (given)",
            default=shot_depth.PER_FRAME,
        ),
        "align_depth": BoolProperty(
            name="Align Depth",
            description="Align each frame's depth to the previous one (robust scale and shift on the pixels "
            "that agree), so a still background keeps its value",
        ),
        "shot_camera": EnumProperty(
            name="Camera",
            description="The lens of the meshes' camera: fitted on each frame, or one for the whole shot "
            "(a steady field of view, for a shot filmed without zooming)",
            items=[
                (shot_camera.PER_FRAME, "Per Frame", "Each frame fits its own focal length"),
                (shot_camera.SHOT, "One for the Shot", "A first pass fits one focal length (median over the frames)"),
            ],
            default=shot_camera.PER_FRAME,
        ),
        "shot_fov": FloatProperty(
            name="Field of View",
            description="Fix the horizontal field of view for every frame (degrees); 0: fitted",
            default=0.0,
            min=0.0,
            max=170.0,
        ),
    }


NAMES = tuple(shot_properties())


def options_of(owner) -> ShotOptions:
    """The shot options an operator holds, as a job carries them (models/job_spec.py)."""
    return ShotOptions(depth_range=owner.depth_range, align_depth=owner.align_depth, camera=owner.shot_camera,
                       fov=owner.shot_fov or None)


def settings_of(owner, family_id: str, shard=None) -> ShotSettings:
    """The shot settings an operator (or the scene settings) holds."""
    return ShotSettings(
        family_id,
        depth_range=owner.depth_range,
        align_depth=owner.align_depth,
        camera=owner.shot_camera,
        fov=owner.shot_fov or None,
        shard=shard,
        skip_existing=bool(getattr(owner, "skip_existing", False)),
    )
