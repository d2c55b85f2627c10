"""Why a model file could not be loaded, told truthfully: a permission problem or a busy file is
not a corrupt model, and neither is an operator the installed onnxruntime lacks.

Each function returns the error to raise (`model_identity`, which checks the file before
onnxruntime sees it, raises them); every message says what happened and what to do, and says
"remove it and install again" only where the file itself is the problem.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from pathlib import Path

from .errors import ModelFileError, ProviderUnavailableError, first_line, user_path

_BUSY_ERRNOS = {errno.EBUSY, errno.ETXTBSY}
_BUSY_WINERRORS = {32, 33}  # ERROR_SHARING_VIOLATION, ERROR_LOCK_VIOLATION
_LOOP_ERRNOS = {errno.ELOOP}

_NOT_ONNX = ("INVALID_PROTOBUF", "Protobuf parsing failed")
_UNSUPPORTED = (
    "is not a registered function/op",
    "Could not find an implementation for",
    "NOT_IMPLEMENTED",
    "Unsupported model IR version",
    "is under development",
    "is till opset",
)
_DEVICE_WORDS = ("CUDA", "cuDNN", "CUDNN", "CUBLAS", "TensorRT", "Dml", "DirectML", "CoreML", "provider")


def onnxruntime_version() -> str:
    """The version of the onnxruntime that refused a file: loaded already (it raised), so never
    imported here (this module's checks of a file also run in Blender's process, which never
    imports onnxruntime)."""
    return str(getattr(sys.modules.get("onnxruntime"), "__version__", "(unknown version)"))


def symlink_loop(path: Path) -> ModelFileError:
    return ModelFileError(
        f"Model path {path} is a symbolic link that leads back to itself (a link loop), so there "
        "is no file to load. Replace the link with the model file, or with a link to where the "
        "file really is."
    )


def os_error(path: Path, exc: OSError) -> ModelFileError:
    """Opening the file failed at the OS: permission, busy, link loop, or something else."""
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM):
        return ModelFileError(
            f"Permission denied reading the model file {path}: the file may be fine, but this "
            "program's user is not allowed to read it. Give your user read permission on it (and "
            "its folders), or copy it to a folder you own and point the add-on there; do not "
            "delete it for this."
        )
    if exc.errno in _BUSY_ERRNOS or getattr(exc, "winerror", None) in _BUSY_WINERRORS:
        return ModelFileError(
            f"The model file {path} is busy: another program holds it (a download, a copy or a "
            "virus scan still writing it). Wait for that program to finish or close it, then run "
            "the job again."
        )
    if exc.errno in _LOOP_ERRNOS:
        return symlink_loop(path)
    return ModelFileError(
        f"Cannot read the model file {path}: {exc.strerror or exc}. Check that the drive or share "
        "it is on is available and readable, then run the job again."
    )


def _size_text(path: Path) -> str:
    try:
        return f"{path.stat().st_size:,} bytes"
    except OSError:
        return "size unknown"


def load_failure(
    exc: BaseException, path: Path, *, device: str, on_device: bool
) -> ModelFileError | ProviderUnavailableError:
    """onnxruntime refused to create a session for ``path``: say which kind of refusal it was.

    ``on_device``: the session was asked for a GPU (or another accelerator) provider.
    """
    text = str(exc)
    line = first_line(exc)
    version = onnxruntime_version()
    if any(marker in text for marker in _UNSUPPORTED):
        return ModelFileError(
            f"{path.name} uses {_what_is_unsupported(text)}, which onnxruntime {version} does not "
            "support. The file is not damaged: export the model again with an older opset (17 is "
            "widely supported), or use an onnxruntime that supports it."
        )
    if any(marker in text for marker in _NOT_ONNX):
        return not_onnx(path)
    if "Permission denied" in text or "errno 13" in text.lower():
        return os_error(path, PermissionError(errno.EACCES, "Permission denied"))
    if on_device or any(word in text for word in _DEVICE_WORDS):
        return ProviderUnavailableError(
            f"The device {device} could not load {path.name} ({line}). The model file is not the "
            "problem: choose the CPU device (add-on preferences, or --device cpu), or run "
            "`python -m lean_image_ai doctor` to see which GPU libraries are missing."
        )
    return ModelFileError(
        f"onnxruntime {version} could not load {path} ({line}). If the add-on downloaded it, install "
        "it again from its model list; if it is your own export, check it with onnx.checker and "
        "export it again."
    )


_MAGIC = (
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"PK\x03\x04", "a zip archive (unpack it and choose the .onnx file inside)"),
    (b"\x1f\x8b", "a gzip archive (unpack it and choose the .onnx file inside)"),
    (b"%PDF", "a PDF document"),
)
_ADVICE = "Choose the model's .onnx file"


def not_onnx(path: Path) -> ModelFileError:
    """onnxruntime could not parse the file: say what the file is, and advise deleting nothing
    (it may be any file of the user's, given as the model by mistake)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
        size = path.stat().st_size
    except OSError:
        head, size = b"", None
    if size == 0:
        return ModelFileError(
            f"{path} is empty (0 bytes), so it is not a model. {_ADVICE}; if the add-on downloaded "
            "this one, install it again from its model list."
        )
    kind = next((name for magic, name in _MAGIC if head.startswith(magic)), None)
    if kind is not None:
        return ModelFileError(f"{path} is {kind}, not an ONNX model. {_ADVICE}.")
    if head and _is_text(head):
        begins = head.decode("utf-8", "replace").splitlines()[0][:40] if head.strip() else ""
        return ModelFileError(f"{path} is a text file (it begins {begins!r}), not an ONNX model. {_ADVICE}.")
    return ModelFileError(
        f"{path} ({_size_text(path)}) is not a readable ONNX model: it is truncated (an interrupted "
        "download or copy) or not an ONNX file at all. If the add-on downloaded it, install it again "
        "from its model list; if it is your own export, export it again."
    )


def _is_text(head: bytes) -> bool:
    try:
        decoded = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(ch.isprintable() or ch in "\r\n\t" for ch in decoded)


def not_a_file(path: Path, mode: int) -> ModelFileError:
    """The model path names something that is no regular file: say what it is."""
    if stat.S_ISDIR(mode):
        what = "is a folder: choose the .onnx file itself (the one inside it)"
    elif stat.S_ISFIFO(mode):
        what = "is a named pipe (FIFO), not a file: choose the .onnx file itself"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        what = "is a device, not a file: choose the .onnx file itself"
    elif stat.S_ISSOCK(mode):
        what = "is a socket, not a file: choose the .onnx file itself"
    else:
        what = "is not a regular file: choose the .onnx file itself"
    return ModelFileError(f"Model path {path} {what}.")


def _what_is_unsupported(text: str) -> str:
    op = re.search(r"([\w.]*:?\w+)\((-?\d+)\) is not a registered function/op", text)
    if op:
        return f"the operator {op.group(1)} (a custom or unknown operator)"
    impl = re.search(r"Could not find an implementation for (\w+)\((\d+)\)", text)
    if impl:
        return f"the operator {impl.group(1)} at opset version {impl.group(2)}"
    opset = re.search(r"Opset (\d+) is under development", text)
    if opset:
        till = re.search(r"domain ([\w.]+) is till opset (\d+)", text)
        upto = f" (it supports {till.group(1)} up to opset {till.group(2)})" if till else ""
        return f"opset {opset.group(1)}{upto}"
    ir = re.search(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)", text)
    if ir:
        return f"ONNX IR version {ir.group(1)} (it supports up to {ir.group(2)})"
    return "an operator or format version"


def model_identity(model_path) -> tuple[Path, tuple]:
    """The model file checked readable, and its identity for the session cache: path, size, mtime."""
    given = user_path(model_path)
    path = given
    try:
        path = path.resolve()
        info = path.stat()
    except FileNotFoundError:
        if given.is_symlink():
            raise ModelFileError(
                f"Model path {given} is a link to {path}, which does not exist. Point the link at the "
                "model file, or choose the .onnx file itself."
            ) from None
        raise ModelFileError(
            f"Model file not found: {path}. Install the model from the add-on preferences "
            "(Lean Image AI > Models) or put the file at that path."
        ) from None
    except RuntimeError as exc:  # Python < 3.13: "Symlink loop from ..."
        raise symlink_loop(path) from exc
    except OSError as exc:
        raise os_error(path, exc) from exc
    if not stat.S_ISREG(info.st_mode):
        raise not_a_file(path, info.st_mode)
    if info.st_size == 0:  # onnxruntime's words for it would blame a missing graph
        raise not_onnx(path)
    try:  # the OS's own answer (permission, busy), before onnxruntime turns it into prose
        os.close(os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0)))
    except OSError as exc:
        raise os_error(path, exc) from exc
    # size + mtime: a model replaced on disk gets a new session instead of a stale one
    return path, (str(path), info.st_size, info.st_mtime_ns)
