"""Does an ONNX file fit the family it is used as? (bpy-free)

A model of the wrong family often runs without an error when its shapes happen to fit (a depth
model used for background removal writes a plausible cut-out), so every registered family is asked
whether the file is its own (``Family.identify``, in the order of models/family.py IDENTIFY_ORDER)
and the surest answer says what it looks like, in words. Each family's own record holds its signs
(models/adapters/<family>.py); what they look at is models/identify.py's ModelView: names, fixed
shapes and final ops from the graph, and when the graph does not tell, one probe run on a small
generated image through the shared runtime.

A file is **refused** for a family when another family recognises it by a sure sign (a name, a final
Sigmoid, a whole-multiple output), and when no family recognises it at all (it is not run as
whatever was asked); when only the probe's values point to another family it is used with a
**warning** (the family's adapter still checks shapes and values when it runs).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ...runtime.errors import LeanImageError, ModelContractError, first_line
from .. import family as _family
from ..family import command_of
from ..identify import NO, PROBE_NUM_TOKENS, SURE, ModelView, Runner, final_ops, probe_feeds


def _looks(family_id: str) -> str:
    found = next((f for f in _family.IDENTIFY_ORDER if f.id == family_id), None)
    return found.model_looks if found is not None else f"a {family_id} model"


def _use(family_id: str) -> str:
    """How a message tells the user to run a family: its command, and its button where it has one."""
    found = next((f for f in _family.IDENTIFY_ORDER if f.id == family_id), None)
    action = found.action if found is not None else ""
    return f"{command_of(family_id)} ({action} in Blender)" if action else command_of(family_id)


@dataclass
class Finding:
    """What the file looks like: a family id (or None) and why; ``strong`` when the sign is one no
    other family shows (names, a final Sigmoid, a whole-multiple output); ``complete`` when every
    sign was looked at, the probe's included (then None means no family recognises it)."""

    looks_like: str | None
    why: str
    strong: bool = False
    complete: bool = False


@dataclass
class Verdict:
    family: str
    finding: Finding
    probed: bool = False

    @property
    def fits(self) -> bool:
        return self.finding.looks_like == self.family

    @property
    def unrecognised(self) -> bool:
        return self.finding.looks_like is None and self.finding.complete

    @property
    def refused(self) -> bool:
        return not self.fits and (self.unrecognised or (self.finding.looks_like is not None and self.finding.strong))

    @property
    def warning(self) -> str | None:
        """The line to show when the file is used anyway (None when it fits)."""
        if self.fits or self.refused:
            return None
        return self.message()

    def message(self) -> str:
        asked, f = _looks(self.family), self.finding
        if self.fits:
            return f"it looks like {asked}: {f.why}."
        if self.unrecognised:
            return f"this does not look like {asked} or any model the add-on runs: {f.why}."
        if f.looks_like is None:
            return f"it does not show the contract of {asked} ({f.why}); {command_of(self.family)} uses it, as asked."
        looks, use, asked_by = _looks(f.looks_like), _use(f.looks_like), command_of(self.family)
        if self.refused:
            return f"this looks like {looks}: {f.why}. Use {use} for it ({asked_by} cannot use it)."
        return f"this looks like {looks}: {f.why}. It may not work with {asked_by}; if it is {looks}, use {use}."


# ---- the check ----------------------------------------------------------------------------------


def ask_families(view: ModelView):
    """(the family whose answer is surest, its Match); (None, NO) when none recognises the model.
    On equal confidence the family asked first keeps it."""
    best, answer = None, NO
    for family in list(_family.IDENTIFY_ORDER):
        if family.identify is None:
            continue
        match = family.identify(view)
        if match.confidence > answer.confidence:
            best, answer = family, match
    return best, answer


