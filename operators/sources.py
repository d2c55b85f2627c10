"""Where a model operator's image comes from and where its result goes (bpy, main thread).

The source: the ``filepath`` property, else the Image Editor's image, else the active Image
Texture node of the active object's active material. The output: ``output_path`` with its format
from the suffix, checked before any model runs.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bpy

from ..runtime.errors import InvalidImageError, LeanImageError
from . import image_io

OUTPUT_FORMATS = {
    ".png": "PNG",
    ".exr": "OPEN_EXR",
    ".jpg": "JPEG",
    ".jpeg": "JPEG",
    ".tif": "TIFF",
    ".tiff": "TIFF",
}

_IMAGE_SUFFIXES = {
    *OUTPUT_FORMATS,
    ".bmp",
    ".tga",
    ".hdr",
    ".webp",
    ".dpx",
    ".cin",
    ".jp2",
    ".j2c",
    ".sgi",
    ".rgb",
}

NO_SOURCE_MESSAGE = (
    "No image to work on. Open an image in the Image Editor, select an Image Texture node, or give filepath."
)


@dataclass
class Source:
    image: object  # bpy.types.Image
    loaded: bool  # loaded from `filepath` for this job (remove it again if the job fails)
    stem: str  # base for result names: the image name without an image-file suffix


def image_stem(image) -> str:
    name = image.name
    root, ext = os.path.splitext(name)
    return root if root and ext.lower() in _IMAGE_SUFFIXES else name


def _editor_image(context):
    space = getattr(context, "space_data", None)
    if space is not None and getattr(space, "type", "") == "IMAGE_EDITOR":
        return getattr(space, "image", None)
    return None


def _texture_node_image(context):
    obj = getattr(context, "active_object", None)
    material = getattr(obj, "active_material", None) if obj is not None else None
    tree = getattr(material, "node_tree", None) if material is not None else None
    node = tree.nodes.active if tree is not None else None
    if node is not None and node.type == "TEX_IMAGE":
        return node.image
    return None


def resolve_source(context, filepath: str) -> Source:
    """The image the operator works on (see module doc); InvalidImageError when there is none."""
    if filepath:
        path = bpy.path.abspath(filepath)
        before = set(bpy.data.images)
        image = image_io.load_image_file(path, check_existing=True)
        return Source(image, image not in before, image_stem(image))
    image = _editor_image(context) or _texture_node_image(context)
    if image is None:
        raise InvalidImageError(NO_SOURCE_MESSAGE)
    return Source(image, False, image_stem(image))


def remove_image_later(image) -> Callable[[], None]:
    """A discard callback that removes ``image`` if it still exists."""

    def remove():
        try:
            bpy.data.images.remove(image)
        except ReferenceError:
            pass

    return remove


def output_target(output_path: str) -> tuple[Path, str] | None:
    """(absolute path, Blender file format) for ``output_path``; checked before any model runs."""
    if not output_path:
        return None
    path = Path(bpy.path.abspath(output_path)).expanduser()
    file_format = OUTPUT_FORMATS.get(path.suffix.lower())
    if file_format is None:
        raise LeanImageError(
            f"Cannot save to '{path}': unknown image format '{path.suffix or '(no suffix)'}'. "
            "Use .png, .exr, .jpg or .tif."
        )
    if path.is_dir():
        raise LeanImageError(f"Cannot save to '{path}': it is a folder, not a file name.")
    if not path.parent.is_dir():
        raise LeanImageError(f"Cannot save to '{path}': the folder '{path.parent}' does not exist.")
    return path, file_format
