"""models/file_bytes/: a result's file put together as its bands are encoded, so the call that ends
it (and the one that makes the image from it) copies no whole file (issue #37 item 3: a 4096x4096
float EXR's join took a call of its own over 0.1 s).

The bytes are those of the file joined whole at the end, as before: the references below build each
file from the format's pieces in one go (header, the one deflate stream or every block, the scan of
every MCU row), independent of how the pump split the rows. A file written to disk (``write_to``: Process Sequence
frames) goes to its temporary file a band at a time and is renamed whole by the last call."""

from __future__ import annotations

import gc
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from lean_image_ai.models import files
from lean_image_ai.models.file_bytes import ExrFile, JpegFile, PngFile, TiffFile, exr, jpeg, png, tiff
from lean_image_ai.models.file_bytes import bands as bands_module

SIZES = [(1, 1), (15, 29), (16, 16), (17, 33), (53, 7), (301, 123)]


def pixels(height: int, width: int) -> np.ndarray:
    rng = np.random.default_rng(height * 1000 + width)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    smooth = np.stack([x, y, x * y, 1 - x], axis=-1) + rng.normal(0, 0.02, (height, width, 4))
    return np.clip(smooth, 0, 1).astype(np.float32)


def png_whole(straight: np.ndarray) -> bytes:
    height, width = straight.shape[:2]
    rows = np.zeros((height, 1 + 4 * width), np.uint8)
    rows[:, 1:] = np.clip(straight * np.float32(255.0) + np.float32(0.5), 0, 255).reshape(height, -1)
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    chunks = ((b"IHDR", header), (b"IDAT", zlib.compress(rows.tobytes(), png.DEFLATE_LEVEL)), (b"IEND", b""))
    return png.SIGNATURE + b"".join(png._chunk(kind, data) for kind, data in chunks)


def png16_whole(samples: np.ndarray) -> bytes:
    """16-bit RGBA, every row filtered "Sub" (each byte minus the same byte of the pixel before)."""
    height, width = samples.shape[:2]
    data = samples.astype(">u2").view(np.uint8).reshape(height, -1).astype(np.int16)
    rows = np.zeros((height, 1 + 8 * width), np.uint8)
    rows[:, 0] = 1
    rows[:, 1:] = (data - np.pad(data, ((0, 0), (8, 0)))[:, :-8]) % 256
    header = struct.pack(">IIBBBBB", width, height, 16, 6, 0, 0, 0)
    chunks = ((b"IHDR", header), (b"IDAT", zlib.compress(rows.tobytes(), png.DEFLATE_LEVEL)), (b"IEND", b""))
    return png.SIGNATURE + b"".join(png._chunk(kind, data) for kind, data in chunks)


def tiff_whole(samples: np.ndarray, associated_alpha: bool) -> bytes:
    """The header, every strip of the whole image (each sample minus the same one of the pixel before, deflated), the IFD on a word
    boundary, then the arrays its entries point at."""
    height, width = samples.shape[:2]
    wide = samples.reshape(height, -1).astype(np.int64)
    differenced = (wide - np.pad(wide, ((0, 0), (4, 0)))[:, :-4]) % (1 << (8 * samples.dtype.itemsize))  # minus the pixel before's
    differenced = differenced.astype(samples.dtype.newbyteorder("<"))
    strips = [zlib.compress(differenced[top : top + tiff.ROWS_PER_STRIP].tobytes(), tiff.DEFLATE_LEVEL)
              for top in range(0, height, tiff.ROWS_PER_STRIP)]
    offsets = list(np.cumsum([8] + [len(strip) for strip in strips[:-1]]))
    ifd_at = 8 + sum(len(strip) for strip in strips)
    padding = b"\0" * (ifd_at % 2)
    ifd_at += len(padding)
    bits = 8 * samples.dtype.itemsize
    entries = [(256, 4, [width]), (257, 4, [height]), (258, 3, [bits] * 4), (259, 3, [8]), (262, 3, [2]),
               (273, 4, offsets), (277, 3, [4]), (278, 4, [tiff.ROWS_PER_STRIP]), (279, 4, [len(s) for s in strips]),
               (284, 3, [1]), (317, 3, [2]), (338, 3, [1 if associated_alpha else 2]), (339, 3, [1] * 4)]
    fields, arrays, at = [], b"", ifd_at + 2 + 12 * len(entries) + 4
    for tag, kind, items in entries:
        data = struct.pack(f"<{len(items)}{'H' if kind == 3 else 'I'}", *(int(item) for item in items))
        if len(data) <= 4:
            fields.append(struct.pack("<HHI", tag, kind, len(items)) + data.ljust(4, b"\0"))
        else:
            fields.append(struct.pack("<HHII", tag, kind, len(items), at + len(arrays)))
            arrays += data
    ifd = struct.pack("<H", len(entries)) + b"".join(fields) + struct.pack("<I", 0)
    return b"II*\0" + struct.pack("<I", ifd_at) + b"".join(strips) + padding + ifd + arrays


def exr_whole(rgba: np.ndarray, half: bool) -> bytes:
    height, width = rgba.shape[:2]
    planar = np.ascontiguousarray(rgba[..., [i for _, i in exr.CHANNELS]].transpose(0, 2, 1), "<f2" if half else "<f4")
    blocks = []
    for top in range(0, height, exr.LINES_PER_BLOCK):
        data = exr._zip_block(planar[top : top + exr.LINES_PER_BLOCK].view(np.uint8).reshape(-1))
        blocks.append(struct.pack("<ii", top, len(data)) + data)
    header = exr._header(width, height, exr.HALF_SAMPLES if half else exr.FLOAT_SAMPLES)
    offsets = np.cumsum([len(header) + 8 * len(blocks)] + [len(block) for block in blocks[:-1]])
    return header + struct.pack(f"<{len(blocks)}Q", *offsets) + b"".join(blocks)


