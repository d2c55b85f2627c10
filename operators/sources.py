"""Where a model operator's image comes from and where its result goes (bpy, main thread).

The source: the ``filepath`` property, else the Image Editor's image, else the active Image
Texture node of the active object's active material; a sequence's frame, read by Blender
over several calls (:func:`frame_read`). The output: ``output_path`` with its format
from the suffix, checked before any model runs.
"""

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bpy
import numpy as np

from ..models import colour, file_bytes, file_formats, image_meta
from ..models.batch.frame_lists import FrameRef
from ..models.outputs import OutputPolicy
from ..runtime.errors import InvalidImageError, LeanImageError, user_path
from . import image_io

NO_SOURCE_MESSAGE = (
    "No image to work on. Open an image in the Image Editor, select an Image Texture node, or give filepath."
)


@dataclass
class Source:
    image: object  # bpy.types.Image
    loaded: bool  # loaded from `filepath` for this job (remove it again if the job fails)
    stem: str  # base for result names: the image name without an image-file suffix


def image_stem(image) -> str:
    """The base for result names: the datablock name without Blender's duplicate number (``.001``)
    and without an image-file suffix (``frame_0001.png.001`` -> ``frame_0001``)."""
    name = re.sub(r"\.\d{3,}$", "", image.name) or image.name
    root, ext = os.path.splitext(name)
    return root if root and ext.lower() in file_formats.IMAGE_SUFFIXES else name


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


def shown_image(context):
    """The Image Editor's image, else the active Image Texture node's (None: neither)."""
    return _editor_image(context) or _texture_node_image(context)


SEQUENCE_HINT = "to process every frame use Process Sequence (lean_image_ai.process_sequence) or the command line"


def absolute_path(text: str) -> Path:
    """A path as an artist or a script writes it: ``//`` (the .blend's folder), ``~``, or relative
    to the working directory."""
    path = user_path(bpy.path.abspath(text))
    return path if path.is_absolute() else Path.cwd() / path


def blend_path(path) -> str:
    """How the .blend stores ``path``: ``//``-relative when the .blend is saved and Relative Paths
    is on (moving the project folder keeps it), else absolute (also on another Windows drive)."""
    path = os.fspath(path)
    preferences = getattr(bpy.context, "preferences", None)
    relative = getattr(getattr(preferences, "filepaths", None), "use_relative_paths", True)
    if not (bpy.data.filepath and relative):
        return path
    try:
        return bpy.path.relpath(path)
    except ValueError:
        return path


def store_relative(image):
    """``image`` (just loaded by the add-on) with its path stored as :func:`blend_path` says;
    no reload: the pixels stay."""
    path = image.filepath_raw
    if path and not path.startswith("//"):
        image.filepath_raw = blend_path(path)
    return image


def _loaded(image) -> Source:
    return Source(store_relative(image), True, image_stem(image))


def resolve_source(context, filepath: str) -> Source:
    """The image the operator works on (see module doc); InvalidImageError when there is none.
    An image sequence gives the frame at the scene's current frame (else its own file)."""
    if filepath:
        path = absolute_path(filepath)
        if path.is_dir():
            raise InvalidImageError(f"'{path}' is a folder, not an image file; {SEQUENCE_HINT}.")
        before = set(bpy.data.images)
        image = image_io.load_image_file(path, check_existing=True)
        return _loaded(image) if image not in before else Source(image, False, image_stem(image))
    image = shown_image(context)
    if image is None:
        raise InvalidImageError(NO_SOURCE_MESSAGE)
    if image.source == "SEQUENCE":
        return _sequence_frame(context, image)
    return Source(image, False, image_stem(image))


def _sequence_frame(context, image) -> Source:
    from ..models.batch import frame_lists

    path = absolute_path(image.filepath_raw or image.filepath)
    numbered = frame_lists.pattern_of(path)
    frame = getattr(getattr(context, "scene", None), "frame_current", None)
    if numbered is not None and frame is not None and frame_lists.frame_path(numbered[0], frame).is_file():
        path = frame_lists.frame_path(numbered[0], frame)
    before = set(bpy.data.images)
    loaded = image_io.load_image_file(path, check_existing=False)
    return _loaded(loaded) if loaded not in before else Source(loaded, False, image_stem(loaded))


def remove_image_later(image) -> Callable[[], None]:
    """A discard callback that removes ``image`` if it still exists."""

    def remove():
        try:
            bpy.data.images.remove(image)
        except ReferenceError:
            pass

    return remove


