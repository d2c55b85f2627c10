"""Every family on its real architecture, through the product vs a bare onnxruntime session (DESIGN.md §5-6).

    .venv/bin/python bench/real_models.py [--only da3-small,compact-x4] [--threads 2] [--repeat 1] [--rrdb-1080p]
                                          [--folder DIR]  (default: $LEAN_IMAGE_AI_REFERENCE_DIR or
                                                           ~/.cache/lean_image_ai/reference_models, as the exporter)

The models are the seeded exports of the upstream code that `tools/reference_models.py` writes
(its manifest names the files); a model missing there is skipped with a note. The cases: DA3-SMALL,
MoGe-2 ViT-S and BEN2 Base on a 1920x1080 picture (each adapter resizes it to its model's size;
MoGe-2 with a shot's focal length given, as its solver rightly refuses seeded-weight geometry),
the compact x4 upscaler at 512x512 and 1920x1080, RealESRGAN_x4plus at 256x256 (1920x1080 with
`--rrdb-1080p`: most of an hour on 2 cores).

Each case runs in two fresh processes, one after the other:
- product: a PNG of the picture is decoded by the command line's reader, the family's job
  (models/model_run.py ModelRun, device CPU, `--threads` intra-op threads) runs on the array, and its
  result is written as the command line writes it. Decode and encode are timed apart from the
  model part; the model part is the job's wall less the model load (timed apart, as the bare
  load is). The job is instrumented from the outside: the runtime's operation (runtime/operation.py
  `Operation.session/run/__exit__`), onnxruntime's own `run`, the release calls. Every feed the
  job gives a non-probe run is saved (time not counted) for the bare process.
- bare: `onnxruntime.InferenceSession` with the same intra-op threads runs those saved feeds, in
  order: the same prepared tensors, the same windows.
The breakdown of the product's model part: pre (before the first run: checks, prepare, resize,
normalise), runs (inside onnxruntime), op (the operation's bookkeeping around each run), probe
(runs that measure the model, not part of the result: impulse probe, working-memory measure),
between (between runs: tile cut and paste), post (after the last run), release (the arena's
release in the last run, release calls, the operation's end and its memory report).
Ratios: `ratio` wall, `cpu` CPU seconds (all threads) of the model part, `runs` CPU seconds inside
onnxruntime's runs alone (what the product's session settings cost), each over the bare runs'.
On a shared machine the wall ratio swings most; the CPU ones are steadier; `--repeat N` runs each
pair N times, alternated, and keeps the fastest of each.
Peak RSS (VmHWM, runtime/measure/memory.py: ru_maxrss would carry the parent's peak into a child)
is each process's own, read when the model part ends (before encoding);
kept = what the runtime still held after its release, as a share of the job's peak growth.
Prints a table and the breakdown, then exactly one JSON line. Machine shared: ratios ±10 %.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from reference_models import load_manifest, reference_dir  # noqa: E402  (the exports' folder and manifest)

HD = (1080, 1920)
QUARTER_HD = (540, 960)  # RRDBNet: a quarter of 1080p, in windows as large as 1080p gets
# (reference model, family, input sizes by default)
CASES = (
    ("da3-small", "da3", [HD]),
    ("moge2-vits", "moge2", [HD]),
    ("compact-x4", "upscale", [(512, 512), HD]),
    ("rrdb-x4plus", "upscale", [(256, 256)]),
    ("ben2-base", "ben2", [HD]),
)
MOGE2_FOCAL_WIDTH = 0.8  # fx / width (models/adapters/shot_camera.py)
PHASES = ("decode", "pre", "runs", "op", "probe", "between", "post", "release", "encode")


def _image(height: int, width: int):
    import numpy as np

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:height, 0:width] / max(height, width)
    image = np.stack([0.5 + 0.3 * np.sin(6 * xx + c) * np.cos(4 * yy - c) for c in range(3)], axis=2)
    return (np.clip(image + rng.normal(0, 0.03, image.shape), 0, 1) * 255).astype(np.uint8)


class _Recorder:
    """Intervals of the job's top-level steps on one clock, and onnxruntime's own run time."""

    def __init__(self, feeds_dir: Path):
        self.spans: list[tuple[str, float, float]] = []  # (kind, start, end)
        self.ort_seconds = 0.0
        self.ort_cpu = 0.0  # CPU seconds (all threads) inside onnxruntime's run, probes included
        self.probing = False
        self.releasing = False  # the runtime's release run (an empty model) is no model run
        self.feeds_dir = feeds_dir
        self.saved = 0
        self.cpu_apart = 0.0  # CPU seconds of the load and of saving feeds: not the model part's

    def timed(self, kind: str, call):
        def wrapper(*args, **kwargs):
            start, cpu = time.perf_counter(), time.process_time()
            try:
                return call(*args, **kwargs)
            finally:
                self.spans.append((kind, start, time.perf_counter()))
                if kind == "load":
                    self.cpu_apart += time.process_time() - cpu

        return wrapper

    def install(self) -> None:
        import numpy as np
        import onnxruntime as ort
        from lean_image_ai.models.adapters.upscale import runs as upscale_runs
        from lean_image_ai.runtime import core, operation

        session_class = ort.InferenceSession
        for name in ("run", "run_with_iobinding"):
            original = getattr(session_class, name)

            def ort_call(*args, _original=original, **kwargs):
                start, cpu = time.perf_counter(), time.process_time()
                try:
                    return _original(*args, **kwargs)
                finally:
                    if not self.releasing:
                        self.ort_seconds += time.perf_counter() - start
                    if not (self.probing or self.releasing):
                        self.ort_cpu += time.process_time() - cpu

            setattr(session_class, name, ort_call)
        run = operation.Operation.run

        def op_run(op, handle, feeds, **kwargs):
            if not self.probing:
                start, cpu = time.perf_counter(), time.process_time()
                np.savez(self.feeds_dir / f"feed_{self.saved:05d}.npz", **feeds)
                self.saved += 1
                self.spans.append(("capture", start, time.perf_counter()))
                self.cpu_apart += time.process_time() - cpu
            before, start = self.ort_seconds, time.perf_counter()
            try:
                return run(op, handle, feeds, **kwargs)
            finally:
                kind = "probe" if self.probing else "run"
                self.spans.append((kind, start, time.perf_counter()))
                if not self.probing:
                    self.spans.append(("ort", 0.0, self.ort_seconds - before))

        operation.Operation.run = op_run
        operation.Operation.session = self.timed("load", operation.Operation.session)
        operation.Operation.__exit__ = self.timed("exit", operation.Operation.__exit__)
        core.Runtime.release_now = self.timed("release_now", core.Runtime.release_now)
        release_cpu_arena = core.Runtime.release_cpu_arena

        def releasing(runtime):
            self.releasing = True
            try:
                return release_cpu_arena(runtime)
            finally:
                self.releasing = False

        core.Runtime.release_cpu_arena = releasing
        infer = upscale_runs.ModelRuns.infer

        def job_infer(job, feed, *, last, slot="colour"):
            self.probing = slot == "probe"
            try:
                return infer(job, feed, last=last, slot=slot)
            finally:
                self.probing = False

        upscale_runs.ModelRuns.infer = job_infer

    def phases(self, start: float, end: float, in_run_release: float) -> dict:
        """Seconds per phase of the job's wall from ``start`` to ``end``."""
        spans = sorted((s for s in self.spans if s[0] != "ort"), key=lambda s: s[1])
        runs = [s for s in spans if s[0] == "run"]
        first, last = (runs[0][1], runs[-1][2]) if runs else (end, end)
        out = dict.fromkeys(
            ("load", "capture", "pre", "runs", "op", "probe", "between", "post", "release"), 0.0
        )
        cursor = start
        for kind, s0, s1 in spans:
            gap = max(0.0, s0 - cursor)
            out["pre" if s0 <= first else "post" if cursor >= last else "between"] += gap
            if kind == "run":
                out["op"] += s1 - s0
            else:
                out[{"release_now": "release", "exit": "release"}.get(kind, kind)] += s1 - s0
            cursor = max(cursor, s1)
        out["post"] += max(0.0, end - cursor)
        ort = sum(s[2] for s in self.spans if s[0] == "ort")
        out["runs"] = ort
        out["op"] -= ort + in_run_release
        out["release"] += in_run_release
        return out


