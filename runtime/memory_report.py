"""What a job did to memory, in one wording for the panel, the command line and the event log.

Per figure (``ram``: process RSS, what the OS sees; ``vram``: this process on the GPU, what
the driver (NVML) sees), a job is reported as:

- **loaded**: what loading models during the job added (weights; never mixed with the runs);
- **grew**: the peak over the memory before the runs (memory before the job + loaded);
- **gave back**: peak minus the memory after the release;
- **kept**: after the release minus the memory before the runs (grew = gave back + kept);
- **what stays**, in labelled floors: runtime/libraries, model weights of the cached sessions,
  what jobs kept (arena regions still reserved, outputs), and the rest of the process.

There is never a "before -> after" arrow: across a model load it reads as the release adding
memory. Everything here is plain data in, plain text out (no bpy, no onnxruntime).
"""

from __future__ import annotations

LABELS = {
    "ram": "process RAM (RSS, what the OS sees)",
    "vram": "GPU memory of this process (NVML, what the driver sees)",
}


def mb(value) -> str:
    if value is None:
        return "n/a"
    sign = "-" if value < 0 else ""
    return f"{sign}{abs(value) / 2**20:.0f} MB"


def _sub(a, b):
    return None if a is None or b is None else a - b


def job_figures(
    key: str,
    *,
    before: int | None,
    loaded: int,
    peak: int | None,
    after: int | None,
    library: int | None,
    weights: int,
    cached_sessions: int,
) -> dict:
    """The numbers of one figure for one job (all bytes; None where unknown)."""
    base = None if before is None else before + loaded
    peak = None if peak is None else max(peak, after or 0, base or 0)
    kept = _sub(after, base)
    floors = [
        ("runtime/libraries", library),
        (f"model weights ({cached_sessions} cached session{'s' if cached_sessions != 1 else ''})", weights),
        ("kept by this job (arena regions still reserved, its outputs)", kept),
    ]
    known = sum(v for _, v in floors if v is not None)
    floors.append(("rest of the process", _sub(after, known) if after is not None else None))
    return {
        "figure": key,
        "label": LABELS[key],
        "before": before,
        "loaded": loaded,
        "peak": peak,
        "grew": _sub(peak, base),
        "gave_back": _sub(peak, after),
        "kept": kept,
        "after": after,
        "floors": floors,
    }


def format_figures(f: dict, *, released: bool, loaded_models=(), deferred_s: float = 0) -> list[str]:
    lines = [f"{f['label']}:"]
    load = ""
    if loaded_models:
        load = f"; loading {', '.join(loaded_models)} took {mb(f['loaded'])}"
    lines.append(f"  before the job {mb(f['before'])}{load}")
    lines.append(f"  the runs grew {mb(f['grew'])} (peak {mb(f['peak'])})")
    if deferred_s:
        lines.append(
            f"  the release is deferred: RAM goes back after {deferred_s:g} s without a job; "
            f"until then the job keeps {mb(f['kept'])}"
        )
    elif released:
        lines.append(f"  the release gave back {mb(f['gave_back'])}; the job kept {mb(f['kept'])}")
    else:
        lines.append(f"  no release (nothing shrinkable, or releasing is off); the job kept {mb(f['kept'])}")
    floors = " · ".join(f"{label} {mb(value)}" for label, value in f["floors"])
    lines.append(f"  what stays ({mb(f['after'])}): {floors}")
    return lines


def format_job_memory(job: dict) -> list[str]:
    """The report of one job (the dict a ``job_memory`` event carries)."""
    lines = [f"memory of {job['operation']} ({job['outcome']}, {', '.join(job['devices']) or 'no model'}):"]
    for f in job["figures"]:
        deferred_s = job.get("release_deferred_s", 0) if f["label"] == LABELS["ram"] else 0
        lines += [
            "  " + line
            for line in format_figures(
                f, released=job["released"], loaded_models=job["loaded_models"], deferred_s=deferred_s
            )
        ]
    lines.append("  " + three_figures(job))
    lines += [f"  release rule: {note}" for note in job.get("release_rules") or ()]
    lines += [f"  budget: {note}" for note in job.get("budget") or ()]
    return lines


def three_figures(job: dict) -> str:
    """The three figures people confuse, each named for what it measures."""
    seen = "; ".join(
        f"{'the OS sees (RSS)' if f['figure'] == 'ram' else 'the driver sees (NVML)'} {mb(f['after'])}"
        for f in job["figures"]
    )
    given = job["figures"][-1]["gave_back"] if job["figures"] else None
    return (
        f"live tensors (the last run's outputs) {mb(job['live_output_bytes'])}; "
        f"reserved by the runtime and given back {mb(given) if job['released'] else 'none'}; {seen}"
    )


def format_freed(action: str, freed: dict) -> str:
    """One line for Release now / Unload all: what each figure went down by."""
    parts = [f"{LABELS[key].split(' (')[0]} {mb(value)}" for key, value in freed["by"].items() if value is not None]
    what = f"; {freed['sessions']} session(s) unloaded" if freed.get("sessions") else ""
    return f"{action} freed {', '.join(parts) or 'nothing measurable'}{what}"
