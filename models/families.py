"""The model families the add-on knows, in the order menus list them (see models/family.py).

Adding a family: write its adapter module with a ``FAMILY`` record (its options, its outputs, its
operator, button and command names, how and when it recognises its model, what it can download)
and add it to :data:`ALL`; the command line, the farm, the worker, the N-panel, its Blender
operator (for an image result) and the catalog follow from the record. A family from outside the
add-on (a plug-in, a test) is added with :func:`register` before the command line's parser or
Blender's classes are built: both read :data:`ALL` once, when they are made.
"""

from __future__ import annotations

from . import family as _family
from .adapters import ben2, da3, moge2, upscale
from .family import Family

ALL: tuple[Family, ...] = (ben2.FAMILY, da3.FAMILY, moge2.FAMILY, upscale.FAMILY)
BUILT_IN: frozenset[str] = frozenset(f.id for f in ALL)  # every model worker knows these without being told
IDS: tuple[str, ...] = tuple(f.id for f in ALL)
_BY_ID = {f.id: f for f in ALL}
# the order the family check asks them (models/family.py IDENTIFY_ORDER says why an order)
_family.IDENTIFY_ORDER[:] = sorted(ALL, key=lambda f: f.identify_rank)


def register(family: Family, *, identify_first: bool = False) -> None:
    """Add ``family`` after the families above (see the module doc for when). The family check
    asks it where its ``identify_rank`` puts it (after the built-ins by default, so a family that
    recognises too much cannot take their models); with ``identify_first`` it is asked first."""
    global ALL, IDS
    if family.id in _BY_ID:
        raise ValueError(f"a model family {family.id!r} is already registered")
    taken = {o.name for f in ALL for o in f.options} & {o.name for o in family.options}
    if taken:  # the scene settings hold every family's options side by side
        raise ValueError(f"family {family.id!r}: option names {sorted(taken)} are another family's already")
    ALL = (*ALL, family)
    IDS = (*IDS, family.id)
    _BY_ID[family.id] = family
    order = _family.IDENTIFY_ORDER
    after = sum(1 for f in order if f.identify_rank <= family.identify_rank)
    order.insert(0 if identify_first else after, family)


def get(family_id: str) -> Family:
    try:
        return _BY_ID[family_id]
    except KeyError:
        raise ValueError(f"unknown model family {family_id!r}; expected one of {', '.join(IDS)}") from None