def child_product(args) -> dict:
    from lean_image_ai.models.batch import image_files
    from lean_image_ai.models.model_run import ModelRun
    from lean_image_ai.models.outputs import JobOutput
    from lean_image_ai.runtime import Runtime
    from lean_image_ai.runtime.core import RuntimeSettings
    from lean_image_ai.runtime.errors import InvalidModelOutputError
    from lean_image_ai.runtime.measure.memory import peak_rss_bytes, process_rss_bytes

    work = Path(args.work)
    recorder = _Recorder(work)
    recorder.install()
    source = work / "input.png"
    image_files._pillow().fromarray(_image(args.height, args.width)).save(source)
    runtime = Runtime(settings=RuntimeSettings(intra_op_threads=args.threads))
    job = ModelRun.resolve(args.family, work / "models", model_path=args.model, device="cpu")
    if args.family == "moge2":  # seeded weights give no camera the solver accepts: a shot's focal
        job.extra["focal_width"] = MOGE2_FOCAL_WIDTH  # instead, so the whole post-process runs
    started = time.perf_counter()
    image = image_files.read_image(source)
    decoded, cpu = time.perf_counter(), time.process_time()
    rss_before, refused = process_rss_bytes(), ""
    try:
        result = job.infer(image, job.options(runtime=runtime))
    except InvalidModelOutputError as exc:  # MoGe-2's solver refuses random-weight geometry
        result, refused = None, str(exc).split(":")[-1].strip()[:80]
    ended, cpu = time.perf_counter(), time.process_time() - cpu
    peak = peak_rss_bytes()
    release = sum(e.get("seconds", 0.0) for e in runtime.events.recent("memory_release") if e.get("in_run"))
    phases = recorder.phases(decoded, ended, release)
    encode = 0.0
    if result is not None:
        target = work / f"result{job.family.output.suffix}"
        encode = time.perf_counter()
        JobOutput.of(args.family).write(target, result, job.values, image_files.write_image)
        encode = time.perf_counter() - encode
    (ram,) = runtime.last_job_memory["figures"]
    plans = runtime.events.recent("tile_plan")
    row = {
        "model_s": ended - decoded - phases["load"] - phases["capture"],
        "load_s": phases["load"],
        "cpu_s": cpu - recorder.cpu_apart,
        "runs_cpu_s": recorder.ort_cpu,
        "phases": {**phases, "decode": decoded - started, "encode": encode},
        "refused": refused,
        "rss_before": rss_before,
        "peak": peak,
        "grew": ram["grew"],
        "runtime_kept": ram["runtime_kept"] or 0,
        "results_held": ram["results"],
        "feeds": recorder.saved,
    }
    if hasattr(result, "tile_size_used"):
        row["plan"] = {
            "window": result.tile_size_used,
            "overlap": result.overlap,
            "seams": result.seams,
            "tile_size": plans[-1]["tile_size"] if plans else None,
            "how": plans[-1]["how"] if plans else "",
        }
    return row


