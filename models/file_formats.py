"""Every file format the add-on reads or writes, one row each (bpy-free).

A row says what the format keeps (alpha, 16-bit, float samples, text metadata), which writers
write it (Pillow and OpenEXR for the command line, Blender inside Blender, the add-on itself for
its data files) and Blender's ``file_format`` names for it; a data file's row holds its writer
(``write``), each file written all or nothing (models/files.py). Every output check and every "use .png, .exr, ..."
message is made from this table, so the command line and Blender never contradict each other.

Read by: models/outputs.py (the families' format checks and their messages),
models/result_images.py (the bits a file keeps), models/batch/frame_lists.py (which files of a folder
are frames), models/batch/image_files.py (the command line's check, writer and input kinds; its writer row gives
models/batch/runner.py the float files), operators/sources.py and operators/batch_ops.py (Blender's output checks, its
``file_format``, the kind of a read frame), operators/image_io.py (the EXR names),
operators/results.py (the format a file is saved as; float files also in image_ops.py,
shot_ops.py, options.py), models/adapters/moge2_mesh.py (its mesh and camera files through
their rows' writers). Adding a format is one row here (and its writer, for a data file).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from . import files

PILLOW, OPENEXR, BLENDER, ADDON = "Pillow", "OpenEXR", "Blender", "the add-on"  # who writes a file
TEXT_CHUNKS, HEADER, COMMENT = "text chunks", "header", "comment"  # where a file keeps text metadata


@dataclass(frozen=True)
class FileFormat:
    suffixes: tuple[str, ...]  # the first is the one messages name
    label: str
    alpha: bool = False
    sixteen_bit: bool = False  # keeps 16-bit samples
    float_samples: bool = False  # its colour samples are float (an input of it is a float input)
    float_by: frozenset[str] = frozenset()  # the writers that keep float values in it (one channel at least)
    writers: frozenset[str] = frozenset()
    blender_formats: tuple[str, ...] = ()  # Blender's Image.file_format names: the one written first
    frames: bool = False  # a folder's files of this format are frames of a sequence
    image: bool = True  # False: a data file the add-on writes beside an image or a mesh
    metadata: str = ""  # where its writers here keep the result's text (value range...); "": nowhere
    write: Callable[..., Path] | None = None  # a data file's writer: write(path, data, ...) -> path

    @property
    def bit_depths(self) -> tuple[str, ...]:
        """The sample kinds a file of it can hold: "8-bit", "16-bit", "float"."""
        kinds = ("8-bit",) + (("16-bit",) if self.sixteen_bit else ())
        return kinds + (("float",) if self.float_samples or self.float_by else ())

    @property
    def blender_format(self) -> str:
        """What Blender saves it as; "" when Blender does not write it here."""
        return self.blender_formats[0] if BLENDER in self.writers else ""


def write_json(path: Path, data) -> Path:
    """``data`` as indented JSON text."""
    return files.write_text(path, json.dumps(data, indent=2))


def write_ply(path: Path, vertices, quads, uv, *, comment: str) -> Path:
    """A binary little-endian PLY mesh: float xyz + uv per vertex, quads as 4-index faces."""
    with files.atomic_path(path) as temp:
        with open(temp, "wb") as stream:
            stream.write(ply_header(len(vertices), len(quads), comment=comment))
            stream.write(ply_vertex_bytes(vertices, uv))
            stream.write(ply_face_bytes(quads))
    return path


def ply_header(vertex_count: int, face_count: int, *, comment: str) -> bytes:
    """:func:`write_ply`'s header; its vertices and faces follow, each part of either in order
    (a mesh made a band at a time gives the same file)."""
    return (
        f"ply\nformat binary_little_endian 1.0\ncomment {comment}\n"
        f"element vertex {vertex_count}\nproperty float x\nproperty float y\nproperty float z\n"
        "property float s\nproperty float t\n"
        f"element face {face_count}\nproperty list uchar int vertex_indices\nend_header\n"
    ).encode("ascii")


def ply_vertex_bytes(vertices, uv) -> bytes:
    import numpy as np  # a data file's writer only: the table itself is read where numpy need not be

    vertex = np.empty(len(vertices), [("xyz", "<f4", 3), ("uv", "<f4", 2)])
    vertex["xyz"], vertex["uv"] = vertices, uv
    return vertex.tobytes()


def ply_face_bytes(quads) -> bytes:
    import numpy as np

    face = np.empty(len(quads), [("n", "u1"), ("v", "<i4", 4)])
    face["n"], face["v"] = 4, quads
    return face.tobytes()


_ANY = frozenset({PILLOW, OPENEXR, BLENDER})

FORMATS: tuple[FileFormat, ...] = (
    FileFormat((".png",), "PNG", alpha=True, sixteen_bit=True, writers=frozenset({PILLOW, BLENDER}),
               blender_formats=("PNG",), frames=True, metadata=TEXT_CHUNKS),
    FileFormat((".exr",), "EXR", alpha=True, float_samples=True, float_by=frozenset({OPENEXR, BLENDER}),
               writers=frozenset({OPENEXR, BLENDER}), blender_formats=("OPEN_EXR", "OPEN_EXR_MULTILAYER"),
               frames=True, metadata=HEADER),
    FileFormat((".jpg", ".jpeg"), "JPEG", writers=frozenset({PILLOW, BLENDER}), blender_formats=("JPEG",), frames=True,
               metadata=COMMENT),
    # Pillow keeps one float channel in a TIFF; Blender's TIFF writer is 8/16-bit
    FileFormat((".tif", ".tiff"), "TIFF", alpha=True, sixteen_bit=True, float_by=frozenset({PILLOW}),
               writers=frozenset({PILLOW, BLENDER}), blender_formats=("TIFF",), frames=True),
    FileFormat((".webp",), "WebP", alpha=True, writers=frozenset({PILLOW}), blender_formats=("WEBP",), frames=True),
    FileFormat((".bmp",), "BMP", writers=frozenset({PILLOW}), blender_formats=("BMP",), frames=True),
    FileFormat((".tga",), "Targa", alpha=True, writers=frozenset({PILLOW}), blender_formats=("TARGA",), frames=True),
    FileFormat((".hdr",), "Radiance HDR", float_samples=True, float_by=_ANY, blender_formats=("HDR",), frames=True),
    # read by Blender (an image datablock's file), never written here
    FileFormat((".dpx",), "DPX", blender_formats=("DPX",)),
    FileFormat((".cin",), "Cineon", blender_formats=("CINEON",)),
    FileFormat((".jp2", ".j2c"), "JPEG 2000", blender_formats=("JPEG2000",)),
    FileFormat((".sgi", ".rgb"), "Iris", blender_formats=("IRIS",)),
    # data files a family writes itself, through the row's writer (a family's Output.write)
    FileFormat((".ply",), "PLY mesh", writers=frozenset({ADDON}), image=False, write=write_ply),
    FileFormat((".json",), "JSON", writers=frozenset({ADDON}), image=False, write=write_json),
)

_BY_SUFFIX = {suffix: row for row in FORMATS for suffix in row.suffixes}


def find(suffix: str) -> FileFormat | None:
    return _BY_SUFFIX.get(suffix.lower())


@dataclass(frozen=True)
class Writer:
    """A front-end's writers: which rows it can write, and where it keeps float values."""

    name: str
    libraries: frozenset[str]

    def writes(self, suffix: str) -> bool:
        return bool(self.library(suffix))

    def library(self, suffix: str) -> str:
        """Which of its libraries writes ``suffix`` ("" when none does)."""
        row = find(suffix)
        found = sorted(row.writers & (self.libraries | {ADDON})) if row else []
        return found[0] if found else ""

    @cached_property  # read for every frame written: made once (the table never changes)
    def float_suffixes(self) -> frozenset[str]:
        return frozenset(s for row in FORMATS if row.float_by & self.libraries for s in row.suffixes)

    def advice(self, *, alpha: bool = False) -> str:
        """The suffixes to suggest in a message, e.g. ".png, .exr, .jpg or .tif"."""
        return _listed(
            row.suffixes[0]
            for row in FORMATS
            if row.image and row.writers & self.libraries and (row.alpha or not alpha)
        )