def jpeg_whole(straight: np.ndarray, monkeypatch) -> bytes:
    """Every MCU row in one band (each row is its own restart interval, so the scan is the rows'
    scans one after the other): the header, that scan, EOI."""
    height, width = straight.shape[:2]
    monkeypatch.setattr(bands_module, "FIRST_BAND_ROWS", height + jpeg.MCU_SIDE)
    monkeypatch.setattr(bands_module, "MAX_PIXELS_PER_CALL", (height + jpeg.MCU_SIDE) * width)
    one = JpegFile(height, width, lambda start, stop: straight[start:stop])
    assert not one.pump(1e9) and one.calls == [height * width]
    data = pumped(one).data
    monkeypatch.undo()
    assert data.startswith(jpeg._header(width, height, one._tables, one._mcu_columns, one.quality))
    assert data.endswith(b"\xff\xd9")
    return data


def pumped(made, budget=1e-9):
    while not made.pump(budget):  # the smallest budget: a band a call
        pass
    return made


@pytest.mark.parametrize(("height", "width"), SIZES)
def test_the_files_bytes_are_those_of_the_file_joined_whole(height, width, monkeypatch):
    straight = pixels(height, width)
    assert pumped(PngFile(height, width, lambda a, b: straight[a:b])).data == png_whole(straight)
    for half in (False, True):
        made = pumped(ExrFile(height, width, lambda a, b: straight[a:b], half=half))
        assert made.data == exr_whole(straight, half)
    expected_jpeg = jpeg_whole(straight, monkeypatch)
    assert pumped(JpegFile(height, width, lambda a, b: straight[a:b])).data == expected_jpeg
    sixteen = (straight * 65535).astype(np.uint16)
    assert pumped(PngFile(height, width, lambda a, b: sixteen[a:b], sixteen_bit=True)).data == png16_whole(sixteen)
    eight = (straight * 255).astype(np.uint8)
    for samples, associated in ((eight, False), (sixteen, True)):
        made = TiffFile(height, width, lambda a, b, samples=samples: samples[a:b],
                        sixteen_bit=samples.dtype == np.uint16, associated_alpha=associated)
        assert pumped(made).data == tiff_whole(samples, associated)


@pytest.mark.parametrize("kind", [PngFile, ExrFile, JpegFile])
def test_the_last_call_allocates_no_whole_file(kind):
    """The call that ends the file (no row left) copies no whole file: the bytes put together as
    the bands came, the end only fills in what had to wait (EXR's offsets, PNG's IDAT length and
    CRC) and hands over the very buffer (measured as Python's allocations in that call, against
    the file's size)."""
    height, width = 1024, 512  # in bands of 16 rows: a JPEG band's samples, freed at the end, far smaller than the file
    noise = np.random.default_rng(3).random((height, width, 4)).astype(np.float32)  # barely compressible
    tracemalloc.start()  # from the start: the buffer the bands went to is traced, so handing it over counts nothing
    try:
        made = kind(height, width, lambda a, b: noise[a:b])
        while made._next < made.height:
            made.pump(1e-9)
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        assert made.pump(10.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(made.data) > 200_000
    assert peak - before < len(made.data) / 20


def noise(height: int, width: int) -> np.ndarray:
    return np.random.default_rng(height + width).random((height, width, 4)).astype(np.float32)


@pytest.mark.parametrize("kind", [PngFile, ExrFile, JpegFile])
def test_write_to_puts_the_file_on_disk_across_calls_and_installs_it_in_the_last(tmp_path, kind):
    """A frame's (or Save Result To's) file goes to its temporary file as the bands come, the
    target untouched until the last call renames it whole: no call writes the whole file."""
    straight = noise(256, 256)
    target = tmp_path / f"frame{kind.suffix}"
    made = kind(256, 256, lambda a, b: straight[a:b])
    made.write_to(target)
    sizes = []
    while not made.pump(1e-9):
        assert not target.exists()
        (temporary,) = files.leftover_temps(target)
        sizes.append(temporary.stat().st_size)
    assert len(set(sizes)) > 2 and sizes == sorted(sizes)  # written a part at a time
    assert made.data is None and files.leftover_temps(target) == []
    assert target.read_bytes() == pumped(kind(256, 256, lambda a, b: straight[a:b])).data


@pytest.mark.parametrize("drop", ["discard", "dropped"])
def test_a_file_cancelled_half_way_leaves_no_temporary_and_the_target_as_it_was(tmp_path, drop):
    straight = noise(256, 256)
    target = tmp_path / "frame.exr"
    target.write_bytes(b"the frame before")
    made = ExrFile(256, 256, lambda a, b: straight[a:b])
    made.write_to(target)
    for _ in range(3):
        assert not made.pump(1e-9)
    assert len(files.leftover_temps(target)) == 1
    if drop == "discard":
        made.discard()
    else:  # a cancelled job's steps are just let go
        del made
        gc.collect()
    assert files.leftover_temps(target) == []
    assert target.read_bytes() == b"the frame before"
