"""A recording stand-in for ``bpy.types.UILayout``, for drawing panels in tests.

Why a stand-in: bpy as a Python module always runs in background mode, with no windows, areas
or regions, so Blender never creates a real ``UILayout`` to hand to ``Panel.draw``. This object
takes the same calls (``row``/``column``/``box``/``label``/``prop``/``operator``/``progress``...),
records them in order, and checks what a real layout would reject: icon names must be Blender
icons, ``prop()`` names must be real RNA properties of the data, and properties set on a
registered operator's button must exist on that operator.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _blender_icons() -> frozenset[str]:
    import bpy

    return frozenset(bpy.types.UILayout.bl_rna.functions["label"].parameters["icon"].enum_items.keys())


def _layout_parameters(function: str) -> frozenset[str]:
    import bpy

    return frozenset(p.identifier for p in bpy.types.UILayout.bl_rna.functions[function].parameters)


def _operator_properties(idname: str) -> frozenset[str] | None:
    """Property names of a registered operator, None when it is not registered."""
    import bpy

    category, _, name = idname.partition(".")
    try:
        rna = getattr(getattr(bpy.ops, category), name).get_rna_type()
    except (AttributeError, KeyError, RuntimeError):
        return None
    return frozenset(p.identifier for p in rna.properties if p.identifier != "rna_type")


@dataclass
class Call:
    kind: str  # label | prop | operator | operator_menu_enum | progress | separator
    text: str = ""
    icon: str = "NONE"
    alert: bool = False
    enabled: bool = True
    data: object = None
    name: str = ""  # prop name, operator idname
    props: dict = field(default_factory=dict)  # operator properties set by the drawing code
    factor: float | None = None


class OperatorButton:
    """What ``operator()`` returns: records the properties the draw code sets."""

    def __init__(self, call: Call, known: frozenset[str] | None):
        object.__setattr__(self, "_call", call)
        object.__setattr__(self, "_known", known)

    def __setattr__(self, name, value):
        if self._known is not None and name not in self._known:
            raise AttributeError(f"operator {self._call.name!r} has no property {name!r}")
        self._call.props[name] = value

    def __getattr__(self, name):
        try:
            return self._call.props[name]
        except KeyError:
            raise AttributeError(name) from None


class RecordingLayout:
    _icons: frozenset[str] | None = None

    def __init__(self, log: list[Call] | None = None, parent: RecordingLayout | None = None):
        self.log = [] if log is None else log
        self.parent = parent
        self.enabled = True
        self.alert = False
        self.active = True

    @staticmethod
    def _check_params(function: str, names) -> None:
        """Keyword arguments must be parameters of the real UILayout function."""
        unknown = set(names) - _layout_parameters(function)
        if unknown:
            raise TypeError(f"UILayout.{function}() has no parameter(s) {sorted(unknown)}")

    # -- sub-layouts ----------------------------------------------------------------------------
    def row(self, **kw) -> RecordingLayout:
        self._check_params("row", kw)
        return RecordingLayout(self.log, self)

    def column(self, **kw) -> RecordingLayout:
        self._check_params("column", kw)
        return RecordingLayout(self.log, self)

    def box(self) -> RecordingLayout:
        return RecordingLayout(self.log, self)

    def split(self, **kw) -> RecordingLayout:
        self._check_params("split", kw)
        return RecordingLayout(self.log, self)

    # -- state inherited from the parents, as Blender does --------------------------------------
    def _alert(self) -> bool:
        return self.alert or (self.parent is not None and self.parent._alert())

    def _enabled(self) -> bool:
        return self.enabled and (self.parent is None or self.parent._enabled())

    def _check_icon(self, icon: str) -> str:
        if RecordingLayout._icons is None:
            RecordingLayout._icons = _blender_icons()
        if icon not in RecordingLayout._icons:
            raise TypeError(f"{icon!r} is not a Blender icon")
        return icon

    def _record(self, kind, **fields) -> Call:
        call = Call(kind, alert=self._alert(), enabled=self._enabled(), **fields)
        self.log.append(call)
        return call

    # -- widgets --------------------------------------------------------------------------------
    def label(self, *, text="", icon="NONE", **kw):
        self._check_params("label", kw)
        if not isinstance(text, str):
            raise TypeError(f"label text must be str, got {type(text).__name__}")
        self._record("label", text=text, icon=self._check_icon(icon))

    def prop(self, data, property, *, text=None, icon="NONE", **kw):  # noqa: A002 (Blender's name)
        self._check_params("prop", kw)
        if property not in data.bl_rna.properties:
            raise TypeError(f"{type(data).__name__} has no property {property!r}")
        self._record("prop", data=data, name=property, text=text or "", icon=self._check_icon(icon))

    def operator(self, operator, *, text="", icon="NONE", **kw):
        self._check_params("operator", kw)
        call = self._record("operator", name=operator, text=text, icon=self._check_icon(icon))
        return OperatorButton(call, _operator_properties(operator))

    def operator_menu_enum(self, operator, property, *, text="", icon="NONE", **kw):  # noqa: A002
        self._check_params("operator_menu_enum", kw)
        known = _operator_properties(operator)
        if known is not None and property not in known:
            raise TypeError(f"operator {operator!r} has no property {property!r}")
        self._record(
            "operator_menu_enum",
            name=operator,
            text=text,
            icon=self._check_icon(icon),
            props={"property": property},
        )

    def progress(self, *, factor=0.0, type="BAR", text="", **kw):  # noqa: A002
        self._check_params("progress", kw)
        if type not in ("BAR", "RING"):
            raise TypeError(f"progress type {type!r} is not BAR or RING")
        if not 0.0 <= float(factor) <= 1.0:
            raise ValueError(f"progress factor {factor} outside [0, 1]")
        self._record("progress", text=text, factor=float(factor))

    def separator(self, **kw):
        self._check_params("separator", kw)
        self._record("separator")

    # -- queries for tests ----------------------------------------------------------------------
    def calls(self, kind: str) -> list[Call]:
        return [c for c in self.log if c.kind == kind]

    def operators(self, idname: str) -> list[Call]:
        return [c for c in self.log if c.kind == "operator" and c.name == idname]

    def texts(self) -> list[str]:
        return [c.text for c in self.log if c.kind in ("label", "progress")]

    def joined_text(self) -> str:
        """Every label and progress text joined with spaces (wrapped messages read as one)."""
        return " ".join(self.texts())


class FakePanel:
    """``self`` for calling an unbound ``Panel.draw`` with a recording layout."""

    def __init__(self, layout: RecordingLayout | None = None):
        self.layout = layout or RecordingLayout()
