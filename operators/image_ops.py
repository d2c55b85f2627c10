"""Image operators: remove background (BEN2), estimate depth (DA3), upscale (bpy), and the
operator of any other family whose result is one image, made from its record.

Each is a `ModelJobOperator` (operators/model_job.py) that adds only what its result needs:
`apply` creates the result image (main thread). A family that names an ``operator`` and has an
image output but no class here gets :class:`FamilyImageOperator` (:func:`made_from_records`).
"""

# No ``from __future__ import annotations``: Blender reads property annotations as objects.
import bpy
import numpy as np

from ..models import colour, families, file_bytes, file_formats, result_images
from ..models.adapters import ben2, da3, upscale
from ..models.outputs import OutputPolicy
from ..runtime.errors import InvalidImageError
from . import geometry_ops, image_io, results
from .model_job import ModelJobOperator
from .options import operator_idname, with_family_options


@with_family_options(ben2.FAMILY)
class LEAN_IMAGE_AI_OT_remove_background(ModelJobOperator, bpy.types.Operator):
    """Cut the subject out of an image with BEN2 (the background becomes transparent)"""

    bl_description = (
        "Cut the subject out of the image with BEN2: a new '<image>_cutout' image whose alpha is "
        "the subject's matte (or the source image itself with Replace)"
    )

    def keeps_source(self):
        return self.replace

    def gather(self, context, job):
        inputs = super().gather(context, job)
        if self.replace and inputs.info.channels < 4:
            raise InvalidImageError(
                f"Image '{inputs.info.name}' has no alpha channel, so Replace cannot store the "
                "cut-out in it. Turn Replace off to get a new image with alpha."
            )
        return inputs

    def save_file(self, inputs, result):
        rows = _cutout_rows(inputs.info, inputs.rgba, result.rgba)
        if not inputs.options["replace"]:
            return _colour_output_file(inputs, inputs.rgba.shape, rows)
        return _replaced_output_file(inputs, rows) if _cutout_packs_into(inputs) else None

    def encode(self, inputs, result):
        if inputs.options["replace"]:
            if not _packs_cutout_in_place(inputs):
                return None
        elif inputs.saved is None and not results.made_for_output(inputs.output, inputs.info.is_float):
            return None
        cutout = _cutout_rows(inputs.info, inputs.rgba, result.rgba)
        return results.file_like(inputs.rgba.shape, cutout, inputs.info)

    def apply(self, context, inputs, result):
        info = inputs.info
        if inputs.options["replace"]:
            if inputs.encoded is not None and _packs_cutout_in_place(inputs):
                note = _write_replaced_output(inputs)  # first: a failed write leaves the source as it was
                return _swap_in_cutout(inputs.source, inputs.encoded) + note
            source_rgba = inputs.rgba
            straight = _cutout_rows(info, source_rgba, result.rgba)(0, source_rgba.shape[0])
            image = inputs.source
            out = colour.premultiply(straight) if info.premultiplied else straight
            image_io.write_array_to_image(image, out)
            image.update()  # before the pack: a float image's may drop this buffer (results.reads_packed_exr)
            try:
                note = results.save_output(image, inputs.output, in_place=True)
            except BaseException:
                image_io.write_array_to_image(image, source_rgba)  # as it was
                raise
            results.remember_replaced(image)
            return f"Removed the background of '{image.name}' in place{note}"
        name = f"{inputs.stem}_cutout"
        with results.created_data() as created:
            image, note = _saved_colour_image(created, name, _cutout_rows(info, inputs.rgba, result.rgba), inputs)
        results.show(context, inputs.source, image)
        kept = float((result.matte > 0.5).mean())
        return f"Removed the background: '{image.name}' ({kept:.0%} of the pixels kept){note}"


def _packs_cutout_in_place(inputs) -> bool:
    """Whether Replace's cut-out can be the file the job's pump writes (results.file_like), packed
    into the source as its file (:func:`_cutout_packs_into`), with Save Result To, if set, asking
    for that very file (an 8-bit PNG from a byte source, a float EXR from a float one:
    results.made_for_output) or one the pump encoded too (``inputs.saved``, as for a new cut-out).
    Other outputs (a byte source as EXR, a float one as PNG, ...) take the cut-out's pixels whole
    in ``apply``, saved and packed by Blender's writer."""
    if not _cutout_packs_into(inputs):
        return False
    output = inputs.output
    return output is None or inputs.saved is not None or results.made_for_output(output, inputs.info.is_float)


