"""The model families the add-on knows, in the order menus list them (see models/family.py).

Adding a family: write its adapter module with a ``FAMILY`` record (its options, its outputs, its
operator and command names, how it recognises its model) and add it to :data:`ALL` and
:data:`IDENTIFY_ORDER` (and its downloadable models to models/store/builtin_models.py). A family
from outside the add-on (a plug-in, a test) is added with :func:`register` before the command
line's parser or Blender's classes are built: both read :data:`ALL` once, when they are made.
"""

from __future__ import annotations

from . import family as _family
from .adapters import ben2, da3, moge2, upscale
from .family import Family

ALL: tuple[Family, ...] = (ben2.FAMILY, da3.FAMILY, moge2.FAMILY, upscale.FAMILY)
IDS: tuple[str, ...] = tuple(f.id for f in ALL)
_BY_ID = {f.id: f for f in ALL}
# the order the family check asks them (models/family.py IDENTIFY_ORDER says why an order)
_family.IDENTIFY_ORDER[:] = [moge2.FAMILY, da3.FAMILY, upscale.FAMILY, ben2.FAMILY]


def register(family: Family, *, identify_first: bool = False) -> None:
    """Add ``family`` after the families above (see the module doc for when). The family check
    asks it after them, so a family that recognises too much cannot take their models; with
    ``identify_first`` it is asked before them."""
    global ALL, IDS
    if family.id in _BY_ID:
        raise ValueError(f"a model family {family.id!r} is already registered")
    taken = {o.name for f in ALL for o in f.options} & {o.name for o in family.options}
    if taken:  # the scene settings hold every family's options side by side
        raise ValueError(f"family {family.id!r}: option names {sorted(taken)} are another family's already")
    ALL = (*ALL, family)
    IDS = (*IDS, family.id)
    _BY_ID[family.id] = family
    _family.IDENTIFY_ORDER.insert(0 if identify_first else len(_family.IDENTIFY_ORDER), family)


def get(family_id: str) -> Family:
    try:
        return _BY_ID[family_id]
    except KeyError:
        raise ValueError(f"unknown model family {family_id!r}; expected one of {', '.join(IDS)}") from None
