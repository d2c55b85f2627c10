"""Image files outside Blender (the command line, the farm, any front-end without Blender's
image IO): Pillow for 8/16-bit formats, OpenEXR for float EXR.

Neither ships with Blender; inside Blender the operators read and write images with Blender
itself. Both are imported only when a file is read or written, and their absence is a readable
error. Every file is written all or nothing (models/files.py). The runner's frame IO over these
files is models/batch/frame_io.py's ImageFileFrames.
"""

from __future__ import annotations

import os
import re
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

from ...runtime.errors import LeanImageError, printable
from ...runtime.settings import quoted
from .. import file_formats, files, image_meta
from ..result_images import ImageProduct, range_notes


class ImageFileError(LeanImageError):
    """An image file that cannot be read or written here (missing, damaged, too many pixels, a
    format or library this Python lacks): things the user can fix."""


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise ImageFileError(
            "Reading and writing image files needs Pillow, which is not installed in this Python. "
            "Install it (`pip install Pillow`), or run the job from Blender with the add-on's "
            "operator (Blender reads and writes images itself)."
        ) from None
    return Image


def _openexr():
    try:
        import OpenEXR
    except ImportError:
        raise ImageFileError(
            "EXR files need the OpenEXR package, which is not installed in this Python. Install it "
            "(`pip install OpenEXR`), or write .tif (float) instead."
        ) from None
    return OpenEXR


def check_writable_format(path: Path) -> None:
    """Fail before the model runs when nothing here can write ``path``'s format."""
    library = file_formats.COMMAND_LINE.library(path.suffix)
    if library == file_formats.OPENEXR:
        _openexr()
    elif library == file_formats.PILLOW:
        Image = _pillow()
        if Image.registered_extensions().get(path.suffix.lower()) in Image.SAVE:
            return
    if not library or library == file_formats.PILLOW:  # none here, or a Pillow built without it
        raise ImageFileError(
            f"Cannot write {path.name}: unknown or unsupported image file extension "
            f"{path.suffix or '(none)'}. Use {file_formats.COMMAND_LINE.advice()}."
        )


def _warn(text: str) -> None:
    print(printable(f"warning: {text}"), flush=True)


def read_image(path: Path, warn=_warn) -> np.ndarray:
    """HxWxC uint8/uint16/float32 as stored (float for EXR), turned upright as its EXIF
    orientation says (as image viewers show it). 16 bits per channel are kept. An animation
    (GIF, APNG, WebP) is refused: which of its frames is "the image" is a guess, and frame 1
    alone silently drops the rest. A multi-page TIFF or a multi-picture JPEG (MPO) gives its
    first image with a warning: both keep the main image first and add thumbnails, reduced
    copies or depth/gain maps after it."""
    if file_formats.COMMAND_LINE.library(path.suffix) == file_formats.OPENEXR:
        return _read_exr(path)
    Image = _pillow()
    _apply_pixel_limit(Image)
    try:
        with Image.open(path) as source:
            _check_frames(path, source, warn)
            wide = _sixteen_bit_rawmodes(source)
            if wide is not None:  # Pillow keeps only the high byte of 16-bit colour: read both halves
                return _read_sixteen_bit_colour(path, wide)
            source.load()
            image = _upright(source)
            if image.mode == "P":
                image = image.convert("RGBA" if "transparency" in image.info else "RGB")
            elif image.mode in ("CMYK", "YCbCr", "LAB", "HSV", "1"):
                image = image.convert("RGB" if image.mode != "1" else "L")
            elif image.mode == "PA":
                image = image.convert("RGBA")
            elif image.mode.startswith(("LA;16", "RGBX;16")):
                warn(f"{path.name}: Pillow reads its {image.mode} samples as 8 bits; the result has 8-bit precision.")
            array = np.asarray(image)
    except FileNotFoundError:
        raise ImageFileError(f"Input image not found: {path}.") from None
    except Image.DecompressionBombError as exc:
        raise _too_many_pixels(path, exc, Image.MAX_IMAGE_PIXELS) from None
    except IsADirectoryError:
        raise ImageFileError(f"Input path {path} is a folder; give an image file.") from None
    except OSError as exc:  # Pillow's UnidentifiedImageError is an OSError too
        raise ImageFileError(f"Cannot read {path} as an image: {exc}.") from None
    if array.dtype.kind in "iu" and array.dtype != np.uint8:
        # 16-bit PNG/TIFF greys come back as int32 ("I") or uint16 ("I;16")
        array = np.clip(array, 0, 65535).astype(np.uint16)
    return array


