"""What the model operators make in Blender (bpy, main thread): images like the source, saved
results (each kept in the .blend: reading the file it was saved to, else packed, so save/reopen
and undo/redo keep its pixels), the result shown in the Image Editor that showed the source,
meshes, linked objects, and the removal of all of it when a later step fails.
"""

import contextlib
from collections.abc import Callable
from functools import partial
from pathlib import Path

import bpy
import numpy as np

from ..models import colour, file_bytes, file_formats, files, result_images
from . import image_io, sources


def colorspace(info: image_io.ImageInfo) -> str | None:
    """The colour space of a result like the source (None: Blender's default for its kind)."""
    if info.is_data:
        return "Non-Color"
    if info.is_float:
        return None  # Blender's scene-linear default: float pixels are linear
    return info.colorspace


def new_image_like(name: str, straight: np.ndarray, info: image_io.ImageInfo):
    """A new generated image with the source's kind: float or byte, same colour space handling (a
    result saved to a file; one packed into the .blend is made by :func:`image_from_file`).

    ``straight`` holds colour in the source's encoding (linear for float, sRGB for byte) with
    straight alpha; float buffers get premultiplied here, as Blender keeps them.
    """
    array = colour.premultiply(image_io.to_rgba(straight)) if info.is_float else straight
    return image_io.array_to_new_image(name, array, float_buffer=info.is_float, colorspace=colorspace(info))


def file_like(shape: tuple[int, ...], straight_rows, info: image_io.ImageInfo) -> file_bytes.BandedFile:
    """The file a packed result like the source is made from, written by the job's pump a band at a
    time (models/file_bytes/): ``straight_rows(start, stop)`` gives the result's rows as
    :func:`new_image_like` takes them. A float source's result: a float EXR of premultiplied
    colour, as Blender keeps float buffers; a byte source's: an 8-bit PNG."""
    height, width = shape[:2]
    if info.is_float:
        return file_bytes.ExrFile(height, width, lambda start, stop: colour.premultiply(straight_rows(start, stop)))
    return file_bytes.PngFile(height, width, straight_rows)


def value_file(values: np.ndarray) -> file_bytes.BandedFile:
    """A float EXR of values, alpha 1 (one channel, as depth, in every colour channel; three, as a
    normal map, as they are), written a band at a time by the job's pump."""
    values = np.asarray(values, np.float32)
    height, width = values.shape[:2]
    planes = values.reshape(height, width, -1)

    def rows(start: int, stop: int) -> np.ndarray:
        rgba = np.ones((stop - start, width, 4), np.float32)
        rgba[..., :3] = planes[start:stop, :, :3]
        return rgba

    return file_bytes.ExrFile(height, width, rows)


def float_file(pixels: np.ndarray) -> file_bytes.BandedFile:
    """A float EXR of ``pixels`` as given (``(H, W)`` or ``(H, W, 1..4)``, as
    :func:`image_io.array_to_new_image` writes them into a float image), a band at a time."""
    height, width = np.shape(pixels)[:2]
    return file_bytes.ExrFile(height, width, lambda start, stop: image_io.to_rgba(pixels[start:stop]))


# Images image_from_file made, not yet kept (session_uid: an image the add-on draws again, as
# the memory plot, is packed again by keep).
_made_packed: set[int] = set()


def image_from_file(name: str, made: file_bytes.BandedFile, colorspace: str | None):
    """An image read from ``made``'s finished file (a PNG or float EXR) packed into the .blend:
    neither ``pixels.foreach_set`` (a flipped float copy) nor Blender's pack() (which compresses
    the whole image) runs on the main thread, and Blender decodes the file when the image is first
    shown. Issue #37 items 3 and 10: Blender's main thread spent about a second there for a
    2048x2048 result. Packed at once, undo's memfile and redo keep its pixels (a pack deferred to
    the save would lose them on redo)."""
    data = made.data
    # 1x1: a new image gets a generated buffer of its size at once (64 MiB to fill for a float
    # 2048x2048, 0.07 s), dropped as soon as it reads its file, which gives the size
    image = bpy.data.images.new(name, width=1, height=1, alpha=True, float_buffer=made.is_float)
    try:
        image.pack(data=data, data_len=len(data))
        image.filepath_raw = f"{image.name}{made.suffix}"
        image.source = "FILE"
        if made.is_float:  # as Blender opens an .exr file: its colour is premultiplied, as written
            image.alpha_mode = "PREMUL"
        if colorspace is not None and image.colorspace_settings.name != colorspace:
            image.colorspace_settings.name = colorspace
    except Exception:
        bpy.data.images.remove(image)
        raise
    _made_packed.add(image.session_uid)
    return image


def made_for_output(output: tuple[Path, str] | None, is_float: bool) -> bool:
    """Whether a result like the source (``is_float``: a float one; an image of values is one) is
    made from the file the job's pump writes (:func:`file_like`, :func:`value_file`) even with Save
    Result To set: when that file is the one Save Result To asks for (an 8-bit PNG from a byte
    source, a float EXR from a float one: Blender's writer saves a Non-Color float image's pixels as
    full floats too), its bytes are the saved file (:func:`saved_image`); otherwise the file there
    is another (:class:`OutputFile`, or Blender's writer saves the result, made whole)."""
    return output is None or output[1] == ("OPEN_EXR" if is_float else "PNG")