def _cutout_packs_into(inputs) -> bool:
    """Whether the source can read the pump's cut-out file packed as its own: an image read from
    one file, a byte one with straight alpha (an 8-bit PNG) or a float one with premultiplied
    colour (a 32-bit float EXR, as Blender's pack() wrote it: EXR, 16-bit PNG, ...). Other sources
    (generated, byte with premultiplied alpha, channel-packed alpha) take the cut-out's pixels
    whole in ``apply``, packed by Blender's writer."""
    image, info = inputs.source, inputs.info
    try:
        from_one_file = image is not None and image.source == "FILE"
    except ReferenceError:  # removed while the job ran: the apply says so in the job's own words
        return False
    if not from_one_file:
        return False
    return info.premultiplied if info.is_float else info.alpha_mode == "STRAIGHT"


def _replaced_output_file(inputs, rows):
    """The file at Save Result To of a Replace the pump encodes apart from the cut-out packed into
    the source: :func:`_colour_output_file`'s, or a half-float EXR where Blender's writer saved the
    source's colour so (its use_half_precision, as image_io.save_image_atomically says; a Non-Color
    image's values it saved as full floats all the same, measured with bpy 5.0.1)."""
    output, info, (height, width) = inputs.output, inputs.info, inputs.rgba.shape[:2]
    exr = output is not None and output[1] == "OPEN_EXR" and info.is_float
    if not (exr and not info.is_data and inputs.source.use_half_precision):
        return _colour_output_file(inputs, inputs.rgba.shape, rows)
    half = file_bytes.ExrFile(height, width, lambda start, stop: colour.premultiply(rows(start, stop)), half=True)
    return results.OutputFile(output[0], half)


def _write_replaced_output(inputs) -> str:
    """The file at Save Result To of a Replace, written whole by the add-on's atomic writer: the
    one the pump encoded for it, else the cut-out's own file (the format asked for). Returns the
    report's note."""
    if inputs.saved is not None:
        return inputs.saved.write()
    if inputs.output is None:
        return ""
    return results.OutputFile(inputs.output[0], inputs.encoded).write()


def _swap_in_cutout(image, made) -> str:
    """The source reads the cut-out's finished file, packed into the .blend: no call of Blender's
    main thread writes its pixels and compresses them whole (issue #37 item 3: 0.5 s at 2048x2048);
    Blender decodes the file when the image is next shown. Undo and redo: as the old path's pack
    (results.remember_replaced)."""
    # the same file written at Save Result To a band per call has its bytes there, not in memory
    data = made.data if made.data is not None else made.written_to.read_bytes()
    image.pack(data=data, data_len=len(data))
    if made.is_float:  # what it holds now, as results.keep says for a packed float image
        image.file_format, image.use_half_precision = "OPEN_EXR", False
        results.reads_packed_exr(image)
    else:
        image.file_format = "PNG"
    image.buffers_free()  # the buffer of the source's pixels: read again from the packed cut-out
    results.remember_replaced(image)
    return f"Removed the background of '{image.name}' in place"


def _cutout_rows(info, source_rgba, matte_rgba):
    """Rows of the cut-out: the source's colour, straight, with the matte as alpha."""

    def rows(start: int, stop: int):
        band = source_rgba[start:stop]
        straight = colour.unpremultiply(band) if info.premultiplied else band.copy()
        # the model saw NaN/Inf replaced (see its warning); the cut-out must not keep them either
        np.nan_to_num(straight, copy=False, nan=0.0, posinf=1.0, neginf=0.0)
        straight[..., 3] = matte_rgba[start:stop, ..., 3]
        return straight

    return rows


@with_family_options(da3.FAMILY)
class LEAN_IMAGE_AI_OT_estimate_depth(ModelJobOperator, bpy.types.Operator):
    """Estimate a depth map with Depth Anything 3"""

    bl_description = (
        "Estimate depth with Depth Anything 3: a float 'Non-Color' image '<image>_depth' (depth in "
        "every colour channel), optionally a displaced plane that shows it in 3D"
    )

    def save_file(self, inputs, result):
        return _values_output_file(da3.FAMILY, da3.DepthResult(np.asarray(result.depth, np.float32)), inputs.output)

    def encode(self, inputs, result):
        return _value_file(inputs, result.depth)

    def apply(self, context, inputs, result):
        depth = np.asarray(result.depth, np.float32)
        stem = inputs.stem
        with results.created_data() as created:
            image, note = _saved_values_image(created, da3.FAMILY, f"{stem}_depth", da3.DepthResult(depth), inputs)
            plane = None
            if inputs.options["make_plane"]:
                plane = geometry_ops.make_depth_plane(context, created, f"{stem}_depth_plane", image, depth)
        results.show(context, inputs.source, image)
        low, high = float(depth.min()), float(depth.max())
        summary = f"Depth '{image.name}' ({depth.shape[1]}x{depth.shape[0]}, {low:.3g} to {high:.3g})"
        if plane is not None:
            summary += f", plane '{plane.name}'"
        return summary + note


