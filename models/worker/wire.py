"""How a models/worker/protocol.py message crosses the connection (bpy-free): its JSON as one small
frame, each array's bytes in a file of the exchange, named in that frame as ``(dtype, shape, where,
file)``. A message whose JSON is over :data:`MAX_MESSAGE_BYTES` (a long job's memory timeline, the
frame list of a long sequence) crosses whole as a file of the exchange too, and the frame names it
(``{"document": entry}``): every frame on the socket is small and written by one write.

The exchange is two folders of one worker: one in memory where the OS offers one (/dev/shm on
Linux) and one on disk. An array goes to the memory folder when its free space holds it, else to
the disk folder (a 4K float frame is 133 MB; /dev/shm is 64 MB in Docker and on many render
nodes): the room is checked before writing, a file's name is recorded before its first byte, and
a write that fails for any reason removes the file, so nothing half-written stays to fill the
folder. The receiver reads each file once into memory it owns and deletes it. Files rather than
``multiprocessing.shared_memory``: a segment attached in another process is registered with that
process's resource tracker, which unlinks it a second time on Python 3.11; a file has one owner.

A folder's name carries its owner's pid (the host's): a host that was killed leaves its folders
behind, and the next start removes those whose owner is gone (:func:`remove_stale`).
"""

from __future__ import annotations

import errno
import itertools
import json
import mmap
import os
import shutil
import socket
import struct
import sys
import tempfile
from pathlib import Path

from . import protocol

PREFIX = "lean_image_ai_worker_"
LARGE = 1 << 20
ROOM_MARGIN = 64 << 10  # left free in a folder after an array (the OS and other files need some too)
# The longest frame on the socket. Under 16 KiB multiprocessing writes the length prefix and the
# body with one write (above it, two); Linux's AF_UNIX socket queues one write of up to ~32 KiB as
# one buffer, so the reader sees all of it or none; 8 KiB also fits macOS's default AF_UNIX send
# buffer (8 KiB + the prefix would not fit 8 KiB: the receive's look ahead covers that edge), and
# parsing 8 KiB of JSON costs Blender's main thread tens of microseconds. Nearly every message
# (a frame's or result's entry, progress, a heartbeat, an event) is far under it. A length prefix
# beyond this is a broken or foreign peer: refused from its prefix alone, before any memory is
# taken for it or any byte waited for.
MAX_MESSAGE_BYTES = 8 << 10
# The longest document a frame may point to (a file of the exchange): a day-long job's memory
# timeline (20 samples a second, ~45 MB) and the frame list of a 100,000-frame sequence (~30 MB)
# are the longest real ones.
MAX_DOCUMENT_BYTES = 256 << 20
_PREFIX = struct.Struct("!i")  # multiprocessing's length prefix (-1: an 8-byte length follows)
_serial = itertools.count()


class ExchangeError(OSError):
    """An array could not be written or read; its text is the one line the job ends with."""


def memory_base() -> str | None:
    """Where in-memory folders go: /dev/shm on Linux (None elsewhere: the temporary folder)."""
    if sys.platform.startswith("linux") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return None