def saved_image(name: str, made: file_bytes.BandedFile, output: tuple[Path, str], colorspace: str | None):
    """The result image, reading the file at Save Result To, which is ``made``'s bytes written
    there all-or-nothing (models/files.py; by the job's pump, a band a call, when it wrote them there): Blender's writer converted and compressed the whole
    result on the main thread (issue #37 item 3), and its image then read the file back.
    Returns the image and the report's note."""
    path = output[0]
    note = OutputFile(path, made).write()
    image = bpy.data.images.load(str(path), check_existing=False)  # its pixels are read when first shown
    try:
        image.name = name
        if made.is_float:  # as image_from_file: premultiplied colour, as written
            image.alpha_mode = "PREMUL"
        if colorspace is not None and image.colorspace_settings.name != colorspace:
            image.colorspace_settings.name = colorspace
        keep(image, path)
    except Exception:
        bpy.data.images.remove(image)
        raise
    return image, note


class OutputFile:
    """The file at Save Result To in a format the add-on encodes (operators/model_job.py
    file_bytes.product_file) while the result image is made from its own packed file: pumped a band per
    call by the job to a temporary file beside it (model_job.FrameFile), renamed whole by its last call,
    so a cancel before then writes nothing. ``notes``: what the file does not keep
    (result_images.range_notes), said in the report in brackets; None: nothing to say."""

    def __init__(self, path: Path, made: file_bytes.BandedFile, notes: list[str] | None = None):
        self.path, self.made, self.notes = path, made, notes

    def pump(self, budget: float) -> bool:
        return self.made.pump(budget)

    def write(self) -> str:
        try:
            if self.made.written_to != self.path:  # else the job's pump wrote it there as its bands came (model_job.FrameFile)
                files.write_bytes(self.path, self.made.data)
        except OSError as exc:
            raise image_io.ImageSaveError(f"Could not save the result to '{self.path}': {exc}") from exc
        return f"; saved {self.path}" + ("" if self.notes is None else f" ({' '.join(self.notes)})")


def save_result(image, output: tuple[Path, str] | None, saved: OutputFile | None) -> str:
    """:func:`save_output`, or, where the pump encoded the file at Save Result To (``saved``), that
    file written and the image kept as it is (packed from the pump's own file)."""
    if saved is None:
        return save_output(image, output)
    note = saved.write()
    keep(image)
    return note


def save_output(image, output: tuple[Path, str] | None, *, in_place: bool = False) -> str:
    """Save ``image`` to the job's output (if any) and keep it in the .blend (:func:`keep`): it
    reads from that file if the file holds its pixels, else it is packed. A source edited
    ``in_place`` keeps its own file and users: its new pixels are packed. Returns a note for the
    report."""
    path = None
    if output:
        path, file_format = output
        image_io.save_image_atomically(image, path, file_format)
    refer = path is not None and not in_place and _file_holds_pixels(image, file_format)
    keep(image, path if refer else None, result=not in_place)
    return f"; saved {path}" if path else ""


# Formats that give back exactly what a result image holds (byte images: 8 bits a channel,
# alpha kept; float images: EXR), so the datablock can read its pixels from the file.
_EXACT_BYTE_FORMATS = frozenset({"PNG", "TIFF"})


def _file_holds_pixels(image, file_format: str) -> bool:
    if image.is_float:
        return file_format in file_formats.EXR_BLENDER_FORMATS
    return file_format in _EXACT_BYTE_FORMATS


def keep(image, path: Path | None = None, *, result: bool = True) -> None:
    """Make a result survive save, reopen, undo and redo: read from the file it was saved to
    (``path``, ``//``-relative when the .blend is saved and Relative Paths is on), else packed
    into the .blend (a generated image's pixels live only in memory: undo's memfile and a saved
    .blend keep none). A fake user keeps a ``result`` when no editor or material shows it."""
    if result:
        image.use_fake_user = True
    if path is None:
        if image.session_uid in _made_packed:  # by image_from_file, with these very pixels
            _made_packed.discard(image.session_uid)
            return
        # said before packing, as versions differ in what they pick: floats as full-float EXR
        image.file_format = "OPEN_EXR" if image.is_float else "PNG"
        image.use_half_precision = False
        if not image.is_dirty:  # an older Blender's save re-pointed it at a file: pack the pixels
            buffer = np.empty(len(image.pixels), np.float32)
            image.pixels.foreach_get(buffer)
            image.pixels.foreach_set(buffer)
        image.pack()
        if image.is_float:
            reads_packed_exr(image)
        return
    # set explicitly, whatever Image.save did to the datablock (4.2 could leave a FILE image
    # without a path)
    image.filepath_raw = sources.blend_path(path)
    image.source = "FILE"
    image.reload()