def _value_file(inputs, values):
    """The packed EXR of an image of values, which is also the file at Save Result To when that is
    an EXR (results.made_for_output); None: the image is made whole (Blender's writer saves it)."""
    if inputs.saved is None and not results.made_for_output(inputs.output, True):
        return None
    return results.value_file(values)


def _saved_values_image(created, family, name: str, result, inputs, values=None):
    """The image of ``result``'s values (``values``, else its depth) and the report's note: reading
    the EXR the pump wrote at Save Result To, else as :func:`_values_image` makes it, saved by
    :func:`_save_values`."""
    values = result.depth if values is None else values
    if inputs.encoded is not None and inputs.output and inputs.saved is None:
        image, note = results.saved_image(name, inputs.encoded, inputs.output, "Non-Color")
        return created.add(bpy.data.images, image), note
    image = created.add(bpy.data.images, _values_image(name, values, inputs.encoded))
    return image, _save_values(family, image, result, inputs)


def _values_image(name: str, values, encoded):
    """A float 'Non-Color' image of ``values`` in every colour channel: from the packed file the
    pump wrote (``encoded``), else whole (a result saved to a file)."""
    if encoded is not None:
        return results.image_from_file(name, encoded, "Non-Color")
    values = np.asarray(values, np.float32)
    rgba = np.ones((*values.shape[:2], 4), np.float32)
    rgba[..., :3] = values.reshape(*values.shape[:2], -1)[..., :3]
    return image_io.array_to_new_image(name, rgba, float_buffer=True, colorspace="Non-Color")


def _values_product(family, result, output):
    """What a file at Save Result To keeps of an image of values (models/outputs.py's policy):
    None for EXR, which keeps them as they are (the image saved); another format gets them
    normalised to 0..1, and the note says from which range."""
    if not output or output[0].suffix.lower() in file_formats.BLENDER_WRITER.float_suffixes:
        return None
    return OutputPolicy.of(family.id, file_formats.BLENDER_WRITER).image(result, output[0].suffix)


def _values_output_file(family, result, output):
    """The normalised values at Save Result To, where the add-on encodes that file."""
    product = _values_product(family, result, output)
    made = None if product is None else file_bytes.product_file(output[0], product)
    if made is None:
        return None
    return results.OutputFile(output[0], made, result_images.range_notes(output[0], product))


def _save_values(family, image, result, inputs) -> str:
    output = inputs.output
    if inputs.saved is not None:
        return results.save_result(image, output, inputs.saved)
    product = _values_product(family, result, output)
    if product is None:
        return results.save_output(image, output)
    path = output[0]
    notes = results.save_product(path, product)
    results.keep(image)  # the file holds the depth normalised: the image keeps the values, packed
    return f"; saved {path} ({' '.join(notes)})"


@with_family_options(upscale.FAMILY)
class LEAN_IMAGE_AI_OT_upscale(ModelJobOperator, bpy.types.Operator):
    """Upscale an image with a super-resolution model"""

    bl_label = "Upscale Image"
    bl_description = (
        "Upscale the image with a super-resolution model (Real-ESRGAN or your own; the built-in "
        "bicubic x2 when none is installed): a new '<image>_x<scale>' image"
    )

    def save_file(self, inputs, result):
        return _colour_output_file(inputs, result.image.shape, _model_rows(result.image, inputs.info))

    def encode(self, inputs, result):
        if inputs.saved is None and not results.made_for_output(inputs.output, inputs.info.is_float):
            return None
        return results.file_like(result.image.shape, _model_rows(result.image, inputs.info), inputs.info)

    def apply(self, context, inputs, result):
        name = f"{inputs.stem}_x{result.scale}"
        with results.created_data() as created:
            image, note = _saved_colour_image(created, name, _model_rows(result.image, inputs.info), inputs)
        results.show(context, inputs.source, image)
        height, width = result.image.shape[:2]  # image.size would decode a packed result here
        return f"Upscaled x{result.scale} to '{image.name}' ({width}x{height}){note}"


def _model_rows(pixels, info):
    """Rows of a model's colour result (sRGB, straight; 3 channels when the source had no alpha)
    in the source's encoding."""
    return lambda start, stop: colour.from_model_rgb(image_io.to_rgba(pixels[start:stop]), info.is_linear)


