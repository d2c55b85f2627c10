"""Does the release really give VRAM back on an NVIDIA GPU? A check that proves or disproves it.

Setup (one NVIDIA GPU, driver R580+), in the repository's venv:
pip install 'onnxruntime-gpu[cuda,cudnn]==1.31.1' nvidia-ml-py, then python bench/gpu_release.py
[--device N]. ``--dry-run-cpu`` runs the same code paths on the CPU arena (RSS
standing in for NVML), for CI on machines without a GPU; its figures say nothing about VRAM.

Every configuration runs in its own process (a CUDA arena and context live as long as the
process). A child exits non-zero unless its session really runs on CUDA and NVML lists this
process (a missing per-process entry is an error, never 0). Memory is sampled every few ms.
The parent prints one line per check and ends with one JSON line; it exits non-zero when a
check fails or cannot be made. Sizes keep the whole run well under 8 minutes on a current GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gpu_sampler import CheckFailed, Sampler

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
MiB = 1 << 20
CUDA = "CUDAExecutionProvider"
JOBS = ("single", "frames", "tiled")
def _setup(args, **settings):
    from lean_image_ai.runtime import Runtime, RuntimeSettings

    # the model is built by the parent: building it here would leave its bytes in this heap
    return Runtime(RuntimeSettings(**settings)), Path(args.model)


def _device(args) -> str:
    return "cpu" if args.dry_run_cpu else f"cuda:{args.device}"


def _require_cuda(handle, args) -> None:
    if not args.dry_run_cpu and handle.providers[:1] != [CUDA]:
        raise CheckFailed(f"the session runs on {handle.providers}, not CUDA: {handle.fallback_warning}")


def _images(args, job: str) -> list[np.ndarray] | np.ndarray:
    rng = np.random.default_rng(7)
    if job == "frames":
        return [rng.random((args.size, args.size, 3), dtype=np.float32) for _ in range(3)]
    side = args.size * 2 if job == "tiled" else args.size
    return rng.random((side, side, 3), dtype=np.float32)


def _context(runtime, args, sampler) -> int:
    """Start the CUDA context (and the runtime) with a model that has no weights and no kernels;
    the level it leaves."""
    from lean_image_ai.runtime.release import cpu_arena

    probe = Path(tempfile.mkdtemp()) / "probe.onnx"
    probe.write_bytes(cpu_arena.RELEASE_PROBE_MODEL)
    handle = runtime.session(probe, _device(args))
    _require_cuda(handle, args)
    with runtime.operation("context") as op:
        op.run(handle, {"x": np.zeros(1, np.float32)}, last=True)
    return sampler.samples[sampler.mark() - 1][0]


def child_floors(args) -> dict:
    """Context, then weights, then libraries after a full-size warm-up: levels, cumulative."""
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions

    runtime, model = _setup(args)
    device = None if args.dry_run_cpu else args.device
    with Sampler(device) as sampler:
        before = sampler.samples[sampler.mark(before_cuda=True) - 1][0]
        context = _context(runtime, args, sampler)
        _require_cuda(runtime.session(model, _device(args)), args)
        weights = sampler.samples[sampler.mark() - 1][0]
        options = RunOptions(device=_device(args), runtime=runtime)
        upscale.run(_images(args, "single"), model, options=options, tile_size=None)
        libraries = sampler.samples[sampler.mark() - 1][0]
    return {
        "context_mb": _mb(context - before),
        "weights_mb": _mb(weights - context),
        "libraries_mb": _mb(libraries - weights),
        "weights_file_mb": _mb(model.stat().st_size),
    }


def child_release(args, release: str, ending: str, job: str) -> dict:
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions
    from lean_image_ai.runtime import OperationCancelled

    runtime, model = _setup(args, release_memory=release == "on")
    device = None if args.dry_run_cpu else args.device
    warm = RunOptions(device=_device(args), runtime=runtime)
    tile = args.size // 2 if job == "tiled" else None
    with Sampler(device) as sampler:
        sampler.mark(before_cuda=True)
        context = _context(runtime, args, sampler)  # stays when an eviction takes the weights
        handle = runtime.session(model, _device(args))
        _require_cuda(handle, args)
        loaded = sampler.samples[sampler.mark() - 1][0]
        # warm-up at full size with release on: the floor with libraries loaded, arena given back
        runtime.configure(release_memory=True)
        upscale.run(_images(args, job), model, options=warm, tile_size=tile)
        runtime.configure(release_memory=release == "on")
        floor = sampler.samples[sampler.mark() - 1][0]
        begin = sampler.mark()
        checks = {"n": 0}

        def cancel():  # checked before every run (and after each frame): cancel after the first run
            checks["n"] += 1
            return ending == "cancel" and checks["n"] > 1

        options = RunOptions(device=_device(args), runtime=runtime, cancel=cancel)
        digest = None
        try:
            result = upscale.run(_images(args, job), model, options=options, tile_size=tile)
            results = result if isinstance(result, list) else [result]
            digest = hashlib.sha256(b"".join(r.image.tobytes() for r in results)).hexdigest()
            del result, results
        except OperationCancelled:
            pass
        after = sampler.samples[sampler.mark() - 1][0]
        peak, device_peak = sampler.peak(begin), sampler.device_peak(begin)
        evicted = handle.evicted
        device_floor = sampler.samples[begin - 1][1]
        report = {
            "release": release,
            "ending": ending,
            "job": job,
            "peak_above_floor_mb": _mb(peak - floor),
            # the whole GPU (other processes too): what Blender would see as gone while the job runs
            "device_peak_above_floor_mb": None if device_peak is None else _mb(device_peak - device_floor),
            "samples": len(sampler.samples) - begin,
            "evicted": evicted,
            "output_sha256": digest,
            "sessions_cached": len(runtime.cached_sessions()),
        }
        if evicted:  # the weights went too: what is left is compared with the floor less them
            report["kept_above_floor_without_weights_mb"] = _mb(after - (floor - (loaded - context)))
        else:
            report["kept_above_floor_mb"] = _mb(after - floor)
        if release == "on" and ending == "success" and not evicted:
            created = runtime.sessions_created
            again = upscale.run(_images(args, "single"), model, options=warm, tile_size=None)
            report["run_after_shrink_ok"] = bool(np.isfinite(again.image).all())
            report["run_after_shrink_reloaded"] = runtime.sessions_created != created
    return report


def child_oom(args) -> dict:
    """gpu_mem_limit (CPU: the arena cap) too small for one run: the error says which memory,
    and the process memory drops at the eviction, before the error reaches the caller."""
    from lean_image_ai.runtime import InferenceOutOfMemoryError

    limit = args.oom_limit_mib * MiB
    settings = {"cpu_arena_max_bytes": limit} if args.dry_run_cpu else {"gpu_mem_limit_bytes": limit}
    runtime, model = _setup(args, **settings)
    device = None if args.dry_run_cpu else args.device
    with Sampler(device) as sampler:
        handle = runtime.session(model, _device(args))
        _require_cuda(handle, args)
        loaded = sampler.samples[sampler.mark() - 1][0]
        begin = sampler.mark()
        side = int((4 * limit / (4 * args.mid_channels)) ** 0.5)  # one intermediate ~4x the limit
        feed = np.random.default_rng(1).random((1, 3, side, side), dtype=np.float32)
        name = handle.inputs[0].name
        try:
            with runtime.operation("too big") as op:
                op.run(handle, {name: feed}, last=True)
            raise CheckFailed(f"a {side}x{side} run fitted under the {args.oom_limit_mib} MiB limit")
        except InferenceOutOfMemoryError as exc:
            resource, detail = exc.resource, exc.detail
        after = sampler.samples[sampler.mark() - 1][0]
        peak = sampler.peak(begin)
    return {
        "limit_mb": args.oom_limit_mib,
        "resource": resource,
        "detail": detail[:400],
        "peak_during_mb": _mb(peak - loaded),
        "after_eviction_below_loaded_mb": _mb(loaded - after),
        "evicted": handle.evicted,
    }


def child_device_index(args) -> dict:
    """A shrink entry naming another device fails the run with ORT's not-found text (the runtime
    then repeats the run without it); the entry the runtime sends names the session's device."""
    runtime, model = _setup(args)
    handle = runtime.session(model, _device(args))
    _require_cuda(handle, args)
    honoured = handle.shrink
    wrong = "gpu:0" if args.dry_run_cpu else f"gpu:{args.device + 1}"
    handle.shrink = wrong  # what a session on another device would be sent
    with runtime.operation("wrong device") as op:
        op.run(handle, {handle.inputs[0].name: np.zeros((1, 3, 16, 16), np.float32)}, last=True)
    event = (runtime.events.recent("release_unsupported") or [{}])[-1]
    expected = "cpu:0" if args.dry_run_cpu else f"gpu:{args.device}"
    nvml = None
    if not args.dry_run_cpu:
        from lean_image_ai.runtime.measure.memory import gpu_snapshot

        snap = gpu_snapshot(args.device)  # NVML's device for this CUDA index (gpu_index)
        nvml = {k: snap.get(k) for k in ("nvml_index", "mapping", "name", "process_used_bytes")}
    return {
        "nvml": nvml,
        "entry_sent": honoured,
        "device_honoured": honoured == expected,
        "wrong_entry": wrong,
        "ort_text": event.get("detail"),
        "not_found_text": "Did not find an arena based allocator registered for device-id" in (event.get("detail") or ""),
    }