def child_bare(args) -> dict:
    import numpy as np
    import onnxruntime as ort
    from lean_image_ai.runtime.measure.memory import peak_rss_bytes

    work = Path(args.work)
    feeds = []
    for path in sorted(work.glob("feed_*.npz")):
        with np.load(path) as saved:
            feeds.append({name: saved[name] for name in saved.files})
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    load = time.perf_counter()
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    load = time.perf_counter() - load
    wall, cpu = time.perf_counter(), time.process_time()
    for feed in feeds:
        session.run(None, feed)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"runs_s": wall, "cpu_s": cpu, "load_s": load, "peak": peak_rss_bytes(), "runs": len(feeds)}


def _child(kind: str, args, extra) -> dict:
    command = [sys.executable, __file__, "--child", kind, "--threads", str(args.threads), *extra]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kind} child failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _case(name: str, family: str, model: Path, size: tuple[int, int], args) -> dict:
    with tempfile.TemporaryDirectory(prefix="real_models_") as work:
        extra = [
            "--model",
            str(model),
            "--family",
            family,
            "--height",
            str(size[0]),
            "--width",
            str(size[1]),
            "--work",
            work,
        ]
        products, bares = [], []
        for _ in range(args.repeat):  # alternated, so both see the same spells of a busy machine
            products.append(_child("product", args, extra))  # its feeds overwrite the last one's, same names
            bares.append(_child("bare", args, extra))
        product = min(products, key=lambda run: run["model_s"])
        bare = min(bares, key=lambda run: run["runs_s"])
    grown = max(1, product["peak"] - product["rss_before"])
    return {
        "model": name,
        "family": family,
        "input": f"{size[1]}x{size[0]}",
        "ratio": round(product["model_s"] / bare["runs_s"], 3),
        "cpu_ratio": round(product["cpu_s"] / bare["cpu_s"], 3),
        "runs_cpu_ratio": round(product["runs_cpu_s"] / bare["cpu_s"], 3),
        "product_s": round(product["model_s"], 3),
        "bare_s": round(bare["runs_s"], 3),
        "runs": bare["runs"],
        "load_s": round(product["load_s"], 3),
        "bare_load_s": round(bare["load_s"], 3),
        "peak_mb": product["peak"] >> 20,
        "bare_peak_mb": bare["peak"] >> 20,
        "runtime_kept_mb": product["runtime_kept"] >> 20,
        "results_held_mb": product["results_held"] >> 20,
        "kept_share_of_peak_growth": round(product["runtime_kept"] / grown, 4),
        "phases_s": {k: round(product["phases"][k], 3) for k in PHASES},
        "plan": product.get("plan"),
        "refused": product["refused"],
    }