class Exchange:
    """One worker's two folders; both sides build one from the same two paths."""

    def __init__(self, memory: Path, disk: Path):
        self.folders = {"m": Path(memory), "d": Path(disk)}
        self.spilled = 0  # arrays that went to disk for want of room in memory
        self.notices: list[str] = []  # what the owner says once in its event log

    @classmethod
    def create(cls, *, in_memory: bool = True) -> Exchange:
        owner = f"{PREFIX}{os.getpid()}_"
        memory = Path(tempfile.mkdtemp(prefix=owner, dir=memory_base() if in_memory else None))
        try:
            disk = Path(tempfile.mkdtemp(prefix=owner)) if memory_base() and in_memory else memory
        except BaseException:
            shutil.rmtree(memory, ignore_errors=True)
            raise
        return cls(memory, disk)

    def usable(self) -> bool:
        return all(folder.is_dir() for folder in self.folders.values())

    def remove(self) -> None:
        for folder in set(self.folders.values()):
            shutil.rmtree(folder, ignore_errors=True)

    # -- arrays --------------------------------------------------------------------------------
    def write(self, array, written: list[dict], what: str = "frame") -> None:
        """Write ``array``'s bytes; its entry is appended to ``written`` before the first byte.
        ``what`` names it in an error (a frame, a message)."""
        import numpy as np

        array = np.ascontiguousarray(array)
        if array.dtype.hasobject:
            raise TypeError("an array of Python objects cannot cross to the other process")
        places = self._places(array.nbytes, what)
        for where in places:
            entry = {"dtype": array.dtype.str, "shape": list(array.shape), "where": where,
                     "file": f"{os.getpid()}-{next(_serial)}.bin"}
            written.append(entry)  # named before its first byte: a failed write never leaves it behind
            try:
                with open(self.folders[where] / entry["file"], "wb") as out:
                    out.write(memoryview(array).cast("B"))
                return
            except OSError as exc:
                self.discard([entry])
                written.remove(entry)
                if exc.errno != errno.ENOSPC or where == places[-1]:
                    raise self._failed_write(exc, array.nbytes, what) from None
                self._spill_notice(array.nbytes, what)  # the room went between the check and the write
        raise self._no_room(array.nbytes, what)

    def _places(self, size: int, what: str) -> list[str]:
        """Where ``size`` bytes may go, in order: memory when it has the room, then disk."""
        memory, disk = self.folders["m"], self.folders["d"]
        for folder in {memory, disk}:
            if not folder.is_dir():
                raise self._failed_write(OSError(errno.ENOENT, "gone"), size, what)
        if _free(memory) >= size + ROOM_MARGIN:
            return ["m"] if disk == memory else ["m", "d"]
        if disk == memory:
            return []
        self._spill_notice(size, what)
        return ["d"] if _free(disk) >= size + ROOM_MARGIN else []

    def _spill_notice(self, size: int, what: str) -> None:
        self.spilled += 1
        if self.spilled == 1:
            self.notices.append(f"The in-memory exchange folder {self.folders['m']} has no room for a {_mib(size)} "
                                f"{what}; such files cross through {self.folders['d']} on disk (slower).")

    def _no_room(self, size: int, what: str) -> ExchangeError:
        rooms = ", ".join(f"{folder} has {_mib(_free(folder))} free" for folder in set(self.folders.values()))
        return ExchangeError(f"No room for a {_mib(size)} {what} to cross to the model process ({rooms}); "
                             "free some disk space and run it again.")

    def _failed_write(self, exc: OSError, size: int, what: str) -> ExchangeError:
        if exc.errno == errno.ENOSPC:
            return self._no_room(size, what)
        if exc.errno == errno.ENOENT:
            return ExchangeError(f"The exchange folder {self.folders['m']} was removed (a cleaner of temporary "
                                 "files?); the model process is restarted for the next job, run it again.")
        return ExchangeError(f"A {what} could not cross to the model process ({exc.strerror or exc}); run it again.")

    def read(self, entry: dict):
        """The array of ``entry``; its file is deleted whatever happens."""
        import numpy as np

        path = self.path_of(entry)
        dtype = np.dtype(entry["dtype"])
        expected = dtype.itemsize * int(np.prod(entry["shape"], dtype=np.int64))
        try:
            with open(path, "rb") as source:
                size = os.fstat(source.fileno()).st_size
                if size != expected:
                    raise ExchangeError(f"a frame's file {path.name} was cut short")
                chunk = _buffer(source, size)
            return np.frombuffer(chunk, dtype=dtype).reshape(entry["shape"])
        finally:
            self.discard([entry])

    def path_of(self, entry: dict) -> Path:
        """The file ``entry`` names: a plain name in one of this exchange's folders, nothing else
        (a broken peer's ``../`` never makes this side read or delete a file elsewhere)."""
        name = entry.get("file") if isinstance(entry, dict) else None
        where = entry.get("where") if isinstance(entry, dict) else None
        if where not in self.folders or not isinstance(name, str) or not name or Path(name).name != name:
            raise protocol.ProtocolError(f"a message names a file outside the exchange ({entry!r:.80})")
        return self.folders[where] / name

    def discard(self, entries: list[dict]) -> None:
        for entry in entries:
            try:
                os.unlink(self.path_of(entry))
            except (OSError, protocol.ProtocolError):
                pass


def send(conn, message: protocol.Message, exchange: Exchange) -> None:
    """``message`` through ``conn``, its arrays through files of ``exchange``; the message itself
    through a file too when its JSON is over :data:`MAX_MESSAGE_BYTES`."""
    document, arrays = protocol.encode(message)
    written: list[dict] = []
    try:
        for array in arrays:
            exchange.write(array, written)
        data = json.dumps({**document, "arrays": written}).encode()
        if len(data) > MAX_MESSAGE_BYTES:
            data = _carried(data, exchange, written)
        conn.send_bytes(data)
    except BaseException:
        exchange.discard(written)
        raise


def _carried(data: bytes, exchange: Exchange, written: list[dict]) -> bytes:
    """The frame that names ``data`` written whole as a file of ``exchange`` (its entry joins
    ``written``: a failed send removes it with the arrays)."""
    import numpy as np

    exchange.write(np.frombuffer(data, np.uint8), written, what="message")
    return json.dumps({"document": written[-1]}).encode()


