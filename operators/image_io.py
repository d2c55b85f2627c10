"""Fast conversions between Blender images and numpy arrays (bpy, no onnxruntime).

Conventions (verified on bpy 5.0.1):

- Arrays are float32 ``(H, W, 4)`` RGBA, **top row first** (Blender stores rows bottom-up).
- Byte images (``image.is_float`` False): ``pixels`` are the stored 8-bit values / 255, whatever the
  colour space says, with straight alpha. For the usual sRGB byte image that means display-referred
  sRGB in [0, 1], which is what the models expect.
- Float images (EXR, HDR, 16-bit PNG/TIFF, new float buffers): Blender converts them to
  scene-linear on load, so ``pixels`` are linear even when the colour space field says "sRGB"
  (a 16-bit sRGB PNG reads back linearised). Only "Non-Color" (data) images stay raw.
  Float buffers hold **premultiplied** alpha (unless the image is "Channel Packed"), even for a
  new generated image whose ``alpha_mode`` reads "STRAIGHT": Blender un-premultiplies them when
  saving a PNG and writes them as-is to EXR. ``ImageInfo.premultiplied`` says which case applies;
  pass it to models/colour.py's ``to_model_rgb`` / ``from_model_rgb``.
- "Linear" means Blender's working space, Linear Rec.709 by default. Blender 5.0 lets a blend
  file pick another one (``bpy.data.colorspace.working_space``, e.g. ACEScg); the sRGB transfer
  functions here then get the primaries wrong (colours shift slightly, values stay in range).
- Setting ``colorspace_settings.name`` on a *generated* image (re)generates its buffer and wipes
  the pixels (even when set to the same name), so colour spaces are set before pixels are written.
- ``Image.save()`` to OpenEXR is wrong for generated float images (writes sRGB-encoded values
  tagged ``srgb_rec709_display``) and for byte images (linear values tagged sRGB: read back
  linearised twice); ``save_render`` with a scratch scene writes correct linear, premultiplied
  EXRs, so :func:`save_image_atomically` uses that for colour images saved as EXR.

Reading/writing goes through ``pixels.foreach_get/foreach_set`` with float32 buffers, about 10x
faster than ``pixels[:]`` (see ``bench/blender_io.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import bpy
import numpy as np

from ..models import file_formats, files
from ..models.imaging import to_rgba  # noqa: F401 (image_io.to_rgba: the operators' name for it)
from ..runtime.errors import InvalidImageError, LeanImageError

__all__ = [
    "ImageInfo",
    "ImageSaveError",
    "array_to_new_image",
    "decode",
    "image_info",
    "image_rows",
    "image_to_array",
    "load_image_file",
    "read_image",
    "save_image_atomically",
    "to_rgba",
    "write_array_to_image",
]


class ImageSaveError(LeanImageError, OSError):
    """Writing an image file failed; any previous file at the target path is untouched."""


# Colour space names whose *byte* encoding holds linear values (rare: an 8-bit file tagged linear).
_LINEAR_NAME_PREFIXES = ("linear", "aces2065", "acescg", "scene_linear", "working space")

# Rec.709 luminance weights, used when an RGB result must go into a 1- or 2-channel image.
_LUMA = np.array([0.2126, 0.7152, 0.0722], dtype=np.float32)


@dataclass(frozen=True)
class ImageInfo:
    """Where an image's pixel values come from, so results can be written back the same way."""

    name: str
    width: int
    height: int
    channels: int  # Blender's channel count (1..4); arrays from image_to_array are always RGBA
    is_float: bool
    colorspace: str
    is_data: bool  # "Non-Color": raw values, never colour-converted
    is_linear: bool  # pixels are linear values (float buffers, or bytes tagged with a linear space)
    premultiplied: bool  # colour is premultiplied by alpha (float buffers, unless channel-packed)
    alpha_mode: str


def _colorspace_is_linear_name(name: str) -> bool:
    return name.lower().startswith(_LINEAR_NAME_PREFIXES)


def _image_label(image) -> str:
    path = getattr(image, "filepath", "") or ""
    return f"'{image.name}'" + (f" ({path})" if path else "")


def _checked_size(image) -> tuple[int, int]:
    if image is None:
        raise InvalidImageError("No image selected. Pick or open an image first.")
    if getattr(image, "type", "IMAGE") in {"RENDER_RESULT", "COMPOSITING"}:
        raise InvalidImageError(
            f"Image {_image_label(image)} is a render/compositor result, whose pixels Python cannot read. "
            "Save it first (Image > Save As) and run on the saved image."
        )
    width, height = (int(v) for v in image.size)
    if width <= 0 or height <= 0:
        if image.source in {"FILE", "SEQUENCE", "MOVIE", "TILED"}:
            hint = (
                "its file could not be loaded (missing, moved or unreadable). "
                "Fix the path or use Image > Reload / Replace, then run again."
            )
        else:
            hint = "it holds no pixels. Open or create an image with pixels, then run again."
        raise InvalidImageError(f"Image {_image_label(image)} is empty (0 x 0 pixels): {hint}")
    return width, height


