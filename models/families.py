"""The model families the add-on knows, in the order menus list them (see models/family.py).

Adding a family: write its adapter module with a ``FAMILY`` record, add it to :data:`ALL`, and add
its downloadable models to models/builtin_models.py.
"""

from __future__ import annotations

from . import ben2, da3, moge2, upscale
from .family import Family

ALL: tuple[Family, ...] = (ben2.FAMILY, da3.FAMILY, moge2.FAMILY, upscale.FAMILY)
IDS: tuple[str, ...] = tuple(f.id for f in ALL)
_BY_ID = {f.id: f for f in ALL}


def get(family_id: str) -> Family:
    try:
        return _BY_ID[family_id]
    except KeyError:
        raise ValueError(f"unknown model family {family_id!r}; expected one of {', '.join(IDS)}") from None
