"""Registering your own ONNX file as a model of a family (bpy-free): what Blender's Register button
and ``python -m lean_image_ai models register`` both do.

The file is loaded on the CPU through the shared runtime and checked against the family's
contract (models/store/family_check.py, with a probe run when the graph cannot tell); a file that is
plainly another family's is refused with what it looks like, one that fits no family is
registered with a warning. Only then is it added to ``user_models.json`` in the models folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...runtime import load_errors
from ...runtime.errors import LeanImageError, ModelContractError, ModelFileError, first_line, user_path
from .. import families
from . import family_check, library
from .catalog_entry import CatalogEntry


@dataclass
class Registered:
    entry: CatalogEntry
    store: Path  # the user_models.json written
    verdict: family_check.Verdict
    inputs: str
    outputs: str

    def summary(self) -> str:
        title = families.get(self.entry.family).title
        line = f"Registered {self.entry.title} as a {title} model (inputs: {self.inputs}; outputs: {self.outputs}); saved in {self.store}."
        return line if self.verdict.warning is None else f"{line} Warning: {self.verdict.warning}"


def check(family: str, path: str | os.PathLike, *, runtime=None, progress: Callable[[float, str], None] | None = None):
    """(verdict, inputs summary, outputs summary) of ``path`` as a ``family`` model; raises a
    one-line LeanImageError when it cannot be loaded or is plainly another family's."""
    title = families.get(family).title
    path = user_path(path)
    if not os.path.lexists(path):
        raise ModelFileError(f"Cannot register {str(path)!r}: there is no file at that path. Pick the .onnx file itself.")
    load_errors.model_identity(path)  # a folder, pipe, device, link loop or no permission: named as --model names it
    report = progress or (lambda _f, _s: None)
    report(0.1, f"loading {path.name} on the CPU")
    if runtime is None:  # loaded here, where the file is checked (a child of Blender's, the command line)
        from ...runtime import get_runtime

        runtime = get_runtime()
    try:
        verdict, (inputs, outputs) = family_check.check_file(family, path, runtime)
    except ModelFileError as exc:
        detail = first_line(exc.__cause__) if exc.__cause__ is not None else str(exc)
        raise ModelFileError(
            f"Cannot register {path.name} as a {title} model: onnxruntime cannot load it as an ONNX model "
            f"({detail}). Pick a complete, valid .onnx file."
        ) from exc
    except LeanImageError as exc:  # e.g. not enough memory to load it
        raise type(exc)(f"Cannot register {path.name} as a {title} model: {exc}") from exc
    except Exception as exc:
        raise ModelFileError(f"Cannot register {path.name}: onnxruntime could not load it ({first_line(exc)}).") from exc
    report(0.9, "checked" + (" with a probe run" if verdict.probed else ""))
    if verdict.refused:
        raise ModelContractError(f"Cannot register {path.name} as a {title} model: {verdict.message()}")
    return verdict, library.tensor_summary(inputs), library.tensor_summary(outputs)


def save(family: str, path: str | os.PathLike, folder: Path, verdict, inputs: str, outputs: str) -> Registered:
    """Add the checked file to the models folder's user models (a quick step: the main thread's)."""
    path = user_path(path)
    try:
        with library.editing_catalog(folder) as known:  # another process may be adding one now
            entry = known.add_user_model(family, path)
    except (ValueError, OSError) as exc:
        raise LeanImageError(f"Cannot register {path.name}: {exc}") from exc
    return Registered(entry, Path(folder) / library.USER_MODELS_FILE, verdict, inputs, outputs)


def unregister(model_id: str, folder: Path) -> Path:
    """Forget a registered model (its file is left alone); returns the list saved. One removed by
    another process meanwhile is simply gone."""
    with library.editing_catalog(folder) as known:  # another process may be changing the list now
        if model_id in known:
            known.remove_user_model(model_id)
    return Path(folder) / library.USER_MODELS_FILE


def register(family: str, path: str | os.PathLike, folder: Path, *, runtime=None, progress=None) -> Registered:
    verdict, inputs, outputs = check(family, path, runtime=runtime, progress=progress)
    return save(family, path, folder, verdict, inputs, outputs)


__all__ = ["Registered", "check", "register", "save", "unregister"]
