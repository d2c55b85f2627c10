"""What the add-on costs on top of onnxruntime, side by side in one run (ratios only).

    .venv/bin/python bench/overhead.py [--pairs 7] [--threads 2]

(a) end-to-end `upscale.run` (HxWx3 float32 in, result out: preparation, receptive-radius plan,
    tiles, IOBinding into the job's buffer, paste, release) over a bare
    `InferenceSession.run` of the same model on the same, already prepared 1x3xHxW tensor with the
    same thread count; at 512 and 1024 px. Pairs alternate which side runs first; the figure is the
    median of the per-pair ratios (goal <= 1.10).
    The same with the runtime's memory release off separates what giving memory back costs (the
    next job faults its arena pages in again; a bare session keeps its arena warm).
(c) the release apart, both ways of doing it side by side, each over the same bare run: the
    runtime's way (the shrink entry on the job's last run, inside it: figure (a)), and a release-off
    job followed by a release run of its own (`Runtime.release_cpu_arena`), timed in two parts:
    the release call itself, and the job, which now starts on an arena the previous pair's release
    emptied (its ratio over (a)'s release-off one is the next job's slowdown).
(d) the same as (a) with the CPU release deferred (`RuntimeSettings.cpu_release_delay`, 10 s
    here, longer than any gap between two jobs of the pairs; goal <= 1.10): jobs in a row find the arena warm.
    Then, with no job running, how long until the deferred release came and what it gave back
    (RSS), so the memory is seen to come back.
(e) auto-tiled over untiled throughput at 1024 px (goal >= 0.95), pairs alternated likewise.

First it checks that the runtime's session and the bare one were built with the same options
(threads, optimisation level, execution mode, arena, memory pattern, config entries) and lists
every difference (expected: `session.use_env_allocators`, the shared shrinkable CPU arena, and
`enable_mem_pattern` off with it: see runtime/core.py).

Every ratio also comes as a CPU-time ratio (`cpu_` keys: this process's CPU seconds, all threads,
page faults included): on a shared machine the wall clock also measures other people's load.
The script uses public APIs only, so the same script can time an older tree of the package
(`PYTHONPATH=<older checkout's parent> python bench/overhead.py`) for a before/after.

The model is built like Real-ESRGAN's SRVGGNetCompact (x4, 16 body convs, 16 features, random
weights). Prints a table, then exactly one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SIZES = (512, 1024)


def _image(size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((size, size, 3), dtype=np.float32)


def _timed(call) -> np.ndarray:
    """(wall seconds, this process's CPU seconds: every thread, page faults included)."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return np.array([time.perf_counter() - wall, time.process_time() - cpu])


def _paired(first, second, pairs: int) -> np.ndarray:
    """Per-pair ratios first/second (rows: wall, CPU), alternating which runs first."""
    ratios = []
    for index in range(pairs):
        if index % 2:
            b = _timed(second)
            a = _timed(first)
        else:
            a = _timed(first)
            b = _timed(second)
        ratios.append(a / b)
    return np.array(ratios).T


_OPTION_ATTRIBUTES = (
    "intra_op_num_threads",
    "inter_op_num_threads",
    "graph_optimization_level",
    "execution_mode",
    "execution_order",
    "enable_cpu_mem_arena",
    "enable_mem_pattern",
    "enable_mem_reuse",
    "use_deterministic_compute",
)
_CONFIG_KEYS = (
    "session.use_env_allocators",
    "session.use_device_allocator_for_initializers",
    "session.intra_op.allow_spinning",
    "session.inter_op.allow_spinning",
    "session.disable_prepacking",
    "session.set_denormal_as_zero",
)


def option_differences(first, second) -> list[str]:
    """'name: first vs second' for every session option that differs between two sessions."""

    def entry(options, key):
        try:
            return options.get_session_config_entry(key)
        except Exception:  # ORT raises for a key that was never set
            return "unset"

    a, b = first.get_session_options(), second.get_session_options()
    found = [f"{n}: {getattr(a, n)} vs {getattr(b, n)}" for n in _OPTION_ATTRIBUTES if getattr(a, n) != getattr(b, n)]
    found += [f"{k}: {entry(a, k)} vs {entry(b, k)}" for k in _CONFIG_KEYS if entry(a, k) != entry(b, k)]
    if first.get_providers() != second.get_providers():
        found.append(f"providers: {first.get_providers()} vs {second.get_providers()}")
    return found


def _release_parts(job, release, bare, pairs: int) -> dict[str, np.ndarray]:
    """Per pair, over the bare run: job + its own release run, the release call, the job alone."""
    parts: dict[str, list] = {"with_release": [], "release_call": [], "job_after_release": []}
    for index in range(pairs):
        if index % 2:
            b = _timed(bare)
        job_s = _timed(job)
        release_s = _timed(release)
        if not index % 2:
            b = _timed(bare)
        parts["with_release"].append((job_s + release_s) / b)
        parts["release_call"].append(release_s / b)
        parts["job_after_release"].append(job_s / b)
    return {key: np.array(value).T for key, value in parts.items()}


def _deferred_release_came(runtime, delay: float, size: int, figures: dict) -> None:
    """Wait (no job running) for the deferred release; record when it came and what it gave back."""
    from lean_image_ai.runtime.measure.memory import process_rss_bytes

    ended, rss = time.perf_counter(), process_rss_bytes()
    while runtime.deferred.pending and time.perf_counter() - ended < delay + 30:
        time.sleep(0.05)
    came = not runtime.deferred.pending
    figures[f"deferred_release_after_s_{size}"] = round(time.perf_counter() - ended, 2) if came else None
    figures[f"deferred_release_gave_back_mb_{size}"] = round((rss - process_rss_bytes()) / 2**20, 1) if came else None


def _record(figures: dict, rows: list, key: str, label: str, ratios: np.ndarray, goal: str = "") -> None:
    """The wall-clock median is the figure; the CPU-time one (`cpu_` key) barely moves when other
    processes take the cores, so it separates this code's work from the machine's load."""
    wall, cpu = float(np.median(ratios[0])), float(np.median(ratios[1]))
    figures[key] = round(wall, 4)
    figures[f"cpu_{key}"] = round(cpu, 4)
    rows.append((label, wall, float(ratios[0].min()), float(ratios[0].max()), cpu, goal))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--release-delay", type=float, default=10.0, help="(d)'s cpu_release_delay, seconds")
    args = parser.parse_args()

    import onnxruntime as ort
    from builders_upscale import compact_model
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions
    from lean_image_ai.models.imaging import to_nchw
    from lean_image_ai.runtime import Runtime
    from lean_image_ai.runtime.core import RuntimeSettings

    with tempfile.TemporaryDirectory() as folder:
        model = compact_model(Path(folder) / "compact_x4.onnx", num_conv=16, feat=16, scale=4)
        runtime = Runtime(RuntimeSettings(intra_op_threads=args.threads))
        options = RunOptions(device="cpu", runtime=runtime)
        kept = Runtime(RuntimeSettings(intra_op_threads=args.threads, release_memory=False))
        kept_options = RunOptions(device="cpu", runtime=kept)
        deferred = Runtime(RuntimeSettings(intra_op_threads=args.threads, cpu_release_delay=args.release_delay))
        deferred_options = RunOptions(device="cpu", runtime=deferred)
        bare_options = ort.SessionOptions()
        bare_options.intra_op_num_threads = args.threads
        bare = ort.InferenceSession(str(model), bare_options, providers=["CPUExecutionProvider"])

        figures: dict = {"threads": args.threads, "pairs": args.pairs}
        rows = []
        upscale.run(_image(64), model, options=options)  # loads the runtime's session
        handle = runtime.cached_sessions()[0]
        figures["session_option_differences"] = option_differences(handle.session, bare)
        for size in SIZES:
            image = _image(size, seed=size)
            tensor = to_nchw(image)
            for _ in range(2):  # onnxruntime plans a shape's memory pattern on its first run
                bare.run(None, {"input": tensor})
            cases = (
                ("end_to_end_over_bare", "end-to-end / bare run,", options, "<= 1.10"),
                ("end_to_end_no_release_over_bare", "  the same, release off,", kept_options, ""),
                ("end_to_end_deferred_release_over_bare", "  the same, release deferred,", deferred_options, "<= 1.10"),
            )
            for key, label, case_options, goal in cases:
                for _ in range(2):  # session, kernels, radius cache and the shape's memory pattern warmed
                    upscale.run(image, model, options=case_options)
                ratios = _paired(
                    lambda image=image, o=case_options: upscale.run(image, model, options=o),
                    lambda tensor=tensor: bare.run(None, {"input": tensor}),
                    args.pairs,
                )
                _record(figures, rows, f"{key}_{size}", f"{label} {size} px", ratios, goal)
            _deferred_release_came(deferred, args.release_delay, size, figures)
            parts = _release_parts(
                lambda image=image: upscale.run(image, model, options=kept_options),
                kept.release_cpu_arena,
                lambda tensor=tensor: bare.run(None, {"input": tensor}),
                args.pairs,
            )
            for key, part, label in (
                ("end_to_end_probe_release_over_bare", "with_release", "  release off + a release run after"),
                ("release_call_over_bare", "release_call", "    of which the release call"),
                ("job_after_release_over_bare", "job_after_release", "    of which the job (arena emptied)"),
            ):
                _record(figures, rows, f"{key}_{size}", f"{label}, {size} px", parts[part])
            slowdown = [
                figures[f"{cpu}job_after_release_over_bare_{size}"] / figures[f"{cpu}end_to_end_no_release_over_bare_{size}"]
                for cpu in ("", "cpu_")
            ]
            figures[f"next_job_slowdown_after_release_{size}"] = round(slowdown[0], 4)
            figures[f"cpu_next_job_slowdown_after_release_{size}"] = round(slowdown[1], 4)
            label = f"    next job after a release / warm, {size} px"
            rows.append((label, slowdown[0], slowdown[0], slowdown[0], slowdown[1], ""))

        image = _image(1024, seed=1)
        ratios = _paired(
            lambda: upscale.run(image, model, options=options, tile_size=None),
            lambda: upscale.run(image, model, options=options, tile_size="auto"),
            args.pairs,
        )  # untiled time / auto time = auto throughput / untiled throughput
        label = "auto-tiled / untiled throughput, 1024 px"
        _record(figures, rows, "auto_over_untiled_throughput_1024", label, ratios, ">= 0.95")
        runtime.clear()
        kept.clear()
        deferred.clear()

    print("session options, runtime vs bare:", "; ".join(figures["session_option_differences"]) or "identical")
    print(f"{'figure (wall clock; cpu: CPU-time median)':46} {'median':>8} {'min':>8} {'max':>8} {'cpu':>8}  goal")
    for name, median, low, high, cpu, goal in rows:
        print(f"{name:46} {median:8.3f} {low:8.3f} {high:8.3f} {cpu:8.3f}  {goal}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