def input_kind(path: Path) -> str:
    """What ``path``'s samples are, from its header: "float", "16-bit" or "8-bit" (the output
    type follows it, models/outputs.py); "8-bit" when it cannot be told."""
    row = file_formats.find(path.suffix)
    if row is not None and row.float_samples:
        return "float"
    Image = _pillow()
    try:
        with Image.open(path) as image:
            mode, wide = image.mode, _sixteen_bit_rawmodes(image)
    except (OSError, ValueError, Image.DecompressionBombError):
        return "8-bit"  # reading the frame says what is wrong with it, with the limit in force
    if mode == "F":
        return "float"
    return "16-bit" if wide is not None or mode.startswith("I") else "8-bit"


def _check_frames(path: Path, source, warn) -> None:
    frames = getattr(source, "n_frames", 1)
    if frames <= 1:
        return
    if source.format in ANIMATION_FORMATS:
        raise ImageFileError(
            f"{path} is an animation of {frames} frames ({source.format}); this reads one still image. "
            "Extract its frames first (e.g. `ffmpeg -i INPUT frame_%04d.png`) and give their folder."
        )
    if source.format == "TIFF":
        warn(f"{path.name} has {frames} pages; the first (the main image by TIFF convention) was used.")
    else:  # e.g. a phone's MPO JPEG: the photo first, then depth or gain maps
        warn(f"{path.name} holds {frames} images ({source.format}); the first (the main image) was used.")


ANIMATION_FORMATS = ("GIF", "PNG", "WEBP", "FLI")  # several frames there are an animation


def _upright(image):
    """``image`` turned as its EXIF orientation says (a camera's portrait photo is stored sideways)."""
    from PIL import ImageOps

    return ImageOps.exif_transpose(image)


_SWAPPED_BYTE_ORDER = {"B": "L", "L": "B"}


def _sixteen_bit_rawmodes(image) -> tuple[str, str, bool] | None:
    """(high-byte, low-byte) raw modes of a 16-bit RGB/RGBA file and whether its colour is
    premultiplied, or None. Pillow has no 16-bit
    colour mode: it decodes such files keeping each sample's high byte. Decoding the same data
    once more with the byte order swapped gives the low bytes, so both halves come from Pillow's
    own decoders (PNG filters, TIFF compression)."""
    tile = getattr(image, "tile", None)
    if not tile or len(tile) != 1 or image.mode not in ("RGB", "RGBA"):
        return None
    rawmode = tile[0].args[0] if isinstance(tile[0].args, tuple) else tile[0].args
    # "RGBa": premultiplied (Blender's TIFFs); read as stored, divided by alpha afterwards
    if not isinstance(rawmode, str) or not rawmode.startswith((f"{image.mode};16", "RGBa;16")):
        return None
    order = rawmode[-1] if rawmode[-1] in "BLN" else ""
    if order == "N":
        order = "L" if sys.byteorder == "little" else "B"
    if order not in _SWAPPED_BYTE_ORDER:
        return None
    return f"{image.mode};16{order}", f"{image.mode};16{_SWAPPED_BYTE_ORDER[order]}", rawmode.startswith("RGBa")


def _read_sixteen_bit_colour(path: Path, rawmodes: tuple[str, str, bool]) -> np.ndarray:
    Image = _pillow()
    halves = []
    for rawmode in rawmodes[:2]:
        with Image.open(path) as image:
            args = image.tile[0].args
            args = (rawmode, *args[1:]) if isinstance(args, tuple) else rawmode
            image.tile = [image.tile[0]._replace(args=args)]
            image.load()
            halves.append(np.asarray(_upright(image)).astype(np.uint16))
    high, low = halves
    array = (high << 8) | low
    if rawmodes[2]:  # premultiplied: straight colour, as every other reader here gives
        alpha = array[..., 3:].astype(np.float64)
        straight = np.where(alpha > 0, array[..., :3] * 65535.0 / np.maximum(alpha, 1.0), 0.0)
        array[..., :3] = np.clip(np.rint(straight), 0, 65535).astype(np.uint16)
    return array


PIXEL_LIMIT_VARIABLE = "LEAN_IMAGE_AI_MAX_PIXELS"


def _apply_pixel_limit(Image) -> None:  # noqa: N803 (the PIL.Image module)
    """Pillow refuses images of more than twice ``MAX_IMAGE_PIXELS`` (about 179 Mpx by default),
    a guard against decompression bombs; LEAN_IMAGE_AI_MAX_PIXELS moves it (0: no limit)."""
    limit = pixel_limit()
    if limit is not None:
        Image.MAX_IMAGE_PIXELS = limit or None


