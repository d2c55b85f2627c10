"""Every message between Blender's process and the model worker, in one place (bpy-free).

Each message is a small frozen dataclass with a stable ``KIND`` tag. On the wire a message is one
JSON document (``{"kind": ..., "fields": ..., "arrays": [...]}``) sent as one frame of the
connection; each array crosses as ``(dtype, shape, bytes)``, its bytes in a file of the exchange
(models/worker/wire.py), never pickled. Nothing of the project is pickled either: the job crosses as
plain values (family id, model path, option values, device, budgets), a result record as its type's
name inside this package plus its fields. So the worker may run another Python and numpy than the
host's (a GPU build of onnxruntime that needs a newer Python than Blender's).

The handshake: the worker's first message is :class:`Hello` with its :data:`VERSION`; the client
ends a worker whose version differs, with one line naming both.

Who sends what (``docs/architecture.md`` draws it):

- client -> worker: Job, Frame, Skip, Cancel, Ask (state, release, unload), LeakCheck, Free, Fault, Quit
- worker -> client: Hello, Heartbeat (about every second while it has work), Status, Event, Progress,
  Result, Failures, Done, Failed, Answer, Freed
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

VERSION = 2  # 1 was the pickled tuples before this module; raise it with any change of a message
PACKAGE = __name__.rsplit(".models.worker.protocol", 1)[0]  # this package's name on this side


class ProtocolError(ValueError):
    """A message this side cannot read (another version, a foreign type): never guessed at."""


# ---- the messages ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Message:
    KIND: ClassVar[str] = ""


@dataclass(frozen=True)
class Hello(Message):
    KIND: ClassVar[str] = "hello"
    version: int
    pid: int
    python: str = ""
    numpy: str = ""
    key: str = ""  # the connect key, where the worker dialled in (Windows) rather than inherited a socket


@dataclass(frozen=True)
class Heartbeat(Message):
    KIND: ClassVar[str] = "heartbeat"


@dataclass(frozen=True)
class Job(Message):
    KIND: ClassVar[str] = "job"
    run: dict  # models/model_run.py ModelRun as plain values (:func:`run_values`)
    refs: list  # [(frame number, path)]
    name: str = ""
    depth: int = 2
    stop_on_error: bool = False
    settings: dict = field(default_factory=dict)  # runtime/settings.py RuntimeSettings' fields
    family_module: str = ""  # a plug-in family: the module whose FAMILY the worker registers


@dataclass(frozen=True)
class Frame(Message):
    KIND: ClassVar[str] = "frame"
    number: int
    pixels: Any  # an array


@dataclass(frozen=True)
class Skip(Message):
    KIND: ClassVar[str] = "skip"
    number: int


@dataclass(frozen=True)
class Cancel(Message):
    KIND: ClassVar[str] = "cancel"


@dataclass(frozen=True)
class Ask(Message):
    KIND: ClassVar[str] = "ask"
    what: str  # "state", "release" or "unload"


@dataclass(frozen=True)
class LeakCheck(Message):
    KIND: ClassVar[str] = "leak"
    family: str
    device: str
    folder: str
    runs: int
    budgets: dict
    settings: dict


@dataclass(frozen=True)
class Free(Message):
    KIND: ClassVar[str] = "free"


@dataclass(frozen=True)
class Fault(Message):
    KIND: ClassVar[str] = "fault"
    how: str


@dataclass(frozen=True)
class Quit(Message):
    KIND: ClassVar[str] = "quit"


@dataclass(frozen=True)
class Status(Message):
    KIND: ClassVar[str] = "status"
    fields: dict


@dataclass(frozen=True)
class Event(Message):
    KIND: ClassVar[str] = "event"
    event: dict


@dataclass(frozen=True)
class Progress(Message):
    KIND: ClassVar[str] = "progress"
    fraction: float
    stage: str


@dataclass(frozen=True)
class Result(Message):
    KIND: ClassVar[str] = "result"
    number: int
    result: Any


@dataclass(frozen=True)
class Failures(Message):
    """Frames that failed in the worker, ``[(frame number, one line)]``, told before its next
    result and while it waits for a frame (every frame in flight may have failed)."""

    KIND: ClassVar[str] = "failures"
    failures: list


@dataclass(frozen=True)
class Done(Message):
    KIND: ClassVar[str] = "done"
    cancelled: bool
    failures: list = field(default_factory=list)


@dataclass(frozen=True)
class Failed(Message):
    """The job or call could not run at all: its one line, the error's type, the traceback."""

    KIND: ClassVar[str] = "failed"
    text: str
    error_type: str = "LeanImageError"
    traceback: str = ""
    failures: list = field(default_factory=list)


@dataclass(frozen=True)
class Answer(Message):
    KIND: ClassVar[str] = "answer"
    value: Any


@dataclass(frozen=True)
class Freed(Message):
    KIND: ClassVar[str] = "freed"
    figures: dict


KINDS: dict[str, type[Message]] = {
    m.KIND: m for m in (Hello, Heartbeat, Job, Frame, Skip, Cancel, Ask, LeakCheck, Free, Fault, Quit,
                        Status, Event, Progress, Result, Failures, Done, Failed, Answer, Freed)
}


# ---- values: JSON and arrays -------------------------------------------------------------------
def encode(message: Message) -> tuple[dict, list]:
    """(the message as JSON-able values, its arrays in the order those values refer to them)."""
    arrays: list = []
    fields = {f.name: _plain(getattr(message, f.name), arrays) for f in dataclasses.fields(message)}
    return {"kind": message.KIND, "fields": fields}, arrays


