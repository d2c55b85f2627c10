"""What the four model operators share (bpy, main thread only).

- the source image: the ``filepath`` property, else the Image Editor's image, else the active
  Image Texture node of the active object's active material;
- the model: ``model_path``, else the catalog ``model_id``, else the family default (the first
  installed catalog entry of the family, the user's registered models included), and the
  catalog entry's ``preprocess`` constants translated into the adapter's keyword arguments;
- the runtime: the add-on preferences applied before every job (device, memory budget, CPU
  arena release);
- results: new images like the source (byte/float, colour space), saving to ``output_path``
  (format from the suffix, checked before any model runs), and removal of everything an
  ``apply`` created when a later step fails.
"""

# No ``from __future__ import annotations``: Blender reads the property annotations of
# `ModelOperatorProperties` as objects at registration time.
import contextlib
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import bpy
import numpy as np
from bpy.props import StringProperty

from ..models import installer
from ..models.catalog import FAMILY_DEFAULT_PREPROCESS, Catalog, CatalogEntry
from ..runtime import get_runtime
from ..runtime.errors import InvalidImageError, LeanImageError, ModelFileError
from ..ui import preferences
from ..ui.preferences import get_device_string, get_memory_budget_bytes, get_models_dir, get_prefs
from . import image_io

OUTPUT_FORMATS = {
    ".png": "PNG",
    ".exr": "OPEN_EXR",
    ".jpg": "JPEG",
    ".jpeg": "JPEG",
    ".tif": "TIFF",
    ".tiff": "TIFF",
}

FAMILY_TITLES = {
    "ben2": "BEN2 background removal",
    "da3": "Depth Anything 3",
    "moge2": "MoGe-2",
    "upscale": "upscale",
}

# Catalog `preprocess` key -> adapter keyword, where the two spell it differently. Keys an
# adapter does not take (display hints, constants the session itself reports) are dropped.
_ADAPTER_KEYWORDS = {
    "da3": {"patch_multiple": "multiple"},
    "upscale": {"tile_overlap": "overlap"},
}

NO_SOURCE_MESSAGE = (
    "No image to work on. Open an image in the Image Editor, select an Image Texture node, or give filepath."
)
PREFERENCES_HINT = "Preferences > Add-ons > Lean Image AI"


# --- source image ---------------------------------------------------------------------------


@dataclass
class Source:
    image: object  # bpy.types.Image
    loaded: bool  # loaded from `filepath` for this job (remove it again if the job fails)
    stem: str  # base for result names: the image name without an image-file suffix


def image_stem(image) -> str:
    name = image.name
    root, ext = os.path.splitext(name)
    return root if root and ext.lower() in _IMAGE_SUFFIXES else name


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


# --- models ---------------------------------------------------------------------------------


def load_catalog(context=None) -> Catalog:
    """Built-in entries plus the user models saved in the models folder (``user_models.json``);
    looked up on ``ui.preferences`` at call time, so there is one catalog (and tests can swap it)."""
    return preferences.get_catalog(context)


@dataclass
class ModelChoice:
    path: str
    title: str
    entry: CatalogEntry | None
    preprocess: Mapping


def resolve_model(
    context, family: str, model_id: str = "", model_path: str = "", *, fallback=None
) -> ModelChoice:
    """``model_path``, else catalog ``model_id``, else the family default (see module doc).

    ``fallback`` (a path) is used when the family has no installed model (upscale: the
    embedded bicubic x2 graph). Raises ModelFileError with what to install, and where.
    """
    if model_path:
        path = Path(bpy.path.abspath(model_path)).expanduser()
        if not path.is_file():
            raise ModelFileError(
                f"Model file not found: '{path}'. Check model_path, or leave it empty to use the "
                f"installed {FAMILY_TITLES[family]} model."
            )
        catalog = load_catalog(context)
        entry = next((e for e in catalog.entries(family) if e.path and _same_file(e.path, path)), None)
        preprocess = entry.preprocess if entry is not None else FAMILY_DEFAULT_PREPROCESS[family]
        return ModelChoice(str(path), entry.title if entry else path.name, entry, preprocess)

    models_dir = get_models_dir(context, create=False)
    catalog = load_catalog(context)
    if model_id:
        try:
            entry = catalog.get(model_id)
        except KeyError:
            raise ModelFileError(
                f"Unknown model '{model_id}': it is neither a built-in model nor one of your "
                f"registered models. See the model list in {PREFERENCES_HINT}."
            ) from None
        if entry.family != family:
            raise ModelFileError(
                f"'{entry.title}' is a {FAMILY_TITLES[entry.family]} model, not a "
                f"{FAMILY_TITLES[family]} model. Pick a {FAMILY_TITLES[family]} model."
            )
        if not installer.is_installed(entry, models_dir):
            raise ModelFileError(_not_installed(entry, models_dir))
        return ModelChoice(str(installer.model_path(entry, models_dir)), entry.title, entry, entry.preprocess)

    entries = catalog.entries(family)
    for entry in entries:
        if installer.is_installed(entry, models_dir):
            path = installer.model_path(entry, models_dir)
            return ModelChoice(str(path), entry.title, entry, entry.preprocess)
    if fallback is not None:
        return ModelChoice(str(fallback), Path(fallback).name, None, FAMILY_DEFAULT_PREPROCESS[family])
    suggestion = next((e.title for e in entries if e.downloadable), entries[0].title if entries else "")
    raise ModelFileError(
        f"No {FAMILY_TITLES[family]} model is installed. Install one in {PREFERENCES_HINT}"
        + (f" (for example '{suggestion}')" if suggestion else "")
        + ", or register your own ONNX file there, or give model_path."
    )