def pixel_limit() -> int | None:
    """LEAN_IMAGE_AI_MAX_PIXELS as a number of pixels (0: no limit); None when unset."""
    value = os.environ.get(PIXEL_LIMIT_VARIABLE, "").strip()
    if not value:
        return None
    try:
        limit = int(value.replace("_", "").replace(",", ""))
    except ValueError:
        limit = -1
    if limit < 0:  # a negative limit must not quietly turn the guard off
        raise ImageFileError(
            f"{PIXEL_LIMIT_VARIABLE}={quoted(value)}: give the largest pixel count to accept as a whole "
            "number (for example 400000000), or 0 for no limit."
        )
    return limit


PILLOW_MAX_PIXELS = 1024 * 1024 * 1024 // 4 // 3  # Pillow's default MAX_IMAGE_PIXELS, for EXR without Pillow


def _check_exr_pixels(path: Path) -> None:
    """The limit Pillow applies to PNG and TIFF (it refuses over twice MAX_IMAGE_PIXELS), on the
    data windows of an EXR's header, before OpenEXR allocates a pixel of them."""
    limit = pixel_limit()
    if limit == 0:
        return
    refused = 2 * (PILLOW_MAX_PIXELS if limit is None else limit)
    try:
        pixels = image_meta.exr_pixels(path)
    except OSError:
        return  # reading it says what is wrong
    if pixels is not None and pixels > refused:
        raise _too_many_pixels(path, f"Image size ({pixels} pixels) exceeds limit of {refused} pixels", limit)


def _too_many_pixels(path: Path, exc: Exception | str, limit: int | None) -> ImageFileError:
    # Pillow's text: "Image size (N pixels) exceeds limit of M pixels, could be decompression bomb..."
    numbers = [int(n) for n in re.findall(r"\d+", str(exc))]
    pixels = numbers[0] if numbers else None
    refused = numbers[1] if len(numbers) > 1 else (2 * limit if limit else None)
    return ImageFileError(
        f"{path} declares {f'{pixels:,}' if pixels else 'more'} pixels, over the "
        f"{f'{refused:,}' if refused else ''}-pixel limit that guards against decompression bombs "
        "(small files that expand to exhaust memory); nothing was read or written. If the image "
        f"is genuine, raise the limit: set {PIXEL_LIMIT_VARIABLE}={pixels or 'N'} (or 0 for no "
        "limit) and run again."
    )


def _read_exr(path: Path) -> np.ndarray:
    OpenEXR = _openexr()
    _check_exr_pixels(path)
    try:
        with OpenEXR.File(str(path)) as exr:
            channels = exr.channels()
            for name in ("RGBA", "RGB", "Y"):
                if name in channels:
                    return np.asarray(channels[name].pixels, np.float32)
            first = next(iter(channels.values()))
            return np.asarray(first.pixels, np.float32)
    except FileNotFoundError:
        raise ImageFileError(f"Input image not found: {path}.") from None
    except (OSError, RuntimeError, ValueError, StopIteration) as exc:  # ValueError: a damaged header
        raise ImageFileError(f"Cannot read {path} as an EXR image: {exc}.") from None


def write_image(path: Path, product: ImageProduct) -> list[str]:
    """Write ``product`` to ``path`` (format from the suffix); returns notes for the user."""
    pixels = np.asarray(product.pixels, np.float32)
    suffix = path.suffix.lower()
    try:
        if file_formats.COMMAND_LINE.library(suffix) == file_formats.OPENEXR:
            _write_exr(path, pixels, product)
            return []
        return _write_pillow(path, pixels, product)
    except OSError as exc:
        raise ImageFileError(f"Could not write {path}: {exc.strerror or exc}.") from None


def _write_exr(path: Path, pixels: np.ndarray, product: ImageProduct) -> None:
    OpenEXR = _openexr()
    if pixels.ndim == 2:
        channels = {"Y": pixels}
    else:
        channels = {{1: "Y", 3: "RGB", 4: "RGBA"}[pixels.shape[2]]: np.ascontiguousarray(pixels)}
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    header.update(getattr(product, "metadata", {}))  # e.g. the shot's depth range (models/adapters/shot_depth.py)
    with files.atomic_path(path) as temp, OpenEXR.File(header, channels) as exr:
        exr.write(str(temp))


