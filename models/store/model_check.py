"""Load a model file once on the CPU through the shared runtime, to look at it (bpy-free).

Installing a download without a catalog checksum asks this before the file is taken as a model;
registering a user's file goes through family_check.check_file. Both load it with
family_check.loaded_on_cpu.
"""

from __future__ import annotations

from pathlib import Path

from .. import families
from . import family_check
from .family_check import loaded_on_cpu


def check_family_contract(path: Path, family_id: str) -> None:
    """Raise ModelFileError when ``path`` does not load, ModelContractError when it loads but its
    inputs and outputs do not fit the family."""
    check = families.get(family_id).check_session
    with loaded_on_cpu(path, "download check") as handle:
        if check is not None:
            check(handle)
        family_check.require(family_id, handle)  # fits the shapes, yet plainly another family's
