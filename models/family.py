"""What a model family is, declared once: the record every adapter module exports as ``FAMILY``.

The catalog validates its entries' ``settings`` against :attr:`Family.settings`; the Blender
operators, the N-panel's buttons and the scene settings are built from :attr:`Family.options`;
the adapter keywords of a job come from :meth:`Family.adapter_kwargs`. Nothing else names a
family's knobs. What a result becomes as files (default format, name tag, accepted formats,
companion files, an image or a writer of its own) is its :class:`Output`, applied by
models/outputs.py's JobOutput for every front-end.

Two kinds of knobs:

- a :class:`Setting` is a constant of one ONNX export (its normalisation, its input size...):
  it lives in the catalog entry, the artist never sees it;
- an :class:`Option` is what the artist chooses per job (a resolution level, make a plane...):
  an operator property, a scene setting the panel shows, a command-line flag.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Setting:
    name: str
    check: Callable[[Any], Any]  # returns the value in the adapter's form; raises ValueError
    keyword: str = ""  # the adapter's keyword when it is spelled differently

    @property
    def adapter_keyword(self) -> str:
        return self.keyword or self.name


@dataclass(frozen=True)
class Option:
    name: str
    kind: type  # bool, int or float
    default: Any
    label: str
    description: str
    min: float | None = None
    max: float | None = None
    soft_max: float | None = None
    to_adapter: bool = True  # False: used by the front-end only (e.g. the mesh's discontinuity)
    blender_only: bool = False  # about Blender data (a camera, replacing pixels): no CLI flag
    alias: str = ""  # a shorter command-line flag that also takes the word "auto" for the default

    def problem(self, value) -> str:
        """What is wrong with ``value`` for this option ("" if nothing): its kind and its range,
        for a job received as data (models/batch/job_checks.py). Blender keeps a float property
        as a 32-bit float, a hair past a decimal limit: within a millionth of it counts as in."""
        if self.kind is bool:
            return "" if isinstance(value, bool) else "give true or false"
        slack = 1e-6 * max(abs(self.min or 0), abs(self.max or 0), 1) if self.kind is float else 0
        return number_problem(value, self.kind, self.min, self.max, slack=slack)


def number_problem(value, kind=int, minimum=None, maximum=None, *, slack: float = 0) -> str:
    """THE rule of a number option ("" if ``value`` keeps it): a finite ``kind`` (an int for a
    float too, never a bool) within [minimum, maximum]. The command line's flags say it as well."""
    what = "a whole number" if kind is int else "a number"
    kinds = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        return f"give {what}"
    if (minimum is None or value >= minimum - slack) and (maximum is None or value <= maximum + slack):
        return ""
    if minimum is not None and maximum is not None:
        return f"give {what} from {minimum:g} to {maximum:g}"
    if minimum is not None:
        return f"give {what} of {minimum:g} or more"
    return f"give {what} of at most {maximum:g}"


@dataclass(frozen=True)
class Output:
    """What a family's result becomes as files: the family's own record of its outputs. ``product``
    says what the result is (models/result_images.py's MASK, DEPTH, IMAGE, MESH) and gives the
    format fields' defaults; a field given here wins."""

    tag: str  # default names: ``<stem>_<tag>.<ext>``, a sequence's folder ``<input folder>_<tag>``
    what: str  # how messages name one result ("a cut-out")
    suffix: str = ""  # the default format for an 8- or 16-bit input
    float_suffix: str = ""  # the default format for a float input ("": ``suffix``)
    formats: tuple[str, ...] = ()  # the only suffixes it can be written to; (): any image format
    formats_hint: str = ""  # what to give instead, when ``formats`` refuses a name
    needs_alpha: bool = False  # the result is the alpha: formats without alpha are refused
    companions: tuple[str, ...] = ()  # more files per result, as ``{stem}`` templates ("{stem}.json")
    image: Any = None  # an image result: .product(result, suffix, float_suffixes), .describe(...)
    # a result that is not one image: write(path, result, option_values, write_image) -> notes
    write: Callable[..., list[str]] | None = None
    # ``write``'s files made over several calls of a front-end's main thread (Blender's Process
    # Sequence): stage(path, result, option_values) -> steps, whose pump(budget) is True once written
    stage: Callable[..., Any] | None = None
    description: str = ""  # how the report names what ``write`` writes
    preview: Callable[[Any], Any] | None = None  # the image Preview Frame shows of such a result
    product: Any = None  # a models/result_images.py ProductKind

    def __post_init__(self):
        for name in ("suffix", "float_suffix", "formats", "needs_alpha", "image"):
            if self.product is not None and not getattr(self, name):
                object.__setattr__(self, name, getattr(self.product, name))
        if not self.suffix:
            raise ValueError(f"output {self.tag!r}: give its product (models/result_images.py) or a suffix")

    def default_suffix(self, input_kind: str = "8-bit") -> str:
        return (self.float_suffix or self.suffix) if input_kind == "float" else self.suffix

    def companion_paths(self, path: Path) -> list[Path]:
        """Every file one result writes, the main one first."""
        return [path] + [path.with_name(template.format(stem=path.stem)) for template in self.companions]


def command_of(family_id: str) -> str:
    """What a user types (and reads in messages) for a family: its command, never its id. Every
    registered family is in :data:`IDENTIFY_ORDER` (models/__init__.py loads the registry with the
    package), so a message can name any family whichever module runs the job."""
    found = next((f for f in IDENTIFY_ORDER if f.id == family_id and f.command), None)
    return found.command if found is not None else family_id


