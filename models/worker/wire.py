"""What crosses the worker's connection (bpy-free): small messages pickled through the pipe,
every array's bytes beside it in a file of the exchange folder, never inside the pickle.

Pickle protocol 5 hands each contiguous array's buffer out of band; each buffer is written to a
file of its own in the exchange folder (on Linux a folder of /dev/shm, so the bytes stay in
memory), and the message names the files. The receiver reads each file once into memory it owns
and deletes it. Files rather than ``multiprocessing.shared_memory``: a segment attached in another
process is registered with that process's resource tracker, which unlinks it a second time (with
warnings) on Python 3.11 and needs ``track=False`` (3.13 only) to avoid; a file has one owner, the
receiver, and the client removes the whole folder when a worker ends, however it ended.

Classes are named by module, and the two sides may know this package under different names
(Blender imports an extension as ``bl_ext.<repository>.lean_image_ai``, the worker as
``lean_image_ai``): the receiver reads this package's classes under its own name.
"""

from __future__ import annotations

import copyreg
import io
import itertools
import mmap
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from types import MappingProxyType

_serial = itertools.count()
LARGE = 1 << 20
# a catalog entry's read-only tables (MappingProxyType) cross as what they show
def _proxy(mapping: dict) -> MappingProxyType:
    return MappingProxyType(mapping)


copyreg.pickle(MappingProxyType, lambda proxy: (_proxy, (dict(proxy),)))
_PACKAGE = __name__.rsplit(".models.worker.wire", 1)[0]  # this package's name on this side
_TOP = "lean_image_ai"


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        parts = module.split(".")
        if _TOP in parts:  # the other side's name for this package: ours
            module = ".".join([_PACKAGE, *parts[parts.index(_TOP) + 1:]])
        return super().find_class(module, name)


def send(conn, message, folder: Path) -> None:
    """``message`` (a tuple) through ``conn``, its arrays through files of ``folder``."""
    data, names = pack(message, folder)
    try:
        conn.send_bytes(pickle.dumps((names, data)))
    except BaseException:
        discard(names, folder)
        raise


def receive(conn, folder: Path):
    """The next message (blocks: call after ``conn.poll()`` said there is one)."""
    names, data = pickle.loads(conn.recv_bytes())
    return unpack((data, names), folder)


def exchange_folder() -> Path:
    """A new private folder for one worker's array files: in memory where the OS offers one."""
    base = "/dev/shm" if sys.platform.startswith("linux") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="lean_image_ai_worker_", dir=base))


def remove_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def pack(value, folder: Path) -> tuple[bytes, list[str]]:
    """(the pickle, the names of its buffers' files in ``folder``)."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    names = []
    try:
        for buffer in buffers:
            name = f"{os.getpid()}-{next(_serial)}.bin"
            with open(folder / name, "wb") as out:
                out.write(buffer.raw())
            names.append(name)
    except BaseException:
        discard(names, folder)
        raise
    return data, names


def unpack(packed: tuple[bytes, list[str]], folder: Path):
    """The value :func:`pack` packed; its files are read and deleted."""
    data, names = packed
    buffers = []
    try:
        for name in names:
            path = folder / name
            chunk = _buffer(path.stat().st_size)
            with open(path, "rb") as source:
                source.readinto(memoryview(chunk))
            buffers.append(chunk)
    finally:
        discard(names, folder)
    return _Unpickler(io.BytesIO(data), buffers=buffers).load()


def _buffer(size: int):
    """Writable memory for one received array. A large one is an anonymous mapping, unmapped when
    the array goes: malloc would keep a freed block of a frame's size in the heap (glibc raises its
    mmap threshold after such a free), and Blender's RSS would grow by one frame for good."""
    if size >= LARGE:
        return mmap.mmap(-1, size)
    return bytearray(size)


def discard(names: list[str], folder: Path) -> None:
    for name in names:
        try:
            os.unlink(folder / name)
        except OSError:
            pass
