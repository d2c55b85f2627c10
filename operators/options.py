"""The job options an artist can set, defined once: the operators take them as properties and the
scene settings (the N-panel's defaults, ui/settings.py) hold the same properties.

Functions, not shared objects: Blender needs a fresh property definition per class.
"""

from bpy.props import BoolProperty, FloatProperty, IntProperty


def replace():
    return BoolProperty(
        name="Replace",
        description="Write the cut-out into the source image instead of a new image",
        default=False,
    )


def make_plane():
    return BoolProperty(
        name="Make Plane",
        description="Also add a plane with the image's aspect, displaced by the depth map",
        default=False,
    )


def resolution_level():
    return IntProperty(
        name="Resolution Level",
        description="Detail the model works at: 0 fastest, 9 finest",
        default=9,
        min=0,
        max=9,
    )


def make_camera():
    return BoolProperty(
        name="Make Camera",
        description="Add a camera at the origin whose field of view matches the photo, and make it the scene camera",
        default=True,
    )


def discontinuity():
    return FloatProperty(
        name="Discontinuity",
        description="Relative depth jump above which no face joins neighbouring pixels (0.04 = 4%)",
        default=0.04,
        min=0.0,
        soft_max=1.0,
    )


def tile_size():
    return IntProperty(
        name="Tile Size",
        description="Side of the tiles the image is cut into, in pixels. 0: from the free memory",
        default=0,
        min=0,
        soft_max=2048,
    )


# Per operator: the options the N-panel shows and passes on (family, label, icon, operator id, options)
PANEL_BUTTONS = (
    ("ben2", "Remove Background", "IMAGE_RGB_ALPHA", "lean_image_ai.remove_background", ("replace",)),
    ("da3", "Estimate Depth", "IMAGE_ZDEPTH", "lean_image_ai.estimate_depth", ("make_plane",)),
    (
        "moge2",
        "Reconstruct Geometry",
        "MESH_GRID",
        "lean_image_ai.reconstruct_geometry",
        ("resolution_level", "discontinuity", "make_camera"),
    ),
    ("upscale", "Upscale", "FULLSCREEN_ENTER", "lean_image_ai.upscale", ("tile_size",)),
)
