"""What the UNLOAD release rule (DirectML, CoreML: the job's sessions are dropped when it ends)
costs the next job: the model is loaded again. Measured on CPU stand-ins of a few sizes, side by
side in one run: jobs in a row with the rule (every job loads the model) and with
"Keep models loaded on DirectML/CoreML" (only the first does).

    .venv/bin/python bench/reload.py [--jobs 5] [--sizes 1024,2048,4096,6144]

Each model is an n x n float32 MatMul (tests/onnx_builders.weights_model: its cost is its weights,
as a real network's load is), run through the real runtime by a real CPU session that reports
DmlExecutionProvider, so the runtime applies DirectML's release rule to it (a real DirectML or
CoreML load also uploads to the device or compiles: slower than here; CoreML's compiled-model
cache, ModelCacheDirectory, spares the compile on later loads). Per size: the file's MB, the median
seconds of a job with each rule, the reload cost (their difference) and their ratio, and the RSS
the unload gave back after a job. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

DML = "DmlExecutionProvider"
CPU = "CPUExecutionProvider"


class _ReportsDirectML:
    """A real CPU session that says it runs on DirectML (what the runtime decides the rule from)."""

    def __init__(self, real):
        self.real = real

    def get_providers(self):
        return [DML, CPU]

    def get_provider_options(self):
        return {}

    def get_inputs(self):
        return self.real.get_inputs()

    def get_outputs(self):
        return self.real.get_outputs()

    def run(self, names, feeds, run_options=None):
        return self.real.run(names, feeds)


def _factory(model_path, options, providers):
    import onnxruntime as ort

    return _ReportsDirectML(ort.InferenceSession(model_path, sess_options=options, providers=[CPU]))


def _jobs(model: Path, n: int, jobs: int, keep: bool) -> tuple[list[float], list[int]]:
    from lean_image_ai.runtime import Runtime, RuntimeSettings

    runtime = Runtime(
        RuntimeSettings(keep_models_loaded_on_dml_coreml=keep),
        session_factory=_factory,
        available_providers=lambda: [DML, CPU],
    )
    x = np.random.default_rng(0).standard_normal((1, n)).astype(np.float32)
    seconds, freed = [], []
    for _ in range(jobs + 1):  # the first job loads with either rule: not counted
        started = time.perf_counter()
        with runtime.operation("bench") as op:
            op.run(op.session(model, "directml"), {"x": x}, last=True)
        seconds.append(time.perf_counter() - started)
        freed.append((op.unloaded or {}).get("by", {}).get("ram") or 0)
    runtime.clear("bench done")
    return seconds[1:], freed[1:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--sizes", default="1024,2048,4096,6144", help="n of the n x n weights")
    args = parser.parse_args(argv)
    from onnx_builders import weights_model

    rows = []
    with tempfile.TemporaryDirectory(prefix="lean_image_ai_reload_") as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            model = weights_model(Path(tmp) / f"w{n}.onnx", n=n)
            # alternate which rule runs first, so neither always finds a warm page cache
            unload, freed = _jobs(model, n, args.jobs, keep=False)
            kept, _ = _jobs(model, n, args.jobs, keep=True)
            unload2, freed2 = _jobs(model, n, args.jobs, keep=False)
            unload_s = statistics.median(unload + unload2)
            kept_s = statistics.median(kept)
            rows.append(
                {
                    "n": n,
                    "model_mb": round(model.stat().st_size / 2**20, 1),
                    "job_s_unload": round(unload_s, 4),
                    "job_s_kept": round(kept_s, 4),
                    "reload_s": round(unload_s - kept_s, 4),
                    "ratio_unload_over_kept": round(unload_s / kept_s, 2),
                    "ram_given_back_mb": round(statistics.median(freed + freed2) / 2**20, 1),
                }
            )
            model.unlink()
    print(f"{'model MB':>9} {'unload s':>9} {'kept s':>8} {'reload s':>9} {'ratio':>6} {'RAM back MB':>12}")
    for r in rows:
        print(
            f"{r['model_mb']:>9} {r['job_s_unload']:>9} {r['job_s_kept']:>8} {r['reload_s']:>9}"
            f" {r['ratio_unload_over_kept']:>6} {r['ram_given_back_mb']:>12}"
        )
    print(json.dumps({"bench": "reload", "jobs": args.jobs, "sizes": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