def decode(image) -> None:
    """Blender decodes an image's file when its size is first asked for: done here, in a call of
    its own, so that the call which reads the pixels does not also decode them."""
    try:
        image.size[0]
    except ReferenceError:  # removed since it was picked
        raise InvalidImageError("The image was removed before the job read it; nothing was changed.") from None


def image_info(image) -> ImageInfo:
    """Colour-space metadata of ``image`` (loads its buffer if needed)."""
    width, height = _checked_size(image)
    settings = image.colorspace_settings
    colorspace = settings.name
    is_data = bool(getattr(settings, "is_data", colorspace == "Non-Color"))
    is_float = bool(image.is_float)
    if is_data:
        is_linear = False
    elif is_float:
        is_linear = True  # Blender keeps float buffers in scene-linear.
    else:
        is_linear = _colorspace_is_linear_name(colorspace)
    alpha_mode = image.alpha_mode
    if is_float:
        premultiplied = alpha_mode not in {"CHANNEL_PACKED", "NONE"}
    else:
        premultiplied = alpha_mode == "PREMUL"
    return ImageInfo(
        name=image.name,
        width=width,
        height=height,
        channels=int(image.channels),
        is_float=is_float,
        colorspace=colorspace,
        is_data=is_data,
        is_linear=is_linear,
        premultiplied=premultiplied,
        alpha_mode=alpha_mode,
    )


def image_rows(image) -> np.ndarray:
    """Pixels of a Blender image as float32 ``(H, W, 4)`` RGBA, top row first, without a second copy:
    a flipped view (a negative row stride) of the one buffer ``pixels.foreach_get`` filled. A copy of
    those rows took 0.01-0.05 s more of Blender's main thread at 2048x2048 (bench/start_parts.py);
    whoever needs contiguous rows converts a band at a time (the model's input does). An image of
    1-3 channels (rare: files load with 4) gets its RGBA rows made whole.

    Values are as Blender holds them (see module doc): sRGB-encoded for byte images, linear for
    float images. Use :func:`image_info` / :func:`read_image` for the colour space and
    models/colour.py's ``to_model_rgb`` before feeding a model.
    """
    width, height = _checked_size(image)
    pixels = image.pixels
    count = len(pixels)
    if count == 0 or count % (width * height):
        raise InvalidImageError(
            f"Image {_image_label(image)} reports {width} x {height} pixels but holds {count} values; "
            "reload the image and run again."
        )
    channels = count // (width * height)
    flat = np.empty(count, dtype=np.float32)
    pixels.foreach_get(flat)
    rows = flat.reshape(height, width, channels)[::-1]
    return rows if channels == 4 else to_rgba(rows)


def image_to_array(image) -> np.ndarray:
    """:func:`image_rows` as one contiguous array (a copy of the rows)."""
    return np.ascontiguousarray(image_rows(image))


def read_image(image) -> tuple[np.ndarray, ImageInfo]:
    """``(image_rows(image), image_info(image))``: the rows a flipped view, no second copy."""
    info = image_info(image)
    return image_rows(image), info


# --- writing ------------------------------------------------------------------------------------


def _set_pixels(image, rgba: np.ndarray) -> None:
    """Write ``(H, W, 4)`` top-row-first data into ``image`` converting to its channel count."""
    channels = int(image.channels)
    if channels == 4:
        data = rgba
    elif channels == 3:
        data = rgba[..., :3]
    elif channels == 2:
        data = np.stack([rgba[..., :3] @ _LUMA, rgba[..., 3]], axis=-1)
    else:
        data = (rgba[..., :3] @ _LUMA)[..., None]
    flat = np.ascontiguousarray(data[::-1], dtype=np.float32).reshape(-1)
    image.pixels.foreach_set(flat)


def array_to_new_image(
    name: str,
    array: np.ndarray,
    *,
    float_buffer: bool,
    colorspace: str | None = None,
    alpha: bool = True,
):
    """A new ``bpy.types.Image`` holding ``array`` (``(H, W)`` or ``(H, W, 1..4)``, top row first).

    ``colorspace`` None keeps Blender's default: "sRGB" for byte images, the scene-linear space
    ("Linear Rec.709" by default) for float images. Pass "Non-Color" for data (depth, masks).
    Values are written as given: convert with :func:`from_model_rgb` first if needed (a float
    image holds linear, premultiplied colour; a byte image sRGB, straight).
    With ``alpha=False`` the alpha channel is written as 1.
    """
    rgba = to_rgba(array)
    if not alpha:
        if np.shares_memory(rgba, np.asarray(array)):
            rgba = rgba.copy()
        rgba[..., 3] = 1.0
    height, width = rgba.shape[:2]
    image = bpy.data.images.new(
        name,
        width=width,
        height=height,
        alpha=alpha,
        float_buffer=float_buffer,
        is_data=colorspace == "Non-Color",
    )
    try:
        # Before the pixels: setting a colour space regenerates a generated image's buffer.
        if colorspace is not None and image.colorspace_settings.name != colorspace:
            image.colorspace_settings.name = colorspace
        _set_pixels(image, rgba)
    except Exception:
        bpy.data.images.remove(image)
        raise
    return image