def child_workspace(args, on: str, search: str) -> dict:
    """Peak of a job over several tile shapes (each a new cuDNN algorithm search), cuDNN's max
    workspace on vs off."""
    from lean_image_ai.models.adapters import upscale
    from lean_image_ai.models.base import RunOptions

    runtime, model = _setup(args, cudnn_max_workspace=on == "1", cudnn_conv_algo_search=search)
    device = None if args.dry_run_cpu else args.device
    with Sampler(device) as sampler:
        handle = runtime.session(model, _device(args))
        _require_cuda(handle, args)
        loaded = sampler.samples[sampler.mark() - 1][0]
        image = _images(args, "tiled")
        for tile in (args.size // 2, args.size // 3, args.size // 4):  # a new input shape each time
            upscale.run(image, model, options=RunOptions(device=_device(args), runtime=runtime), tile_size=tile)
        peak = sampler.peak()
    device_peak = sampler.device_peak()
    return {
        "max_workspace": on,
        "algo_search": search,
        "peak_above_loaded_mb": _mb(peak - loaded),
        "device_peak_mb": None if device_peak is None else _mb(device_peak),
        "applies": not args.dry_run_cpu,
    }


def _mb(value: float) -> float:
    return round(value / MiB, 1)


# ---- orchestration (parent side) --------------------------------------------------------------


def preflight() -> str | None:
    """Why the real check cannot run here, or None."""
    try:
        import onnxruntime as ort
    except Exception as exc:
        return f"onnxruntime cannot be imported: {exc}"
    if CUDA not in ort.get_available_providers():
        return f"{getattr(ort, 'package_name', 'onnxruntime')} offers no CUDAExecutionProvider: install onnxruntime-gpu[cuda,cudnn]"
    from lean_image_ai.runtime.measure.memory import _nvml, _nvml_state

    nvml = _nvml()
    if nvml is None:
        return f"NVML is not available ({_nvml_state['error']}): install nvidia-ml-py and an NVIDIA driver"
    if int(nvml.nvmlDeviceGetCount()) == 0:
        return "NVML sees no NVIDIA GPU"
    return None


def _run_child(args, *child) -> dict:
    command = [sys.executable, __file__, "--child", *child, "--size", str(args.size), "--device", str(args.device)]
    command += ["--weights-mib", str(args.weights_mib), "--mid-channels", str(args.mid_channels)]
    command += ["--oom-limit-mib", str(args.oom_limit_mib), "--model", args.model]
    command += ["--dry-run-cpu"] if args.dry_run_cpu else []
    left = args.deadline - time.monotonic()  # the whole check stays under 8 minutes
    if left < 5:
        raise CheckFailed(f"{' '.join(child)}: out of time (the check is limited to 8 minutes)")
    done = subprocess.run(command, capture_output=True, text=True, timeout=min(args.child_timeout, left))
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CheckFailed(f"{' '.join(child)}: exit {done.returncode}: {reason}")
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs="+")
    parser.add_argument("--dry-run-cpu", action="store_true", help="the CPU arena stands in for the GPU")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--size", type=int, default=None, help="frame side (default 1024; dry run 128)")
    parser.add_argument("--weights-mib", type=int, default=None, help="model weights (default 384; dry run 16)")
    parser.add_argument("--mid-channels", type=int, default=32)
    parser.add_argument("--oom-limit-mib", type=int, default=None, help="gpu_mem_limit (default 256; dry run 8)")
    parser.add_argument("--child-timeout", type=int, default=120)
    parser.add_argument("--jobs", nargs="+", choices=JOBS, default=list(JOBS), help="which jobs to check")
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    dry = args.dry_run_cpu
    args.size = args.size or (128 if dry else 1024)
    args.weights_mib = args.weights_mib or (16 if dry else 384)
    args.oom_limit_mib = args.oom_limit_mib or (8 if dry else 256)
    if args.child:
        kind, *rest = args.child
        try:
            handler = {"floors": child_floors, "release": child_release, "oom": child_oom}.get(kind)
            handler = handler or {"device_index": child_device_index, "workspace": child_workspace}[kind]
            print(json.dumps(handler(args, *rest)))
            return 0
        except CheckFailed as exc:
            print(f"check failed: {exc}", file=sys.stderr)
            return 3
    if not dry:
        problem = preflight()
        if problem:
            print(f"gpu_release: cannot check on a GPU here: {problem}", file=sys.stderr)
            print(json.dumps({"mode": "gpu", "ok": False, "error": problem}))
            return 2
    started = time.perf_counter()
    args.deadline = time.monotonic() + 470
    from builders_upscale import heavy_sr_model

    folder = tempfile.mkdtemp(prefix="gpu_release_")
    args.model = str(heavy_sr_model(Path(folder) / "heavy.onnx", weights_mib=args.weights_mib, mid_channels=args.mid_channels))
    figures: dict = {"mode": "dry-run-cpu" if dry else "gpu", "ok": False}
    try:
        figures["floors"] = _run_child(args, "floors")
        print(f"floors: {figures['floors']}")
        release = {}
        for job in args.jobs:
            for ending in ("success", "cancel"):
                for mode in ("off", "on"):
                    result = _run_child(args, "release", mode, ending, job)
                    release[f"{job}_{ending}_{mode}"] = result
                    print(f"{job:6s} {ending:7s} release {mode:3s}: {result}")
        figures["release"] = release
        figures["identical_on_vs_off"] = {
            job: release[f"{job}_success_on"]["output_sha256"] == release[f"{job}_success_off"]["output_sha256"]
            for job in args.jobs
        }
        figures["oom"] = _run_child(args, "oom")
        print(f"out of memory: {figures['oom']}")
        figures["device_index"] = _run_child(args, "device_index")
        print(f"device index: {figures['device_index']}")
        # EXHAUSTIVE with the workspace on is ORT's own default; HEURISTIC with it off is ours
        configs = (("1", "EXHAUSTIVE"), ("0", "EXHAUSTIVE"), ("0", "HEURISTIC"))
        figures["workspace"] = {f"{s}_{on}": _run_child(args, "workspace", on, s) for on, s in configs}
        print(f"cudnn max workspace: {figures['workspace']}")
        figures["ok"] = _verdict(figures, dry)
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        figures["error"] = str(exc)
        print(f"gpu_release: {exc}", file=sys.stderr)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(figures))
    return 0 if figures["ok"] else 1


