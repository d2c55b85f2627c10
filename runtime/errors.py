"""Error types a user can read. Each message says what happened and what to do next."""

import os
import re
from pathlib import Path

# C0/C1 controls, lone surrogates (undecodable bytes of a file name), line separators and the
# bidirectional overrides: in a name they retitle or recolour a terminal, split a line, or make
# it read backwards; the JSON line escapes the same way
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text) -> str:
    """``text`` (a name, a path, a message quoting one) for a terminal line: every control
    character escaped as JSON writes it (``\\n``, ``\\u001b``), the rest unchanged."""
    return _UNPRINTABLE.sub(lambda m: _SHORT.get(m.group(), f"\\u{ord(m.group()):04x}"), str(text))


def first_line(exc: BaseException) -> str:
    """An exception as one short line for a message (ORT's texts run to many lines)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


class LeanImageError(Exception):
    """Base of every error this add-on raises on purpose (as opposed to a bug)."""


class ModelFileError(LeanImageError):
    """The model file is missing, unreadable, not ONNX, or truncated."""


class ModelContractError(LeanImageError):
    """The model loads, but its inputs/outputs do not match what its family needs."""


class SettingError(LeanImageError, ValueError):
    """A setting (environment variable, preference, RuntimeSettings field, option) out of its range."""


class DeviceSpecError(LeanImageError, ValueError):
    """A device string that the runtime does not understand."""


class ProviderUnavailableError(LeanImageError):
    """The requested execution provider cannot be used with the installed onnxruntime."""


class InferenceOutOfMemoryError(LeanImageError, MemoryError):
    """A model run ran out of GPU or system memory. The failed session has been evicted."""

    def __init__(self, message, *, model, device, resource, detail=""):
        super().__init__(message)
        self.model = model
        self.device = device
        self.resource = resource  # "GPU memory" or "system memory"
        self.detail = detail


class OperationCancelled(LeanImageError):
    """The user cancelled the job; nothing was written."""


class InvalidImageError(LeanImageError, ValueError):
    """The input image cannot be processed (empty, wrong shape, unsupported dtype)."""


class InvalidModelOutputError(LeanImageError):
    """The model produced unusable values (NaN/Inf, wrong shape); nothing was written."""


class ModelInstallError(LeanImageError):
    """Downloading, verifying or installing a catalog model failed."""


class GpuRuntimeError(LeanImageError):
    """Installing, removing or loading the CUDA/cuDNN libraries failed; the message says why and what to do."""


class InferenceError(LeanImageError):
    """A model run failed for a reason other than memory (bad input shape, provider error)."""


class SessionClosedError(InferenceError):
    """A model's session was unloaded (evicted) before the job could run it; nothing was written."""

    def __init__(self, message, *, model):
        super().__init__(message)
        self.model = model


class MemoryBudgetError(InferenceOutOfMemoryError):
    """A model run (or load) would not fit the memory free under the budget, even after releasing
    arenas and unloading least-recently-used sessions; nothing ran. A subclass of the
    out-of-memory error, so the tiler meets it the same way: smaller tiles, or the message."""


def user_path(text) -> Path:
    """``text`` as a path with ``~`` and ``~user`` expanded; a ``~user`` this machine does not know
    is the user's mistake, said in one line (pathlib raises a bare RuntimeError for it)."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        user = str(os.fspath(text)).split("/", 1)[0].split("\\", 1)[0]
        raise LeanImageError(
            f"{printable(os.fspath(text))!r}: this machine has no user {user[1:]!r}, so {user!r} names no home "
            "folder. Give the full path."
        ) from None
