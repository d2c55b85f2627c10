"""Load a model file once on the CPU through the shared runtime, to look at it (bpy-free).

Registering a user's file and installing a download without a catalog checksum both ask this
before the file is taken as a model. A session this opens is evicted again (a check must not keep
weights in memory); one already cached for a running job is left alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ..runtime import get_runtime
from . import families, family_check


@contextlib.contextmanager
def loaded_on_cpu(path: Path, reason: str) -> Iterator:
    """The file's session handle for the block (ModelFileError when onnxruntime cannot load it)."""
    runtime = get_runtime()
    before = {id(h) for h in runtime.cached_sessions()}
    handle = runtime.session(path, "cpu")
    try:
        yield handle
    finally:
        if id(handle) not in before:
            runtime.evict(handle, reason=reason)


def check_family_contract(path: Path, family_id: str) -> None:
    """Raise ModelFileError when ``path`` does not load, ModelContractError when it loads but its
    inputs and outputs do not fit the family."""
    check = families.get(family_id).check_session
    with loaded_on_cpu(path, "download check") as handle:
        if check is not None:
            check(handle)
        family_check.require(family_id, handle)  # fits the shapes, yet plainly another family's