def _verdict(figures: dict, dry: bool) -> bool:
    """The release is proved when, for every job and ending, release on keeps no more than off,
    outputs are identical, the OOM is classified and freed, and the device entry is honoured."""
    failures = []
    for key, on in figures["release"].items():
        if not key.endswith("_on"):
            continue
        off = figures["release"][key[:-3] + "_off"]
        kept_on = on.get("kept_above_floor_mb", on.get("kept_above_floor_without_weights_mb"))
        kept_off = off.get("kept_above_floor_mb", off.get("kept_above_floor_without_weights_mb"))
        if kept_on > kept_off + 1:
            failures.append(f"{key}: kept {kept_on} MiB with release, {kept_off} without")
        if on.get("run_after_shrink_ok") is False or on.get("run_after_shrink_reloaded"):
            failures.append(f"{key}: the run after the shrink failed or reloaded the weights")
    failures += [f"{job}: outputs differ on vs off" for job, same in figures["identical_on_vs_off"].items() if not same]
    oom = figures["oom"]
    if oom["resource"] != ("system memory" if dry else "GPU memory") or not oom["evicted"]:
        failures.append(f"out of memory: {oom['resource']}, evicted {oom['evicted']}")
    if oom["after_eviction_below_loaded_mb"] <= 0:
        failures.append("out of memory: memory did not drop at the eviction")
    index = figures["device_index"]
    if not (index["device_honoured"] and index["not_found_text"]):
        failures.append(f"device index: {index}")
    if not dry and not (index["nvml"] or {}).get("process_used_bytes"):
        failures.append(f"device index: NVML shows nothing of this process on the session's device: {index['nvml']}")
    # Zeros prove nothing: the weights must show in the floors, and a job without release must
    # have grown memory, or on-vs-off compares nothing with nothing.
    floors = figures["floors"]
    if floors["weights_mb"] < 0.5 * floors["weights_file_mb"]:
        failures.append(f"inconclusive: the weights floor is {floors['weights_mb']} MiB for {floors['weights_file_mb']} MiB of weights")
    grown = [v["peak_above_floor_mb"] for k, v in figures["release"].items() if k.endswith("_success_off")]
    if not dry and not any(p > 1 for p in grown):
        failures.append(f"inconclusive: no job without release grew memory above its floor ({grown} MiB)")
    figures["failures"] = failures
    return not failures


if __name__ == "__main__":
    sys.exit(main())