def _saved_colour_image(created, name: str, rows, inputs):
    """The image of a colour result (``rows``: its straight rows, :func:`_model_rows` or
    :func:`_cutout_rows`) and the report's note: read from the file the pump wrote, saved at Save
    Result To where that is the file it asks for, else packed (the file at Save Result To, if any,
    the pump's too: inputs.saved); or made whole and saved by Blender's writer."""
    colorspace = results.colorspace(inputs.info)
    if inputs.encoded is not None and inputs.output and inputs.saved is None:
        image, note = results.saved_image(name, inputs.encoded, inputs.output, colorspace)
        return created.add(bpy.data.images, image), note
    if inputs.encoded is not None:
        image = created.add(bpy.data.images, results.image_from_file(name, inputs.encoded, colorspace))
    else:
        image = created.add(bpy.data.images, results.new_image_like(name, rows(0, None), inputs.info))
    return image, results.save_result(image, inputs.output, inputs.saved)


class _RowsOf:
    """Rows made when a band is sliced out, as file_bytes.product_file reads a product's pixels."""

    def __init__(self, shape, rows):
        self.shape, self._rows = shape, rows

    def __getitem__(self, band: slice):
        return self._rows(band.start, band.stop)


def _colour_output_file(inputs, shape, rows):
    """The file at Save Result To of a colour result (``rows``: the result image's straight rows)
    where the add-on encodes it as Blender's writer saves the image (file_bytes.product_file): a
    byte source's result, whose image holds these rows as bytes, in a format other than the 8-bit
    PNG the image itself reads (results.made_for_output). None: Blender's writer saves the image (a
    float result in a format other than EXR, a byte one as EXR or a format the add-on does not write)."""
    output, info = inputs.output, inputs.info
    if output is None or info.is_float or results.made_for_output(output, False):
        return None
    made = file_bytes.product_file(output[0], result_images.ImageProduct(_RowsOf(shape, rows), is_data=False))
    return None if made is None else results.OutputFile(output[0], made)


def _size(image, pixels) -> tuple[int, int]:
    """Width and height of a result; one read from a file (packed, or saved at Save Result To)
    from its pixels, as ``image.size`` would decode the file on Blender's main thread (the editor
    does that when it first shows it)."""
    if image.source == "FILE":
        return pixels.shape[1], pixels.shape[0]
    return tuple(image.size)


class FamilyImageOperator(ModelJobOperator):
    """The operator of a family whose result is one image, when the add-on writes none by hand:
    a new image ``<image>_<tag>`` (the family's output tag), saved where Save Result To says."""

    def _product(self, result):
        # the whole values: a float file's product never clips or normalises
        return self.family.output.image.product(result, ".exr", file_formats.BLENDER_WRITER.float_suffixes)

    def save_file(self, inputs, result):
        product = self._product(result)
        if product.is_data:
            return _values_output_file(self.family, result, inputs.output)
        return _colour_output_file(inputs, np.shape(product.pixels), _model_rows(product.pixels, inputs.info))

    def encode(self, inputs, result):
        product = self._product(result)
        if product.is_data:
            return _value_file(inputs, product.pixels)
        if inputs.saved is None and not results.made_for_output(inputs.output, inputs.info.is_float):
            return None
        return results.file_like(np.shape(product.pixels), _model_rows(product.pixels, inputs.info), inputs.info)

    def apply(self, context, inputs, result):
        family = self.family
        product = self._product(result)
        name = f"{inputs.stem}_{family.output.tag}"
        with results.created_data() as created:
            if product.is_data:
                image, note = _saved_values_image(created, family, name, result, inputs, product.pixels)
            else:
                image, note = _saved_colour_image(created, name, _model_rows(product.pixels, inputs.info), inputs)
        results.show(context, inputs.source, image)
        width, height = _size(image, product.pixels)
        return f"{family.action}: '{image.name}' ({width}x{height}){note}"


_MADE: dict = {}  # family id -> its class: register and unregister must see the same class


def made_from_records(written) -> tuple:
    """A class for every registered family that names an operator, has an image output and has
    no class among ``written`` (the add-on's own operators)."""
    have = {getattr(cls, "bl_idname", "") for cls in written}
    made = []
    for family in families.ALL:
        image = family.output.image if family.output is not None else None
        if not family.operator or image is None or operator_idname(family) in have:
            continue
        if getattr(_MADE.get(family.id), "family", None) is not family:
            name = f"LEAN_IMAGE_AI_OT_{family.operator}"
            _MADE[family.id] = with_family_options(family)(type(name, (FamilyImageOperator, bpy.types.Operator), {}))
        made.append(_MADE[family.id])
    return tuple(made)


classes = (
    LEAN_IMAGE_AI_OT_remove_background,
    LEAN_IMAGE_AI_OT_estimate_depth,
    LEAN_IMAGE_AI_OT_upscale,
)


def pre_unregister() -> None:
    results.forget_replaced()