def identify(handle, run: Runner | None = None) -> tuple[Finding, bool]:
    """What the loaded model (a runtime SessionHandle) looks like, and whether a probe ran: the
    graph first; ``run`` makes the probe when the graph alone does not tell (None: the graph only)."""
    ops = final_ops(handle.model_path)
    family, match = ask_families(ModelView(handle, ops))
    if match.confidence >= SURE:
        return Finding(family.id, match.why, strong=True, complete=True), False
    if run is None:
        return Finding(None, "the graph alone does not tell"), False
    view = ModelView(handle, ops, run)
    family, match = ask_families(view)
    if family is None:
        return Finding(None, view.describe(), complete=view.probed is False or view.conclusive), view.probed
    return Finding(family.id, match.why, strong=match.confidence >= SURE, complete=True), view.probed


def check(family: str, handle, run: Runner | None = None) -> Verdict:
    """Compare the loaded model with ``family``: what the families say it looks like."""
    finding, probed = identify(handle, run)
    return Verdict(family, finding, probed=probed)


_job_verdicts: dict[tuple, Verdict] = {}


def require(family: str, handle, *, probe: bool = False) -> Verdict:
    """Before a job: refuse a file that is plainly another family's, or (``probe``) no family's.
    When the graph does not tell, ``probe`` makes the probe run on a CPU session of a runtime of
    its own (``probe_privately``): the job's session, its memory figures and its runs stay the
    job's. The verdict is kept per file, family and set of registered families."""
    path = Path(handle.model_path)
    asked = tuple(f.id for f in _family.IDENTIFY_ORDER)
    try:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns, family, asked, probe)
    except OSError:
        key = (str(path), None, None, family, asked, probe)
    verdict = _job_verdicts.get(key)
    if verdict is None:
        verdict = check(family, handle)
        if probe and not verdict.finding.complete:
            verdict = probe_privately(family, path)
        _job_verdicts[key] = verdict
    if verdict.refused:
        raise ModelContractError(f"{path.name}: {verdict.message()}")
    return verdict


def probe_privately(family: str, path: Path) -> Verdict:
    """``check_file`` on a runtime made for it and cleared after: one more CPU load of the file,
    once per process, instead of a run that would count in the job's memory figures."""
    from ...runtime import Runtime  # the runtime loads where a file is checked (a child, the worker, the CLI)

    runtime = Runtime()
    try:
        return check_file(family, path, runtime)[0]
    except LeanImageError as exc:  # a probe that cannot run (memory, an odd input) proves nothing: the job says the rest
        return Verdict(family, Finding(None, f"the probe could not run: {first_line(exc)}"))
    finally:
        runtime.clear("family check")


@contextlib.contextmanager
def loaded_on_cpu(path, reason: str, runtime=None) -> Iterator:
    """``path``'s session handle on the CPU, through the shared runtime, for a look at it
    (ModelFileError when onnxruntime cannot load it). A session this opens is evicted again (a
    check must not keep weights in memory); one already cached for a job is left alone."""
    if runtime is None:
        from ...runtime import get_runtime

        runtime = get_runtime()
    before = {id(h) for h in runtime.cached_sessions()}
    handle = runtime.session(Path(path), "cpu")
    try:
        yield handle
    finally:
        if id(handle) not in before:
            runtime.evict(handle, reason=reason)


def check_file(family: str, path: str | os.PathLike, runtime, *, probe: bool = True) -> tuple[Verdict, object]:
    """At registration: load ``path`` on the CPU (``loaded_on_cpu``), check it with a probe run
    when the graph cannot tell. Returns (verdict, the handle's inputs and outputs as (inputs, outputs))."""
    with loaded_on_cpu(path, "family check", runtime) as handle, runtime.operation("family check") as op:
        runner = (lambda feeds: op.run(handle, feeds, last=True)) if probe else None
        return check(family, handle, runner), (handle.inputs, handle.outputs)


__all__ = ["PROBE_NUM_TOKENS", "Finding", "Verdict", "check", "check_file", "final_ops", "identify", "loaded_on_cpu", "probe_feeds", "require"]