def _kind(image) -> str:
    """"float", "16-bit" or "8-bit": Blender keeps 16-bit PNG/TIFF in float buffers too, so the
    file format tells float files apart."""
    if image.file_format in file_formats.BLENDER_FLOAT_FILES:
        return "float"
    return "16-bit" if image.is_float else "8-bit"


def as_kind(rgba, kind: str):
    """Model values as the source's sample type, so results are written with the source's bits
    (models/outputs.py): 8-bit frames come back exactly as stored."""
    if kind == "float":
        return rgba
    top = 255.0 if kind == "8-bit" else 65535.0
    return (np.clip(rgba, 0.0, 1.0) * top + 0.5).astype(np.uint8 if kind == "8-bit" else np.uint16)


def input_kind(ref: FrameRef) -> str:
    """Main thread: the kind of the first frame's samples (the output type follows it), from its
    header where that tells it (a 4K EXR's decode is a second), else from Blender's load."""
    if not ref.path.is_file():
        return "8-bit"
    told = image_meta.header_kind(ref.path)
    if told is not None:
        return told
    before = set(bpy.data.images)
    image = image_io.load_image_file(str(ref.path), check_existing=False)
    try:
        return _kind(image)
    finally:
        if image not in before:
            bpy.data.images.remove(image)


def frame_read(ref: FrameRef, warn=None) -> file_bytes.ReadSteps:
    """Main thread: the frame's pixels as models take them, in the source's sample type, turned
    upright as its EXIF orientation says (as the command line reads it: Blender itself does not),
    read over several calls (models/file_bytes/read_steps.py): Blender's load and decode, its pixels
    taken (the datablock removed in that call), the conversion a band a call. A multi-page TIFF
    gives its first page and a warning."""
    before = set(bpy.data.images)

    def let_go(image) -> None:
        if image not in before:
            bpy.data.images.remove(image)

    def take(image):
        try:
            rgba, info = image_io.read_image(image)
            kind = _kind(image)
        finally:
            let_go(image)

        def convert(band):
            return as_kind(colour.to_model_rgb(band, info.is_linear, premultiplied=info.premultiplied), kind)

        return rgba, convert, {"float": np.float32, "16-bit": np.uint16}.get(kind, np.uint8)

    def finish(pixels):
        if warn is not None and ref.path.suffix.lower() in (".tif", ".tiff") and (pages := image_meta.tiff_pages(ref.path)) > 1:
            warn(f"{ref.path.name} has {pages} pages; the first (the main image by TIFF convention) was used.")
        return image_meta.upright(pixels, image_meta.exif_orientation(ref.path))

    return file_bytes.ReadSteps(lambda: image_io.load_image_file(str(ref.path), check_existing=False), take, finish,
                                let_go)


def read_frame(ref: FrameRef, warn=None):
    """:func:`frame_read` in one call (a frame Blender's main thread reads whole)."""
    return frame_read(ref, warn).finish_now()


def output_target(output_path: str, *, family_id: str, source_file: str = "", overwrite: bool = False):
    """(absolute path, Blender file format) for ``output_path``, or None; every check that can
    fail is made here, before any model runs (models/outputs.py's policy for the family)."""
    if not output_path:
        return None
    path = absolute_path(output_path)
    if path.is_dir():
        raise LeanImageError(f"Cannot save to '{path}': it is a folder, not a file name.")
    row = file_formats.find(path.suffix)
    file_format = row.blender_format if row is not None and row.image else ""
    if not file_format:
        raise LeanImageError(
            f"Cannot save to '{path}': unknown image format '{path.suffix or '(no suffix)'}'. "
            f"Use {file_formats.BLENDER_WRITER.advice()}."
        )
    if family_id:  # the family's own format rules (none for an image that is not its result)
        OutputPolicy.of(family_id, file_formats.BLENDER_WRITER).check(path)
    if not path.parent.is_dir():
        raise LeanImageError(f"Cannot save to '{path}': the folder '{path.parent}' does not exist.")
    if not os.access(path.parent, os.W_OK):
        raise LeanImageError(f"Cannot save to '{path}': the folder '{path.parent}' is not writable.")
    if source_file and path.exists() and os.path.samefile(path, absolute_path(source_file)):
        raise LeanImageError(f"Cannot save to '{path}': it is the input image. Choose another name.")
    if os.path.lexists(path) and not overwrite:  # a symbolic link there too, dangling or not
        raise LeanImageError(f"'{path}' exists. Set overwrite=True to replace it, or choose another name.")
    return path, file_format
