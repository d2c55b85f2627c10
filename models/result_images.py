"""How a result becomes an image file's pixels and bits, for every front-end (bpy-free), and what a
family's result is as files.

A family's :class:`~.family.Output` names its :class:`ProductKind` (a mask, depth, an image, a
mesh), which gives its default formats and, for an image, one of the two images here (a colour
image, an image of values); models/outputs.py plans the files and the front-end's writer encodes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import file_formats


@dataclass
class ImageProduct:
    pixels: np.ndarray  # HxW (one channel) or HxWxC float32
    is_data: bool  # values, not colour: no colour transform, linear
    value_range: tuple[float, float] | None = None  # what 0..1 stands for when normalised
    bits: str = "8-bit"  # what the file keeps: "8-bit", "16-bit" or "float" (output_bits)
    input_kind: str = "8-bit"  # what the source's samples were
    metadata: dict[str, str] = field(default_factory=dict)  # text for the file (PNG chunk, EXR header)
    # colours above 1 not counted yet (CLIPPED_ON_WRITE still to come): a writer that pulls the
    # pixels a band per call counts them in those bands (ClippedCount), not in one call over all of them
    clip_uncounted: bool = False


CLIPPED_FOR_MODEL = "lean_image_ai:clipped_for_model"  # metadata keys: what a written file lost, in words
CLIPPED_ON_WRITE = "lean_image_ai:clipped_on_write"
INPUT_KINDS = ("8-bit", "16-bit", "float")  # what an input image's samples are
FLOAT_SUFFIXES = file_formats.COMMAND_LINE.float_suffixes  # the command line's writers' float files


def output_bits(suffix: str, input_kind: str, float_suffixes=FLOAT_SUFFIXES) -> str:
    """What a file of ``suffix`` keeps of an ``input_kind`` source: "float", "16-bit" or "8-bit"."""
    row = file_formats.find(suffix)
    if row is not None and row.float_samples and suffix.lower() in float_suffixes:
        return "float"
    if input_kind != "8-bit" and row is not None and row.sixteen_bit:
        return "16-bit"
    return "8-bit"


@dataclass(frozen=True)
class ColourImage:
    """A colour result (``result.<attribute>``, HxWxC in 0..1), written with the source's bits."""

    attribute: str

    def product(self, result, suffix: str, float_suffixes=FLOAT_SUFFIXES, *, count_clipped: bool = True) -> ImageProduct:
        """``count_clipped`` False: the colours above 1 are left for the writer to count a band at a
        time (:class:`ClippedCount`); the product says so (``clip_uncounted``)."""
        kind = getattr(result, "input_kind", "8-bit")
        pixels = getattr(result, self.attribute)
        bits = output_bits(suffix, kind, float_suffixes)
        metadata = {}
        if getattr(result, "clipped", None):
            metadata[CLIPPED_FOR_MODEL] = result.clipped
        product = ImageProduct(pixels, is_data=False, bits=bits, input_kind=kind, metadata=metadata)
        if bits != "float":
            if count_clipped:
                record_clipped(product, suffix, _above_one(pixels))
            else:
                product.clip_uncounted = True
        return product

    def describe(self, suffix: str, input_kind: str, float_suffixes=FLOAT_SUFFIXES) -> str:
        bits = output_bits(suffix, input_kind, float_suffixes)
        text = f"{bits} {suffix.lstrip('.').upper()}"
        if bits != "8-bit" and input_kind != "8-bit":
            text += f" (follows the {input_kind} input)"
        return text


@dataclass(frozen=True)
class ValueImage:
    """One channel of values (``result.<attribute>``, e.g. depth): kept as float where the file
    holds float, else normalised to 0..1 and the range it was mapped from recorded."""

    attribute: str

    def product(self, result, suffix: str, float_suffixes=FLOAT_SUFFIXES) -> ImageProduct:
        values = np.asarray(getattr(result, self.attribute), np.float32)
        if suffix.lower() in float_suffixes:
            return ImageProduct(values, is_data=True, bits="float")
        low, high = float(values.min()), float(values.max())
        span = high - low
        normalised = (values - low) / span if span > 0 else np.zeros_like(values)
        bits = output_bits(suffix, "float", float_suffixes)  # normalised: as many bits as the file holds
        return ImageProduct(normalised.astype(np.float32), is_data=True, value_range=(low, high), bits=bits)

    def describe(self, suffix: str, input_kind: str, float_suffixes=FLOAT_SUFFIXES) -> str:
        if suffix.lower() in float_suffixes:
            bits = "float"
        else:
            row = file_formats.find(suffix)
            bits = "16-bit normalised" if row is not None and row.sixteen_bit else "8-bit normalised"
        return f"{bits} {suffix.lstrip('.').upper()}"