COMMAND_LINE = Writer("the command line", frozenset({PILLOW, OPENEXR}))
BLENDER_WRITER = Writer("Blender", frozenset({BLENDER}))

FRAME_SUFFIXES: tuple[str, ...] = tuple(s for row in FORMATS if row.frames for s in row.suffixes)
IMAGE_SUFFIXES: frozenset[str] = frozenset(s for row in FORMATS if row.image for s in row.suffixes)
# Blender's file_format of a read image whose samples are float (16-bit PNG/TIFF load as float too)
BLENDER_FLOAT_FILES: frozenset[str] = frozenset(n for row in FORMATS if row.float_samples for n in row.blender_formats)
EXR_BLENDER_FORMATS: frozenset[str] = frozenset(find(".exr").blender_formats)


def keeping(bits: str) -> str:
    """The first suffix of the table whose files keep ``bits`` ("16-bit" or "float") and that every
    front-end writes, for notes such as "write .png (16-bit) or .exr (float)"."""
    both = COMMAND_LINE.libraries | BLENDER_WRITER.libraries
    for row in FORMATS:
        keeps = row.sixteen_bit if bits == "16-bit" else row.float_samples and row.float_by & BLENDER_WRITER.libraries
        if row.image and keeps and BLENDER in row.writers and row.writers & both - {BLENDER}:
            return row.suffixes[0]
    raise ValueError(f"no format keeps {bits} samples")


KEEP_BITS = f"write {keeping('16-bit')} (16-bit) or {keeping('float')} (float)"


def _listed(items: Iterable[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"
