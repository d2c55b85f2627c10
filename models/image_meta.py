"""What an image file says about itself beyond its pixels, read from its header (bpy-free, no
Pillow: Blender ships neither Pillow nor an EXIF reader, and Blender 5.0 does not apply EXIF
orientation itself, checked with bpy 5.0.1).

- :func:`exif_orientation`: the EXIF Orientation tag (1..8) of a JPEG, PNG (eXIf) or WebP file;
  :func:`upright` turns an array the way the tag says, as image viewers show the photo;
- :func:`tiff_pages`: how many pages (IFDs) a TIFF holds; only the first is read;
- :func:`exr_pixels`: how many pixels an OpenEXR file's data windows declare, from its header
  alone (the decompression-bomb limit is checked before the library allocates any of them);
- :func:`header_kind`: the kind of samples ("float", "16-bit", "8-bit") Blender's load of the
  file gives, told without decoding it (a 4K EXR's decode is a second on Blender's main thread).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

ORIENTATION_TAG = 0x0112
_MAX_HEADER_BYTES = 1 << 20  # EXIF lives in the first segments; never read a whole large file


def _tiff_orientation(data: bytes) -> int:
    """The Orientation tag of IFD0 in a TIFF-structured block (EXIF's payload), else 1."""
    if len(data) < 8 or data[:2] not in (b"II", b"MM"):
        return 1
    order = "<" if data[:2] == b"II" else ">"
    offset = struct.unpack(order + "I", data[4:8])[0]
    if offset + 2 > len(data):
        return 1
    count = struct.unpack(order + "H", data[offset : offset + 2])[0]
    for index in range(count):
        entry = offset + 2 + 12 * index
        if entry + 12 > len(data):
            break
        tag, kind = struct.unpack(order + "HH", data[entry : entry + 4])
        if tag == ORIENTATION_TAG and kind == 3:  # SHORT, stored in the entry itself
            value = struct.unpack(order + "H", data[entry + 8 : entry + 10])[0]
            return value if 1 <= value <= 8 else 1
    return 1


def _jpeg_exif(data: bytes) -> bytes:
    position = 2
    while position + 4 <= len(data) and data[position] == 0xFF:
        marker = data[position + 1]
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no EXIF after this
            break
        length = struct.unpack(">H", data[position + 2 : position + 4])[0]
        body = data[position + 4 : position + 2 + length]
        if marker == 0xE1 and body.startswith(b"Exif\x00\x00"):
            return body[6:]
        position += 2 + length
    return b""


def _png_exif(data: bytes) -> bytes:
    position = 8
    while position + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        if kind == b"eXIf":
            return data[position + 8 : position + 8 + length]
        if kind == b"IEND":
            break
        position += 12 + length
    return b""


def _webp_exif(data: bytes) -> bytes:
    position = 12
    while position + 8 <= len(data):
        kind, length = struct.unpack("<4sI", data[position : position + 8])
        if kind == b"EXIF":
            body = data[position + 8 : position + 8 + length]
            return body[6:] if body.startswith(b"Exif\x00\x00") else body
        position += 8 + length + (length & 1)
    return b""


def exif_orientation(path: str | Path) -> int:
    """The file's EXIF orientation, 1 (upright) when it has none or cannot be read."""
    try:
        with open(path, "rb") as stream:
            data = stream.read(_MAX_HEADER_BYTES)
    except OSError:
        return 1
    if data.startswith(b"\xff\xd8"):
        block = _jpeg_exif(data)
    elif data.startswith(b"\x89PNG\r\n\x1a\n"):
        block = _png_exif(data)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        block = _webp_exif(data)
    else:
        return 1  # TIFF's own tag is the reader's business; other formats have none
    return _tiff_orientation(block)


def upright(array: np.ndarray, orientation: int) -> np.ndarray:
    """``array`` (rows top first) turned as EXIF ``orientation`` says it is displayed."""
    turns = {
        2: lambda a: a[:, ::-1],  # mirrored left-right
        3: lambda a: a[::-1, ::-1],  # upside down
        4: lambda a: a[::-1],  # mirrored top-bottom
        5: lambda a: a.swapaxes(0, 1),  # mirrored along the main diagonal
        6: lambda a: np.rot90(a, -1),  # stored turned a quarter left: turn it right
        7: lambda a: a[::-1, ::-1].swapaxes(0, 1),  # mirrored along the other diagonal
        8: lambda a: np.rot90(a, 1),
    }
    turn = turns.get(orientation)
    return array if turn is None else np.ascontiguousarray(turn(array))


def tiff_pages(path: str | Path, limit: int = 1000) -> int:
    """How many images (IFDs) a TIFF file chains; 1 for anything else or a damaged chain."""
    try:
        with open(path, "rb") as stream:
            header = stream.read(8)
            if len(header) < 8 or header[:2] not in (b"II", b"MM"):
                return 1
            order = "<" if header[:2] == b"II" else ">"
            if struct.unpack(order + "H", header[2:4])[0] != 42:
                return 1  # BigTIFF (43) and others: not counted
            offset, pages, seen = struct.unpack(order + "I", header[4:8])[0], 0, set()
            while offset and offset not in seen and pages < limit:
                seen.add(offset)
                stream.seek(offset)
                count = struct.unpack(order + "H", stream.read(2))[0]
                stream.seek(offset + 2 + 12 * count)
                offset = struct.unpack(order + "I", stream.read(4))[0]
                pages += 1
            return max(pages, 1)
    except (OSError, struct.error):
        return 1


EXR_MAGIC = 20000630
_EXR_MULTIPART = 0x1000  # version-field flag: several headers, each part its own data window


def exr_pixels(path: str | Path) -> int | None:
    """The pixels the data windows of every part of an OpenEXR file declare (all are read at
    once); None when the header cannot be told (the library then says what is wrong)."""
    with open(path, "rb") as file:
        data = file.read(_MAX_HEADER_BYTES)
    if len(data) < 8 or struct.unpack("<i", data[:4])[0] != EXR_MAGIC:
        return None
    multipart = bool(struct.unpack("<I", data[4:8])[0] & _EXR_MULTIPART)
    total, pos = 0, 8
    while pos < len(data) and data[pos] != 0:  # an empty header ends a multi-part file's list
        window, pos = _exr_header_window(data, pos)
        if window is None:
            return None
        xmin, ymin, xmax, ymax = window
        total += max(0, xmax - xmin + 1) * max(0, ymax - ymin + 1)
        if not multipart:
            break
    return total


def _exr_header_window(data: bytes, pos: int) -> tuple[tuple[int, int, int, int] | None, int]:
    """(the header's dataWindow, where the next header begins); (None, pos) when it is cut short."""
    window = None
    while pos < len(data) and data[pos] != 0:
        name_end = data.find(b"\0", pos)
        type_end = data.find(b"\0", name_end + 1)
        if name_end < 0 or type_end < 0 or type_end + 4 > len(data):
            return None, pos
        size = struct.unpack("<i", data[type_end + 1 : type_end + 5])[0]
        value = data[type_end + 5 : type_end + 5 + size]
        if size < 0 or len(value) < size:
            return None, pos
        if data[pos:name_end] == b"dataWindow" and size == 16:
            window = struct.unpack("<4i", value)
        pos = type_end + 5 + size
    return window, pos + 1


_TIFF_BITS, _TIFF_PHOTOMETRIC, _TIFF_SAMPLE_FORMAT = 258, 262, 339
# grey (either way) and RGB: the ones checked against Blender's reader; not palette, CMYK, YCbCr, or
# SGILog (32844/32845: Blender decodes such "float" files to bytes)
_TIFF_PLAIN_PHOTOMETRIC = (0, 1, 2)


def header_kind(path: str | Path) -> str | None:
    """"float", "16-bit" or "8-bit" as operators/sources.py's kind of Blender's loaded image says,
    from the file's first bytes: PNG (IHDR bit depth), JPEG, OpenEXR, Radiance HDR, and TIFF of
    8/16-bit unsigned grey or RGB(A) samples. None for anything else, a float TIFF (Blender's
    reader turns some into bytes, SGILog ones) or an unreadable header: Blender's decode tells."""
    try:
        with open(path, "rb") as stream:
            data = stream.read(64)
            if data[:2] in (b"II", b"MM"):
                return _tiff_kind(stream, data)
    except (OSError, struct.error):
        return None
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR" and len(data) >= 25:
        return "16-bit" if data[24] == 16 else "8-bit"
    if data.startswith(b"\xff\xd8\xff"):
        return "8-bit"
    if len(data) >= 4 and struct.unpack("<i", data[:4])[0] == EXR_MAGIC:
        return "float"
    if data.startswith((b"#?RADIANCE", b"#?RGBE")):
        return "float"
    return None


def _tiff_kind(stream, header: bytes) -> str | None:
    """The first IFD's kind; None where Blender's reader is not plain (see :func:`header_kind`)."""
    order = "<" if header[:2] == b"II" else ">"
    if len(header) < 8 or struct.unpack(order + "H", header[2:4])[0] != 42:
        return None  # BigTIFF and others
    tags = _tiff_first_ifd(stream, order, struct.unpack(order + "I", header[4:8])[0])
    bits = tags.get(_TIFF_BITS, (1,))
    if tags.get(_TIFF_SAMPLE_FORMAT, (1,))[0] != 1 or len(set(bits)) != 1 or bits[0] not in (8, 16):
        return None
    if tags.get(_TIFF_PHOTOMETRIC, (1,))[0] not in _TIFF_PLAIN_PHOTOMETRIC:
        return None
    return "16-bit" if bits[0] == 16 else "8-bit"


def _tiff_first_ifd(stream, order: str, offset: int) -> dict[int, tuple[int, ...]]:
    """The SHORT-valued tags of the IFD at ``offset`` that tell its samples."""
    wanted = (_TIFF_BITS, _TIFF_PHOTOMETRIC, _TIFF_SAMPLE_FORMAT)
    stream.seek(offset)
    count = struct.unpack(order + "H", stream.read(2))[0]
    entries = stream.read(12 * count)
    tags = {}
    for index in range(min(count, len(entries) // 12)):
        tag, kind, number = struct.unpack(order + "HHI", entries[12 * index : 12 * index + 8])
        if tag not in wanted or kind != 3 or number < 1:
            continue
        if number <= 2:  # the values fit in the entry itself
            raw = entries[12 * index + 8 : 12 * index + 8 + 2 * number]
        else:
            stream.seek(struct.unpack(order + "I", entries[12 * index + 8 : 12 * index + 12])[0])
            raw = stream.read(2 * number)
        tags[tag] = struct.unpack(order + "H" * (len(raw) // 2), raw)
    return tags