def decode(document: dict, arrays: list) -> Message:
    try:
        cls = KINDS[document["kind"]]
        fields = {name: _value(value, arrays) for name, value in document["fields"].items()}
        return cls(**fields)
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"an unreadable message from the other process ({type(exc).__name__}: {exc})") from None


def _plain(value, arrays: list):
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [_plain(v, arrays) for v in value]
    if isinstance(value, tuple):
        return {"$tuple": [_plain(v, arrays) for v in value]}
    if isinstance(value, dict):
        return {"$dict": [[_plain(k, arrays), _plain(v, arrays)] for k, v in value.items()]}
    return _plain_object(value, arrays)


def _plain_object(value, arrays: list):
    """An array, a numpy scalar, a path or a record of this package (a dataclass)."""
    kind = type(value).__module__
    if kind == "numpy":
        if type(value).__name__ == "ndarray":
            arrays.append(value)
            return {"$array": len(arrays) - 1}
        return value.item()  # a numpy scalar: its Python value
    if isinstance(value, Path):
        return {"$path": str(value)}
    if dataclasses.is_dataclass(value) and (kind.startswith(PACKAGE + ".") or kind in _plugin_modules()):
        return {"$record": _record_name(type(value)),
                "fields": {f.name: _plain(getattr(value, f.name), arrays) for f in dataclasses.fields(value) if f.init}}
    raise TypeError(f"{kind}.{type(value).__qualname__} cannot cross to the other process")


def _value(value, arrays: list):
    if not isinstance(value, dict | list):
        return value
    if isinstance(value, list):
        return [_value(v, arrays) for v in value]
    if "$array" in value:
        return arrays[value["$array"]]
    if "$tuple" in value:
        return tuple(_value(v, arrays) for v in value["$tuple"])
    if "$dict" in value:
        return {_value(k, arrays): _value(v, arrays) for k, v in value["$dict"]}
    if "$path" in value:
        return Path(value["$path"])
    if "$record" in value:
        return _record(value["$record"])(**{k: _value(v, arrays) for k, v in value["fields"].items()})
    raise ProtocolError(f"an unknown value in a message: {sorted(value)}")


def _plugin_modules() -> set[str]:
    """The modules of the plug-in families registered on this side (families.register): their
    result records cross too, named by module (both sides import the module by that name)."""
    from .. import families

    return {getattr(f.run, "__module__", "") for f in families.ALL} - {""}


def _record_name(cls: type) -> str:
    if cls.__module__.startswith(PACKAGE + "."):
        return f"{cls.__module__[len(PACKAGE) + 1:]}:{cls.__qualname__}"
    return f"@{cls.__module__}:{cls.__qualname__}"  # a plug-in family's own module


def _record(name: str) -> type:
    """A result record (a dataclass) of this package, by its module inside the package, or of a
    plug-in family registered here: nothing else is ever imported or built from a message."""
    module, _, qualname = name.partition(":")
    if module.startswith("@"):
        module = module[1:]
        if module not in _plugin_modules():
            raise ProtocolError(f"not a record of this package or of a registered family: {name!r}")
    elif module and not module.startswith("."):
        module = f"{PACKAGE}.{module}"
    else:
        raise ProtocolError(f"not a record of this package: {name!r}")
    if "." in qualname:
        raise ProtocolError(f"not a record of this package: {name!r}")
    try:
        cls = getattr(importlib.import_module(module), qualname, None)
    except ImportError:
        cls = None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ProtocolError(f"not a record of this package: {name!r}")
    return cls


# ---- the job as plain values -------------------------------------------------------------------
def run_values(run) -> dict:
    """A models/model_run.py ModelRun as plain values; the model named by its absolute path."""
    model = run.model
    return {
        "family_id": run.family_id,
        "model": {"path": str(Path(model.path).resolve()), "title": model.title, "settings": dict(model.settings),
                  "note": model.note, "unverified_in": model.unverified_in,
                  "entry_id": model.entry.id if model.entry is not None else ""},
        "values": dict(run.values), "device": run.device,
        "budgets": {"ram_bytes": run.budgets.ram_bytes, "vram_bytes": run.budgets.vram_bytes},
        "extra": dict(run.extra),
    }


def run_from(values: dict):
    """The ModelRun :func:`run_values` gave (the worker's side)."""
    from ...runtime.settings import MemoryBudgets
    from ..model_run import ModelRun
    from ..store import library

    model = dict(values["model"])
    entry_id, folder = model.pop("entry_id"), model["unverified_in"]
    entry = library.catalog(Path(folder)).get(entry_id) if entry_id and folder else None
    return ModelRun(values["family_id"], library.ModelChoice(entry=entry, **model), dict(values["values"]),
                    values["device"], MemoryBudgets(**values["budgets"]), dict(values["extra"]))


def settings_values(settings) -> dict:
    return dataclasses.asdict(settings) if settings is not None else {}


def family_module(family) -> str:
    """Where a plug-in family is declared (its ``run``'s module), named as the worker imports it."""
    module = getattr(family.run, "__module__", "") or ""
    return "lean_image_ai" + module[len(PACKAGE):] if module.startswith(PACKAGE + ".") else module


def error_of(failed: Failed) -> Exception:
    """The worker's error as this side's exception: the project's own error type where it has one
    of that name (the host's ``except ModelFileError`` keeps working), else a LeanImageError."""
    from ...runtime import errors
    from ...runtime.errors import LeanImageError

    cls = getattr(errors, failed.error_type, None)
    if isinstance(cls, type) and issubclass(cls, LeanImageError):
        try:
            return cls(failed.text)
        except TypeError:
            pass
    # a bug rather than a refusal: where to find the rest
    return LeanImageError(f"{failed.text} (the model process's traceback is in events.jsonl)")