def _plan_text(plan) -> str:
    if not plan:
        return "-"
    return f"{plan['window']}+{plan['overlap']} {plan['seams'].split(';')[0]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated reference model names")
    parser.add_argument(
        "--rrdb-1080p", action="store_true", help="also RealESRGAN_x4plus at 1920x1080 (~1 h)"
    )
    parser.add_argument(
        "--rrdb-tiled", action="store_true",
        help="also RealESRGAN_x4plus at 960x540: several windows of the 1080p plan's size (minutes, not an hour)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of each process per case; the fastest is kept"
    )
    parser.add_argument("--folder", type=Path, default=reference_dir())
    parser.add_argument("--child", choices=("product", "bare"))
    for name in ("model", "family", "work"):
        parser.add_argument(f"--{name}")
    parser.add_argument("--height", type=int)
    parser.add_argument("--width", type=int)
    args = parser.parse_args()
    if args.child:
        print(json.dumps((child_product if args.child == "product" else child_bare)(args)))
        return 0
    manifest = load_manifest(args.folder)["models"]
    only = set(filter(None, args.only.split(",")))
    rows, skipped = [], []
    print(
        f"{'model':<12} {'input':>9} {'tiles':<16} {'ratio':>6} {'cpu':>6} {'runs':>6} {'prod s':>7} {'bare s':>7} {'load p/b s':>11} "
        f"{'peak MB p/b':>12} {'kept %':>7}  note"
    )
    for name, family, sizes in CASES:
        if only and name not in only:
            continue
        entry = manifest.get(name)
        model = args.folder / entry["file"] if entry else None
        if model is None or not model.is_file():
            skipped.append(name)
            print(
                f"{name:<12} skipped: not in {args.folder / 'manifest.json'} (tools/reference_models.py makes it)"
            )
            continue
        if name == "rrdb-x4plus":
            sizes = [*sizes, *([QUARTER_HD] if args.rrdb_tiled else []), *([HD] if args.rrdb_1080p else [])]
        for size in sizes:
            row = _case(name, family, model, size, args)
            rows.append(row)
            note = f"refused: {row['refused']}" if row["refused"] else ""
            print(
                f"{name:<12} {row['input']:>9} {_plan_text(row['plan']):<16} {row['ratio']:>6} {row['cpu_ratio']:>6} {row['runs_cpu_ratio']:>6} {row['product_s']:>7} "
                f"{row['bare_s']:>7} {row['load_s']:>5}/{row['bare_load_s']:<5} "
                f"{row['peak_mb']:>5}/{row['bare_peak_mb']:<6} {100 * row['kept_share_of_peak_growth']:>6.1f}%  {note}",
                flush=True,
            )
    print("\nproduct breakdown, seconds (model part = pre + runs + op + probe + between + post + release)")
    print(f"{'model':<12} {'input':>9} " + " ".join(f"{p:>8}" for p in PHASES))
    for row in rows:
        print(f"{row['model']:<12} {row['input']:>9} " + " ".join(f"{row['phases_s'][p]:>8}" for p in PHASES))
    print(
        json.dumps(
            {
                "bench": "real_models",
                "threads": args.threads,
                "repeat": args.repeat,
                "rows": rows,
                "skipped": skipped,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