@dataclass(frozen=True)
class ProductKind:
    """What a family's result is, as files see it: the defaults of its Output record (a field the
    record gives itself wins). An image kind reads the result's attribute of its name."""

    name: str
    suffix: str  # the default format for an 8- or 16-bit input
    float_suffix: str = ""  # the default format for a float input ("": ``suffix``)
    formats: tuple[str, ...] = ()  # the only suffixes it can be written to; (): any image format
    needs_alpha: bool = False  # the result is the alpha: formats without alpha are refused
    image: ColourImage | ValueImage | None = None  # None: not one image (the family writes its files)


# float inputs give EXR: the float file that holds colour and alpha for every writer (models/outputs.py)
MASK = ProductKind("mask", ".png", ".exr", needs_alpha=True, image=ColourImage("rgba"))  # a cut-out: the matte as alpha
DEPTH = ProductKind("depth", ".exr", image=ValueImage("depth"))
IMAGE = ProductKind("image", ".png", ".exr", image=ColourImage("image"))
MESH = ProductKind("mesh", ".ply", formats=(".ply",))


def range_notes(path: Path, product: ImageProduct) -> list[str]:
    """What the file does not keep of the result, for the report."""
    notes = []
    if CLIPPED_ON_WRITE in product.metadata:
        notes.append(f"{path.name}: {product.metadata[CLIPPED_ON_WRITE]}")
    if product.input_kind != "8-bit" and product.bits == "8-bit":
        return notes + [
            f"{path.name}: the input has {product.input_kind} samples but {path.suffix.lstrip('.').upper()} "
            f"holds 8 bits; {file_formats.KEEP_BITS} to keep them."
        ]
    if product.value_range is None:
        return notes
    low, high = product.value_range
    return notes + [f"{path.name}: values {low:.6g}..{high:.6g} were mapped to 0..1 (write .exr to keep them)."]


def record_clipped(product: ImageProduct, suffix: str, over: tuple[int, float] | None) -> None:
    """The product's note of its colours above 1 (``over``: their count and the highest), now counted."""
    product.clip_uncounted = False
    if over:
        product.metadata[CLIPPED_ON_WRITE] = (
            f"{over[0]} pixel(s) above 1 (highest {over[1]:.6g}) were clipped to 1: a {product.bits} "
            f"{suffix.lstrip('.').upper()} holds [0, 1] (write .exr to keep them)."
        )


def count_clipped(product: ImageProduct, suffix: str) -> None:
    """Count now the colours above 1 a product left uncounted (a writer that takes it whole)."""
    if product.clip_uncounted:
        record_clipped(product, suffix, _above_one(product.pixels))


class ClippedCount:
    """:func:`_above_one` of a colour result counted over its bands as a writer pulls them, so no
    call reads every pixel (a 7680x4320 RGBA float result: 0.2 s in one call, issue #37 item 3)."""

    def __init__(self):
        self.pixels, self.top = 0, 0.0

    def add(self, band) -> None:
        over = _above_one(band)
        if over:
            self.pixels += over[0]
            self.top = max(self.top, over[1])

    @property
    def over(self) -> tuple[int, float] | None:
        return (self.pixels, self.top) if self.pixels else None


def _above_one(pixels) -> tuple[int, float] | None:
    """(pixels with a colour above 1, the highest value) of a colour result; None when none is."""
    colour = np.asarray(pixels)[..., :3]
    top = float(colour.max()) if colour.size else 0.0
    if not top > 1.0:
        return None
    return int((colour > 1.0).any(axis=-1).sum()), top