@dataclass(frozen=True)
class Family:
    id: str
    title: str  # how every message and heading names the family
    produces: str  # one line: what a job gives the artist
    run: Callable  # run(images, model_path, *, options, **keywords) -> result(s)
    settings: tuple[Setting, ...]
    user_defaults: Mapping[str, Any]  # settings of a model the user registers by path
    options: tuple[Option, ...] = ()
    action: str = ""  # the operator's label; with ``operator`` and an image output, the operator is
    # made from this record (operators/image_ops.py) unless the add-on writes one by hand
    icon: str = "NONE"  # Blender icon name of the button
    operator: str = ""  # the operator's name after "lean_image_ai."
    command: str = ""  # the command line's name for it
    fallback_model: Path | None = None  # used when no model of the family is installed
    # check_session(handle): raises ModelContractError when a loaded model's inputs and outputs
    # do not fit the family (the same check a job makes; the installer asks it of a download)
    check_session: Callable[[Any], Any] | None = None
    output: Output | None = None  # what a result becomes as files (models/outputs.py applies it)
    # the shot options a sequence of it takes (models/batch/shot_batch.py): "depth" (one depth range,
    # aligned depth: results with ``.depth``), "camera" (one camera fitted for the shot)
    shot: frozenset[str] = frozenset()
    # how the family recognises its own model: identify(models/identify.py ModelView) -> Match (a
    # confidence and why); the family check asks every family (IDENTIFY_ORDER), the surest wins.
    # None: it recognises no file, so every file given to it is refused
    identify: Callable[[Any], Any] | None = None
    looks: str = ""  # what a refusal calls its model ("a depth model")
    # where the family check asks it: lower first (IDENTIFY_ORDER says why an order matters); a
    # family from outside the add-on is asked after the built-ins unless it says otherwise
    identify_rank: int = 100
    heading: str = ""  # the N-panel box's title: what the task is ("": ``title``)
    button: str = ""  # the N-panel button's text, "{}" the image it works on ("": "<action>: {}")
    # the exports it can download, beside the built-in table's (models/store/builtin_models.py): each
    # the fields of a catalog entry (models/store/catalog_entry.py) but its family, which is this one
    downloads: tuple[Mapping[str, Any], ...] = ()
    _by_name: Mapping[str, Setting] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_by_name", {s.name: s for s in self.settings})
        self.check_settings(self.user_defaults, f"the {self.title} defaults")

    def check_settings(self, values: Mapping[str, Any], where: str) -> dict[str, Any]:
        """``values`` checked against :attr:`settings`: an unknown or ill-typed key is an error
        naming ``where`` (an entry id, a file), never silently dropped."""
        checked = {}
        for name, value in (values or {}).items():
            setting = self._by_name.get(name)
            if setting is None:
                known = ", ".join(sorted(self._by_name)) or "none"
                raise ValueError(f"{where}: unknown {self.id} setting {name!r} (known: {known})")
            try:
                checked[name] = setting.check(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: setting {name!r} = {value!r}: {exc}") from None
        return checked

    def adapter_kwargs(self, settings: Mapping[str, Any], **option_values) -> dict[str, Any]:
        """Keyword arguments of :attr:`run` for a model's settings and the job's option values."""
        kwargs = {self._by_name[name].adapter_keyword: value for name, value in settings.items()}
        adapter_options = {o.name for o in self.options if o.to_adapter}
        kwargs.update({k: v for k, v in option_values.items() if k in adapter_options})
        return kwargs

    def option(self, name: str) -> Option:
        return next(o for o in self.options if o.name == name)

    @property
    def model_looks(self) -> str:
        return self.looks or f"a {self.title} model"

    @property
    def panel_heading(self) -> str:
        return self.heading or self.title

    def button_text(self, target: str) -> str:
        return (self.button or f"{self.action}: {{}}").format(target)


# The order the family check asks the families in (by ``identify_rank``): the more particular model
# first (a MoGe-2 export also has a one-channel mask, which alone would look like a matte), so on
# equal confidence the earlier family's answer wins. Filled by models/families.py, which imports the
# adapters; it lives here because the frame loop the adapters run checks every job's file against it.
IDENTIFY_ORDER: list[Family] = []


# ---- setting checks -------------------------------------------------------------------------


def _number(value, kind=float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("expected a number")
    return kind(value)


def positive_int(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError("expected a positive integer")
    return value


def non_negative_int(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("expected an integer >= 0")
    return value


def unit_interval(value) -> float:
    number = _number(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError("expected a number from 0 to 1")
    return number


def rgb_triple_or_none(value):
    """Per-channel mean or std: three numbers, or None (0 and 1: no normalisation)."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise ValueError("expected three numbers (R, G, B) or null")
    return tuple(_number(v) for v in value)


def size_or_none(value):
    """An input size: one side, or (height, width), or None (the model's own)."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        if len(value) != 2:
            raise ValueError("expected one side or (height, width)")
        return tuple(positive_int(v) for v in value)
    return positive_int(value)


def int_range(value) -> tuple[int, int]:
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ValueError("expected (low, high)")
    low, high = (positive_int(v) for v in value)
    if low > high:
        raise ValueError("low is above high")
    return low, high


def one_of(*choices: str) -> Callable[[Any], str]:
    def check(value) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return check