def receive(conn, exchange: Exchange, *, wait: bool = False) -> protocol.Message | None:
    """The next message (call after ``conn.poll()`` said there is one), or None while its frame
    has not arrived whole. Every file it names is deleted, read or not.

    It never waits on the other side. Every frame is at most :data:`MAX_MESSAGE_BYTES` and written
    by one write (a longer message crosses as a file of the exchange, written whole before the
    frame naming it is sent), so a local socket normally holds all of a frame or none of it. Where
    one was split anyway (a sender stopped in its write on a platform that splits small writes,
    a hostile peer), the frame is looked at without being taken (``MSG_PEEK``): it is read only
    when all its bytes are there, else this returns None and the caller looks again at its next
    tick, while its heartbeat deadline runs. A document file is complete before its frame exists,
    so reading it waits on the disk, never on the peer. ``wait``: the worker's side, which is not
    Blender's process and may wait for the rest of a frame.

    A length prefix over :data:`MAX_MESSAGE_BYTES`, or a document over :data:`MAX_DOCUMENT_BYTES`,
    is a ProtocolError (the connection is unusable after it: the caller ends that peer)."""
    if not wait and not _whole_frame_there(conn):
        return None
    try:
        data = conn.recv_bytes(MAX_MESSAGE_BYTES)
    except OSError as exc:
        if exc.args != ("bad message length",):  # multiprocessing's words for a prefix over the cap
            raise
        raise _too_long() from None
    document = _parsed(data)
    if "document" in document:
        document = _parsed(_document(exchange, document["document"]))
    try:
        entries = list(document.pop("arrays", []))
    except (TypeError, AttributeError) as exc:
        raise protocol.ProtocolError(f"an unreadable message from the other process ({exc})") from None
    try:
        arrays = [exchange.read(entry) for entry in entries]
    finally:
        exchange.discard(entries)
    return protocol.decode(document, arrays)


def _whole_frame_there(conn) -> bool:
    """Whether the next frame's every byte has arrived (at the end of the stream: True, so that
    the read says so). Raises a ProtocolError for a prefix over the cap without reading on."""
    peer = socket.socket(fileno=conn.fileno())  # the connection's own socket, not a copy
    try:
        peer.setblocking(True)  # a default timeout set by someone else must not change the connection
        ahead = peer.recv(_PREFIX.size + MAX_MESSAGE_BYTES, socket.MSG_PEEK)
    finally:
        peer.detach()  # the connection still owns it
    if not ahead:
        return True
    if len(ahead) < _PREFIX.size:
        return False
    (length,) = _PREFIX.unpack_from(ahead)
    if not 0 <= length <= MAX_MESSAGE_BYTES:
        raise _too_long()
    return len(ahead) >= _PREFIX.size + length


def _too_long() -> protocol.ProtocolError:
    return protocol.ProtocolError(
        f"a message longer than the {MAX_MESSAGE_BYTES >> 10} KiB the connection carries (a broken or foreign process)")


def _parsed(data) -> dict:
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise protocol.ProtocolError(f"an unreadable message from the other process ({exc})") from None
    if not isinstance(document, dict):
        raise protocol.ProtocolError("an unreadable message from the other process (not a JSON object)")
    return document


def _document(exchange: Exchange, entry) -> bytes:
    """A file-carried message's JSON; its file is deleted whatever happens."""
    try:
        exchange.path_of(entry)
        size = int(entry["shape"][0]) if entry.get("dtype") == "|u1" and len(entry["shape"]) == 1 else -1
    except (KeyError, TypeError, ValueError):
        size = -1
    if not 0 <= size <= MAX_DOCUMENT_BYTES:
        exchange.discard([entry] if isinstance(entry, dict) else [])
        if size > MAX_DOCUMENT_BYTES:
            raise protocol.ProtocolError(f"a message longer than the {MAX_DOCUMENT_BYTES >> 20} MiB no real one "
                                         "reaches (a broken or foreign process)")
        raise protocol.ProtocolError(f"an unreadable message from the other process (it names {entry!r:.80})")
    return exchange.read(entry).tobytes()


def _buffer(source, size: int):
    """Writable memory holding one received array's bytes. A large one is a private mapping of
    its file (POSIX: the file is unlinked at once, its pages go when the array does): no copy, so
    receiving a 64 MiB frame costs Blender's main thread no time, and no heap that malloc would
    keep (glibc raises its mmap threshold after a large free: Blender's RSS would grow by one
    frame for good). Windows cannot delete a mapped file: there, an anonymous mapping and a copy."""
    if size >= LARGE and os.name == "posix":
        return mmap.mmap(source.fileno(), size, access=mmap.ACCESS_COPY)
    chunk = mmap.mmap(-1, size) if size >= LARGE else bytearray(size)
    if source.readinto(memoryview(chunk)) != size:
        raise ExchangeError("a frame's file was cut short while it was read")
    return chunk


def _free(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size / 1024:.0f} KiB"


# ---- folders a killed host left ----------------------------------------------------------------
def owner_of(folder: Path) -> int | None:
    head = folder.name[len(PREFIX):].split("_", 1)[0]
    return int(head) if head.isdigit() else None


def remove_stale() -> list[Path]:
    """Remove exchange folders whose owner process is gone; the ones removed."""
    removed = []
    for base in {memory_base() or tempfile.gettempdir(), tempfile.gettempdir()}:
        try:
            candidates = list(Path(base).glob(PREFIX + "*"))
        except OSError:
            continue
        for folder in candidates:
            owner = owner_of(folder)
            if owner is not None and owner != os.getpid() and not _alive(owner):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    if os.name == "posix":
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True  # someone else's process: alive
        return True
    try:  # os.kill on Windows would end the process: ask psutil where it is, else keep the folder
        import psutil

        return psutil.pid_exists(pid)
    except ImportError:
        return True
