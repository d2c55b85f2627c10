"""What a job did to memory, in one wording for the panel, the command line and the event log.

Per figure (``ram``: process RSS, what the OS sees; ``vram``: this process on the GPU, what
the driver (NVML) sees), a job is reported as:

- **loaded**: what loading models during the job added (weights; never mixed with the runs);
- **grew**: the peak over the memory before the runs (memory before the job + loaded);
- **gave back**: peak minus the memory after the release;
- **kept**: after the release minus the memory before the runs, never below zero (a release
  that also gave back pages loading touched says so instead); the job's own results still held
  are a line of their own, apart from what the runtime kept;
- **what stays**, in labelled floors that add up to it: runtime/libraries, the job's results
  still held, what the runtime kept (arena regions still reserved, bound output buffers), model
  weights of the cached sessions, and the rest of the process (never below zero).

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
    return f"{int(round(value / 2**20))} MiB"  # an int: a few KiB below zero is "0 MiB", never "-0 MiB"


def _sub(a, b):
    return None if a is None or b is None else a - b


def _floors(wanted: list[tuple[str, int | None]], after: int | None) -> list[tuple[str, int | None]]:
    """Each part of ``after`` in turn, at most what is left of it, then the rest of the process."""
    floors, left = [], after
    for label, value in wanted:
        if value is not None and left is not None:
            value = min(max(0, value), max(0, left))
            left -= value
        floors.append((label, value))
    floors.append(("rest of the process", None if left is None else max(0, left)))
    return floors


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
    results: int = 0,
    session_state: int = 0,
    unfinished: int = 0,
) -> dict:
    """The numbers of one figure for one job (all bytes; None where unknown).

    `results`: bytes of the job's own results still alive when the report is made (an upscale's
    image: the caller's to drop), shown apart from what the runtime kept. No figure is negative:
    a release can give back pages that loading touched (a large model's parse buffers, trimmed
    from the C heap), so `after` can fall below `before + loaded`; that part is `load_given_back`
    (grew = gave back + kept - load_given_back), and the floors are filled in order of how surely
    each is known (libraries, results, runtime, weights), each at most what is left of `after`,
    so they add up to it and the rest is never below zero.
    """
    base = None if before is None else before + loaded
    peak = None if peak is None else max(peak, after or 0, base or 0)
    difference = _sub(after, base)
    kept = None if difference is None else max(0, difference)
    load_given_back = 0 if difference is None else max(0, -difference)
    results = max(0, int(results or 0)) if key == "ram" else 0  # results live in RAM
    # a cancelled or failed frame's buffers, still referenced while its exception unwinds: their
    # size as allocated, not as resident (an output canvas is touched only where tiles were pasted)
    unfinished = max(0, int(unfinished or 0)) if key == "ram" else 0
    runtime_kept = None if kept is None else max(0, kept - results)
    sessions = f"{cached_sessions} cached session{'s' if cached_sessions != 1 else ''}"
    session_label = f"model weights ({sessions}, as the model files hold them)"
    wanted = [
        ("runtime/libraries", library),
        ("results still held (the job's outputs, the caller's to drop)", results),
        ("kept by the runtime (arena regions still reserved, bound output buffers)", runtime_kept),
        (session_label, weights),
        (f"the sessions' own state ({sessions}: onnxruntime's graph and kernels beyond the weights)", session_state),
    ]
    floors = _floors(wanted, after)
    return {
        "figure": key,
        "label": LABELS[key],
        "before": before,
        "loaded": loaded,
        "peak": peak,
        "grew": _sub(peak, base),
        "gave_back": _sub(peak, after),
        "kept": kept,
        "load_given_back": load_given_back,
        "results": results,
        "unfinished": unfinished,
        "runtime_kept": runtime_kept,
        "after": after,
        "floors": floors,
    }


def _kept(f: dict) -> str:
    """What the job kept, results apart from the runtime's own."""
    if f.get("results"):
        return f"the runtime kept {mb(f.get('runtime_kept'))}; results still held: {mb(f['results'])}"
    return f"the job kept {mb(f['kept'])}"


def format_figures(f: dict, *, released: bool, loaded_models=(), deferred_s: float = 0) -> list[str]:
    lines = [f"{f['label']}:"]
    load = ""
    if loaded_models:
        load = f"; loading {', '.join(loaded_models)} took {mb(f['loaded'])}"
    lines.append(f"  before the job {mb(f['before'])}{load}")
    lines.append(f"  the runs grew {mb(f['grew'])} (job peak {mb(f['peak'])})")
    from_load = ""
    if f.get("load_given_back"):
        from_load = f" ({mb(f['load_given_back'])} of it touched while loading)"
    if deferred_s:
        lines.append(
            f"  the release is deferred: RAM goes back after {deferred_s:g} s without a job; "
            f"until then {_kept(f)}"
        )
    elif released:
        lines.append(f"  the release gave back {mb(f['gave_back'])}{from_load}; {_kept(f)}")
    else:
        lines.append(f"  no release (nothing shrinkable, or releasing is off); {_kept(f)}")
    floors = " · ".join(f"{label} {size(value) if label.startswith('model weights') else mb(value)}"
                        for label, value in f["floors"])
    lines.append(f"  what stays ({mb(f['after'])}): {floors}")
    if f.get("unfinished"):
        lines.append(
            f"  of what it kept, the unfinished frame's buffers (its output canvas, its copies of the input: "
            f"{mb(f['unfinished'])} allocated, resident only where written) are still referenced while the job "
            "stops; they are freed as soon as it has returned. The cached session and the arena's reserved "
            "regions stay on purpose, for the next job (Release Now gives the regions back, Unload All the session too)"
        )
    return lines


def size(value) -> str:
    """Bytes as they are below one MiB (a tiny model's weights are not "0 MiB"), else :func:`mb`."""
    if value is not None and 0 <= value < 2**20:
        return f"{value} B" if value < 1024 else f"{value / 1024:.0f} KiB"
    return mb(value)


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