def reads_packed_exr(image) -> None:
    """``image`` now holds a packed float EXR of its float buffer as it was: scene-linear colour,
    premultiplied (raw values for data). Its colour space and alpha mode must say so, or Blender
    decodes that file as it decoded the source once the buffer is read again (undo, redo, reopen):
    an EXR or 16-bit PNG tagged sRGB got its colour linearised a second time (red 59 for 4.4), a
    straight one (a 16-bit PNG, a new float image) its colour premultiplied again. A change of
    either drops the buffer: it is read back from the packed file, the same pixels."""
    if image.alpha_mode == "STRAIGHT":  # channel-packed and no-alpha buffers are not premultiplied
        image.alpha_mode = "PREMUL"
    settings = image.colorspace_settings
    if not getattr(settings, "is_data", settings.name == "Non-Color"):  # as image_io.image_info
        linear = scene_linear_colorspace()
        if settings.name != linear:
            settings.name = linear


def scene_linear_colorspace() -> str:
    """The colour space Blender gives a new float image: the blend file's scene-linear working
    space (Linear Rec.709 unless the file picks another), which float buffers hold."""
    probe = bpy.data.images.new("lean_image_ai_linear", width=1, height=1, float_buffer=True)
    try:
        return probe.colorspace_settings.name
    finally:
        bpy.data.images.remove(probe)


# Replace (Remove Background) packs new pixels into the source image itself. Undo and redo bring
# back the datablock (its own file, or the packed cut-out) but leave the pixel buffer Blender had
# in memory, so after Ctrl+Z the image still showed the cut-out until Image > Reload (4.2 to 5.3).
# After each undo and redo, the images Replace changed in this file drop their buffer and read it
# again from what the datablock now says. Never reload(): on a packed image it re-packs the file
# on disk over the packed cut-out.
_replaced: set[str] = set()


def remember_replaced(image) -> None:
    """``image`` had its pixels replaced in place: undo and redo must show its pixels of then."""
    handlers = bpy.app.handlers
    if _renew_replaced not in handlers.undo_post:
        _replaced.clear()  # names of a file loaded before (loading a file drops these handlers)
        handlers.undo_post.append(_renew_replaced)
        handlers.redo_post.append(_renew_replaced)
    _replaced.add(image.name)


def _renew_replaced(*_args) -> None:
    for name in _replaced:
        image = bpy.data.images.get(name)
        if image is not None and not image.is_dirty:  # unsaved paint strokes are the user's: kept
            image.buffers_free()


def forget_replaced() -> None:
    """At unregister: no handler of the add-on stays behind."""
    for handlers in (bpy.app.handlers.undo_post, bpy.app.handlers.redo_post):
        while _renew_replaced in handlers:
            handlers.remove(_renew_replaced)
    _replaced.clear()


def show(context, source, image) -> None:
    """The Image Editors that showed ``source`` show ``image``; ``source`` stays one click away
    in the image browser (with a fake user when the editor was its only user, so a save keeps it)."""
    if source is None or source == image:
        return
    space = getattr(context, "space_data", None)
    screen = getattr(context, "screen", None)
    spaces = [space] if getattr(space, "type", "") == "IMAGE_EDITOR" else []
    spaces += [a.spaces.active for a in getattr(screen, "areas", ()) if a.type == "IMAGE_EDITOR"]
    shown = False
    for editor in spaces:
        if editor.image == source:
            editor.image = image
            shown = True
    if shown and source.users == 0:
        source.use_fake_user = True


class Created:
    """Datablocks made by one ``apply``: all removed again if it fails before the end."""

    def __init__(self):
        self._removals: list[Callable[[], None]] = []

    def add(self, collection, datablock):
        self._removals.append(partial(collection.remove, datablock))
        return datablock

    def add_removal(self, remove: Callable[[], None]) -> None:
        """What is made over later calls (a geometry_ops.MeshSteps' mesh): ``remove()`` drops what there is of it."""
        self._removals.append(remove)

    def remove_all(self) -> None:
        for remove in reversed(self._removals):
            try:
                remove()
            except (ReferenceError, RuntimeError):
                pass
        self._removals.clear()


@contextlib.contextmanager
def created_data():
    created = Created()
    try:
        yield created
    except BaseException:
        created.remove_all()
        raise


def save_product(path: Path, product: result_images.ImageProduct) -> list[str]:
    """Main thread: an image product saved through a temporary datablock, all or nothing. A
    16-bit product goes through a float buffer: Blender writes PNG and TIFF from one with 16 bits.
    Returns what the file does not keep of it, for the report (as the command line's write_image)."""
    is_float = path.suffix.lower() in file_formats.BLENDER_WRITER.float_suffixes or product.bits == "16-bit"
    pixels = product.pixels
    if product.is_data:
        colorspace = "Non-Color"
    else:  # model output: sRGB-encoded, straight alpha
        colorspace = None
        if is_float:
            pixels = colour.from_model_rgb(image_io.to_rgba(pixels), True, premultiplied=True)
    image = image_io.array_to_new_image(path.stem, pixels, float_buffer=is_float, colorspace=colorspace)
    try:
        image_io.save_image_atomically(image, path, file_formats.find(path.suffix).blender_format)
    finally:
        bpy.data.images.remove(image)
    return result_images.range_notes(path, product)