def _not_installed(entry: CatalogEntry, models_dir) -> str:
    if entry.is_user:
        return (
            f"Model '{entry.title}' ({entry.id}) is registered but its file '{entry.path}' is missing. "
            f"Put the file back, or register it again in {PREFERENCES_HINT}."
        )
    return (
        f"Model '{entry.title}' ({entry.id}) is not installed. Install it in {PREFERENCES_HINT} "
        f"(it goes to '{installer.model_path(entry, models_dir)}')."
    )


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def adapter_options(family: str, preprocess: Mapping, run: Callable) -> dict:
    """The catalog's ``preprocess`` constants as keyword arguments of the adapter's ``run``."""
    accepted = {
        name
        for name, parameter in inspect.signature(run).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name != "options"
    }
    renames = _ADAPTER_KEYWORDS.get(family, {})
    options = {}
    for key, value in (preprocess or {}).items():
        name = renames.get(key, key)
        if name in accepted:
            options[name] = _plain(value)
    return options


def _plain(value):
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


# --- runtime --------------------------------------------------------------------------------


def configure_runtime(context) -> tuple[str, int | None]:
    """Apply the preferences to the shared runtime; returns (device string, memory budget)."""
    prefs = get_prefs(context)
    budget = get_memory_budget_bytes(prefs)
    get_runtime().configure(cpu_arena=bool(prefs.release_cpu_memory), gpu_mem_limit_bytes=budget)
    return get_device_string(prefs), budget


# --- the shared gather ----------------------------------------------------------------------


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


def gather_job(operator, context, family: str, run: Callable, *, fallback=None, keep_source=False) -> dict:
    """Everything the worker needs, read on the main thread (see module doc).

    Returns a dict with ``source`` (the Image; only valid on the main thread), ``stem``,
    ``info`` (ImageInfo), ``rgba`` (source pixels as Blender holds them), ``model_rgba``
    (straight, sRGB-encoded: what models take), ``model_path``, ``model_title``,
    ``adapter_options``, ``device``, ``memory_budget``, ``output`` and ``on_discard``.
    A source loaded from ``filepath`` is removed again at once unless ``keep_source`` (then only
    when the job fails or is cancelled).
    """
    output = output_target(operator.output_path)
    # side-effect-free checks first: loading a file adds a datablock that an error must remove
    source = None if operator.filepath else resolve_source(context, "")
    model = resolve_model(context, family, operator.model_id, operator.model_path, fallback=fallback)
    if source is None:
        source = resolve_source(context, operator.filepath)
    try:
        rgba, info = image_io.read_image(source.image)
        model_rgba = image_io.to_model_rgb(rgba, info.is_linear, premultiplied=info.premultiplied)
    except BaseException:
        if source.loaded:
            remove_image_later(source.image)()
        raise
    on_discard = []
    if source.loaded:
        if keep_source:
            on_discard.append(remove_image_later(source.image))
        else:
            remove_image_later(source.image)()
    device, budget = configure_runtime(context)
    return {
        "source": source.image if (keep_source or not source.loaded) else None,
        "stem": source.stem,
        "info": info,
        "rgba": rgba,
        "model_rgba": model_rgba,
        "model_path": model.path,
        "model_title": model.title,
        "adapter_options": adapter_options(family, model.preprocess, run),
        "device": device,
        "memory_budget": budget,
        "output": output,
        "on_discard": on_discard,
    }