def write_array_to_image(image, array: np.ndarray) -> None:
    """Replace the pixels of ``image`` in place with ``array`` (same width and height)."""
    width, height = _checked_size(image)
    rgba = to_rgba(array)
    if rgba.shape[:2] != (height, width):
        raise InvalidImageError(
            f"Image {_image_label(image)} is {width} x {height} pixels but the result is "
            f"{rgba.shape[1]} x {rgba.shape[0]}. The image changed while the job ran; run it again."
        )
    _set_pixels(image, rgba)


# --- files --------------------------------------------------------------------------------------


def load_image_file(path, *, check_existing: bool = False):
    """Load an image file into ``bpy.data.images``; :class:`InvalidImageError` names the path."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InvalidImageError(f"Image file not found: '{path}'. Check the path and run again.")
    known = {image.as_pointer() for image in bpy.data.images} if check_existing else set()
    try:
        image = bpy.data.images.load(path, check_existing=check_existing)
        if image.as_pointer() in known and image.source != "FILE":
            # an open sequence or movie of this file matched: it shows the scene's frame, not this
            # file (0 x 0 when the scene is outside its frames), so this file gets its own datablock
            image = bpy.data.images.load(path, check_existing=False)
    except RuntimeError as ex:
        detail = str(ex).strip().removeprefix("Error:").strip()
        raise InvalidImageError(
            f"Blender cannot read '{path}' as an image ({detail}). "
            "Check that it is a supported image format and not damaged."
        ) from ex
    # Blender "loads" unreadable files as empty images instead of failing.
    width, height = (int(v) for v in image.size)
    if width <= 0 or height <= 0:
        if image.as_pointer() not in known and image.users == 0:  # made here: the user's stays
            bpy.data.images.remove(image)
        raise InvalidImageError(
            f"Blender cannot read '{path}' as an image (unknown format, truncated or damaged file). "
            "Re-export it as PNG, JPEG, EXR or TIFF and try again."
        )
    return image




def _save_supports_copy() -> bool:
    return "save_copy" in bpy.types.Image.bl_rna.functions["save"].parameters


def _save_exr_as_render(image, filepath: str, file_format: str) -> None:
    """Correct linear EXR of a colour image: ``save_render`` with a scratch scene (EXR output skips
    the view transform; ``Image.save`` gets the colour space wrong, see module doc)."""
    scene = bpy.data.scenes.new(".lean_image_ai_save")
    try:
        settings = scene.render.image_settings
        settings.file_format = file_format
        settings.color_mode = "RGBA"
        settings.color_depth = "16" if image.use_half_precision else "32"
        image.save_render(filepath=filepath, scene=scene)
    finally:
        bpy.data.scenes.remove(scene)


def _write_image_file(image, filepath: str, file_format: str) -> None:
    if file_format in file_formats.EXR_BLENDER_FORMATS and not image.colorspace_settings.is_data:
        _save_exr_as_render(image, filepath, file_format)
        return
    old_format = image.file_format
    image.file_format = file_format
    if _save_supports_copy():
        try:
            image.save(filepath=filepath, save_copy=True)
        finally:
            image.file_format = old_format
    else:  # pragma: no cover - Blender versions without save_copy re-point the image at the file
        image.save(filepath=filepath)


def save_image_atomically(image, path, file_format: str) -> Path:
    """Save ``image`` to ``path`` as ``file_format`` (e.g. "PNG", "OPEN_EXR") all-or-nothing.

    Blender writes to a temporary file in the same folder, which then replaces ``path``
    (models/files.py): a failed save never leaves a half-written file, and an existing file at
    ``path`` is only replaced by a complete one. The image keeps its own file path and format
    (``save_copy``). Colour images saved as OpenEXR go through ``save_render`` (linear,
    premultiplied); EXR uses 16-bit half floats when ``image.use_half_precision`` is set.
    Raises :class:`ImageSaveError` (an ``OSError``) on failure.
    """
    _checked_size(image)
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        raise ImageSaveError(f"Cannot save '{target}': the folder '{folder}' does not exist.")
    if target.is_dir():
        raise ImageSaveError(f"Cannot save to '{target}': it is a folder, not a file name.")
    try:
        with files.atomic_path(target) as tmp:
            try:
                _write_image_file(image, str(tmp), file_format)
            except (RuntimeError, TypeError, ValueError) as ex:
                detail = str(ex).strip()
                raise ImageSaveError(
                    f"Blender could not save image {_image_label(image)} to '{target}': {detail}"
                ) from ex
            if not tmp.is_file() or tmp.stat().st_size == 0:
                raise ImageSaveError(f"Blender did not write image {_image_label(image)} to '{target}'.")
    except ImageSaveError:
        raise
    except OSError as ex:
        raise ImageSaveError(f"Could not move the saved image into place at '{target}': {ex}") from ex
    finally:
        if not _save_supports_copy() and image.filepath_raw.endswith(".tmp" + target.suffix):  # pragma: no cover
            image.filepath_raw = str(target)
    return target
