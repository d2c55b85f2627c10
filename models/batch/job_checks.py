"""What the runner checks of a job before anything runs, beyond each field's kind (models/job_spec.py):
the checks that need the family (its options, its output files). A job arrives as data from a
farm driver, Blender's worker or a script, so the runner trusts none of it: one
:class:`~..job_spec.JobSpecError` naming the field, before a model is resolved or a file touched.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from .. import families
from ..family import Family
from ..job_spec import JobSpec, JobSpecError, ShotOptions
from ..outputs import OutputPolicy


def checked(spec: JobSpec) -> JobSpec:
    """``spec`` with every field checked again (a field set after it was built too) and then what
    needs its family; returns the checked copy the run uses."""
    shot = replace(spec.shot) if isinstance(spec.shot, ShotOptions) else spec.shot
    spec = replace(spec, shot=shot)  # construction is where each field is checked
    family = _family(spec.family_id)
    _check_values(family, spec.values)
    if spec.frame_list is not None and spec.output_list is not None and spec.writes_files:
        check_chunk(spec.family_id, spec.frame_list, spec.output_list)
    return spec


def _family(family_id: str) -> Family:
    try:
        return families.get(family_id)
    except ValueError as exc:
        raise JobSpecError(f"job field family_id: {exc}.") from None


def _check_values(family: Family, values: dict) -> None:
    options = {option.name: option for option in family.options}
    unknown = sorted(set(values) - set(options))
    if unknown:
        raise JobSpecError(
            f"job field values: {', '.join(unknown)} is not an option of {family.id} "
            f"(its options: {', '.join(options) or 'none'})."
        )
    for name, value in values.items():
        problem = options[name].problem(value)
        if problem:
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise JobSpecError(f"job field values.{name}: {problem}, got {shown}.")


def _key(path) -> str:
    """One spelling per file: the same file named twice (relative, through a link) is one key."""
    return os.path.normcase(str(Path(path).resolve()))


def check_chunk(family_id: str, frame_list, output_list) -> None:
    """A chunk planned elsewhere (a farm driver): no output is an input, and no two frames write
    one file (the second would replace the first and both be reported written)."""
    inputs = {_key(path): number for number, path in frame_list}
    written: dict[str, tuple[int, int]] = {}  # file -> (index in the chunk, frame number)
    for index, ((number, _), output) in enumerate(zip(frame_list, output_list, strict=True)):
        for path in OutputPolicy.of(family_id).companion_paths(Path(output)):
            key = _key(path)
            if key in inputs:
                raise JobSpecError(
                    f"job field output_list: frame {number}'s output {path} is the input of frame {inputs[key]}; "
                    "writing it would overwrite the input. Give outputs that are not inputs."
                )
            earlier = written.setdefault(key, (index, number))
            if earlier[0] != index:
                raise JobSpecError(
                    f"job field output_list: frames {earlier[1]} and {number} would both be written to {path}; "
                    "give each frame its own output."
                )