# --- results --------------------------------------------------------------------------------


def new_image_like(name: str, straight: np.ndarray, info: image_io.ImageInfo):
    """A new image with the source's kind: float or byte, same colour space handling.

    ``straight`` holds colour in the source's encoding (linear for float, sRGB for byte) with
    straight alpha; float buffers get premultiplied here, as Blender keeps them.
    """
    if info.is_data:
        colorspace = "Non-Color"
    elif info.is_float:
        colorspace = None  # Blender's scene-linear default: float pixels are linear
    else:
        colorspace = info.colorspace
    array = image_io.premultiply(image_io.to_rgba(straight)) if info.is_float else straight
    return image_io.array_to_new_image(name, array, float_buffer=info.is_float, colorspace=colorspace)


def save_output(image, inputs: dict) -> str:
    """Save ``image`` to the job's ``output_path`` (if any); returns a note for the report."""
    output = inputs.get("output")
    if not output:
        return ""
    path, file_format = output
    image_io.save_image_atomically(image, path, file_format)
    return f"; saved {path}"


class Created:
    """Datablocks made by one ``apply``: all removed again if it fails before the end."""

    def __init__(self):
        self._items: list[tuple[object, object]] = []

    def add(self, collection, datablock):
        self._items.append((collection, datablock))
        return datablock

    def remove_all(self) -> None:
        for collection, datablock in reversed(self._items):
            try:
                collection.remove(datablock)
            except (ReferenceError, RuntimeError):
                pass
        self._items.clear()


@contextlib.contextmanager
def created_data():
    created = Created()
    try:
        yield created
    except BaseException:
        created.remove_all()
        raise


def build_mesh(name: str, vertices: np.ndarray, quads: np.ndarray, vertex_uv: np.ndarray | None = None):
    """A mesh of quads from numpy arrays, with foreach_set (far faster than from_pydata)."""
    mesh = bpy.data.meshes.new(name)
    try:
        count = len(vertices)
        mesh.vertices.add(count)
        mesh.vertices.foreach_set("co", np.ascontiguousarray(vertices, np.float32).ravel())
        faces = len(quads)
        loops = np.ascontiguousarray(quads, np.int32).ravel()
        mesh.loops.add(len(loops))
        mesh.loops.foreach_set("vertex_index", loops)
        mesh.polygons.add(faces)
        mesh.polygons.foreach_set("loop_start", np.arange(0, 4 * faces, 4, dtype=np.int32))
        mesh.polygons.foreach_set("loop_total", np.full(faces, 4, np.int32))
        if vertex_uv is not None:
            layer = mesh.uv_layers.new(name="UVMap")
            layer.data.foreach_set("uv", np.ascontiguousarray(vertex_uv[loops], np.float32).ravel())
        mesh.update(calc_edges=True)
    except BaseException:
        bpy.data.meshes.remove(mesh)
        raise
    return mesh


def link_object(context, obj) -> None:
    """Link ``obj`` into the active collection and make it the active, selected object."""
    collection = getattr(context, "collection", None) or context.scene.collection
    collection.objects.link(obj)
    view_layer = getattr(context, "view_layer", None)
    if view_layer is not None:
        for other in view_layer.objects:
            if other is not obj and other.select_get(view_layer=view_layer):
                other.select_set(False, view_layer=view_layer)
        obj.select_set(True, view_layer=view_layer)
        view_layer.objects.active = obj


class ModelOperatorProperties:
    """Properties every model operator has (the fixed contract); Blender reads the annotations
    of mixins too, so each operator class inherits them."""

    filepath: StringProperty(
        name="Image File",
        description="Image file to process. Empty: the Image Editor's image, else the active Image Texture node",
        subtype="FILE_PATH",
        default="",
    )
    output_path: StringProperty(
        name="Save Result To",
        description="Also save the result image here (.png, .exr, .jpg or .tif), written all-or-nothing",
        subtype="FILE_PATH",
        default="",
    )
    model_id: StringProperty(
        name="Model",
        description="Catalog model id. Empty: the first installed model of this kind",
        default="",
    )
    model_path: StringProperty(
        name="Model File",
        description="Path of an ONNX model file to use instead of a catalog model",
        subtype="FILE_PATH",
        default="",
    )
