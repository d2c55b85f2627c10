"""BEN2 Base fp32 at 1024²: the product's job over a bare `InferenceSession.run`, each in a fresh
process (so each has its own peak RSS), one run each.

    .venv/bin/python bench/ben2_product_vs_bare.py [--model FILE] [--side 1024]

The model is the `ben2-base` reference export (tools/reference_models.py; exported first when
missing: about 3 minutes on two cores, torch needed) unless --model names a file.
- bare: `onnxruntime.InferenceSession` with default options (onnxruntime's thread count, as the
  runtime's default), then one `run` on an already normalised 1x3x1024x1024 tensor;
- product: `FamilyJob.resolve("ben2", ...).infer(image)` on a side x side RGB image: the load
  through the shared runtime, the family check, Lanczos resize, normalisation, the run, min-max,
  resize back, the cut-out, the memory release and report.
Each side reports its load seconds, its run seconds (the product: everything but the load), the
whole, the process's CPU seconds over the whole (all threads: on a shared machine the wall clock
also measures other people's load) and its peak RSS (ru_maxrss). Ratios are product over bare from the same invocation;
the machine is shared, so the seconds also measure other people's load. Prints a table, then one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_BARE = """
import json, resource, sys, time
import numpy as np, onnxruntime as ort
path, side = sys.argv[1], int(sys.argv[2])
rgb = np.random.default_rng(0).random((1, 3, 1024, 1024), dtype=np.float32)
mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
feed = (rgb - mean) / std
t0, c0 = time.perf_counter(), time.process_time()
session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
t1 = time.perf_counter()
(matte,) = session.run(None, {session.get_inputs()[0].name: feed})
t2 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "run_s": t2 - t1, "total_s": t2 - t0, "cpu_s": time.process_time() - c0,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

_PRODUCT = """
import json, resource, sys, tempfile, time
import numpy as np  # onnxruntime: the runtime imports it (its report then has the library's floor)
from lean_image_ai.models.job import FamilyJob
from lean_image_ai.runtime import get_runtime
path, side = sys.argv[1], int(sys.argv[2])
image = np.random.default_rng(0).random((side, side, 3), dtype=np.float32)
runtime = get_runtime()
with tempfile.TemporaryDirectory() as folder:
    job = FamilyJob.resolve("ben2", folder, model_path=path, device="cpu")
    t0, c0 = time.perf_counter(), time.process_time()
    result = job.infer(image, job.options(runtime=runtime))
    t1, c1 = time.perf_counter(), time.process_time()
load = sum(e["seconds"] for e in runtime.events.recent("session_create"))
print(json.dumps({"load_s": load, "run_s": t1 - t0 - load, "total_s": t1 - t0, "cpu_s": c1 - c0,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "report": runtime.last_job_memory["lines"]}))
"""


def _side(code: str, model: Path, side: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code, str(model), str(side)], capture_output=True, text=True, cwd=ROOT, timeout=1800
    )
    if done.returncode != 0:
        raise SystemExit(f"a side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a BEN2 export (default: the ben2-base reference export)")
    parser.add_argument("--side", type=int, default=1024, help="the product's source image side (default 1024)")
    args = parser.parse_args(argv)
    model = args.model
    if model is None:
        sys.path.insert(0, str(ROOT / "tools"))
        from reference_models import model_path

        model = model_path("ben2-base")
    bare = _side(_BARE, model, args.side)
    product = _side(_PRODUCT, model, args.side)
    report = product.pop("report")
    print(f"{'':8} {'load s':>7} {'run s':>7} {'total s':>8} {'CPU s':>7} {'peak RSS MB':>12}")
    for name, row in (("bare", bare), ("product", product)):
        mb = row["peak_rss"] / 2**20
        print(
            f"{name:8} {row['load_s']:>7.1f} {row['run_s']:>7.1f} {row['total_s']:>8.1f} {row['cpu_s']:>7.1f} {mb:>12.0f}"
        )
    ratios = {k: round(product[k] / bare[k], 3) for k in ("run_s", "total_s", "cpu_s", "peak_rss")}
    print("\n".join(report))
    print(json.dumps({"model": str(model), "side": args.side, "bare": bare, "product": product, "ratios": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