def _write_pillow(path: Path, pixels: np.ndarray, product: ImageProduct) -> list[str]:
    Image = _pillow()
    image_format = Image.registered_extensions().get(path.suffix.lower())
    notes = range_notes(path, product)
    metadata = {}
    if pixels.ndim == 2 and image_format == "TIFF":
        picture = Image.fromarray(np.ascontiguousarray(pixels), "F")  # 32-bit float TIFF keeps depth
    elif pixels.ndim == 2 and image_format == "PNG":
        grey = (np.clip(pixels, 0.0, 1.0) * 65535.0 + 0.5).astype(np.uint16)
        picture = Image.fromarray(grey)  # uint16: a 16-bit grey PNG
        if product.value_range is not None:
            from PIL import PngImagePlugin

            info = PngImagePlugin.PngInfo()
            info.add_text("lean_image_ai:value_range", f"{product.value_range[0]!r} {product.value_range[1]!r}")
            for key, text in getattr(product, "metadata", {}).items():
                info.add_text(key, text)
            metadata["pnginfo"] = info
    elif product.bits == "16-bit" and image_format == "PNG":  # Pillow writes 8-bit colour only
        deep = (np.clip(pixels, 0.0, 1.0) * 65535.0 + 0.5).astype(np.uint16)
        with files.atomic_path(path) as temp:
            temp.write_bytes(png16_bytes(deep, product.metadata))
        return notes
    else:
        if product.bits != "8-bit":  # e.g. 16-bit colour TIFF, which Pillow writes with 8 bits
            notes.append(
                f"{path.name}: {image_format} is written with 8 bits here; {file_formats.KEEP_BITS} "
                "to keep the input's bits."
            )
        array = (np.clip(pixels, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
        if array.ndim == 3 and array.shape[2] == 4 and not _keeps_alpha(path):
            array = array[:, :, :3]
            notes.append(f"{image_format} has no alpha channel; alpha was dropped (write .png to keep it).")
        mode = "L" if array.ndim == 2 else {3: "RGB", 4: "RGBA"}[array.shape[2]]
        picture = Image.fromarray(np.ascontiguousarray(array), mode)
        metadata = _text_metadata(path, product)
    with files.atomic_path(path) as temp:
        picture.save(temp, format=image_format, **metadata)
    return notes


def _text_metadata(path: Path, product: ImageProduct) -> dict:
    """Pillow's save arguments that keep an 8-bit file's text (value range, notes) where the
    format's row says it keeps text."""
    row = file_formats.find(path.suffix)
    keeps = row.metadata if row is not None else ""
    if product.value_range is not None and keeps == file_formats.COMMENT:
        return {"comment": f"lean_image_ai:value_range {product.value_range[0]!r} {product.value_range[1]!r}"}
    if product.metadata and keeps == file_formats.TEXT_CHUNKS:
        from PIL import PngImagePlugin

        info = PngImagePlugin.PngInfo()
        for key, text in product.metadata.items():
            info.add_text(key, text)
        return {"pnginfo": info}
    if product.metadata and keeps == file_formats.COMMENT:
        return {"comment": "; ".join(f"{key} {text}" for key, text in product.metadata.items())}
    return {}


def _keeps_alpha(path: Path) -> bool:
    row = file_formats.find(path.suffix)
    return row is None or row.alpha


def png16_bytes(array: np.ndarray, texts: dict[str, str] | None = None) -> bytes:
    """A 16-bit PNG of ``array`` (HxW or HxWxC uint16, C = 1..4), which Pillow cannot write for
    colour: rows filtered "Up" (the previous row subtracted), which smooth images compress well."""
    if array.ndim == 2:
        array = array[:, :, None]
    height, width, channels = array.shape
    rows = np.ascontiguousarray(array, ">u2").reshape(height, width * channels).view(np.uint8)
    filtered = rows.copy()
    filtered[1:] -= rows[:-1]  # uint8 wraps around, as PNG's filter arithmetic does
    kinds = np.full((height, 1), 2, np.uint8)
    kinds[0] = 0  # the first row has no row above it
    data = zlib.compress(np.hstack([kinds, filtered]).tobytes(), 6)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    colour_type = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    header = struct.pack(">IIBBBBB", width, height, 16, colour_type, 0, 0, 0)
    notes = b"".join(chunk(b"tEXt", key.encode("latin-1") + b"\0" + text.encode("latin-1", "replace"))
                     for key, text in (texts or {}).items())
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + notes + chunk(b"IDAT", data) + chunk(b"IEND", b"")
