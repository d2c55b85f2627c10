"""MoGe-2 camera recovery with wild points left in the mask: focal error of our solver and of
MoGe's own solver (LM over the shift from 0, ftol 1e-3, as its geometry_numpy.py solves it) on the
same samples, 5 seeds per case; one JSON line at the end. Needs scipy (the reference only).

    python bench/moge2_outliers.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from lean_image_ai.models.adapters import moge2_solver  # noqa: E402
from test_moge2 import SOLVER_CASES  # noqa: E402
from test_moge2_outliers import moge_reference, with_outliers  # noqa: E402


def main() -> None:
    rows = []
    for fraction in (0.01, 0.05, 0.1):
        for height, width, focal, shift in SOLVER_CASES:
            ours, moge = [], []
            for seed in range(5):
                points, mask, _ = with_outliers(height, width, focal, shift, fraction, seed)
                try:
                    ours.append(abs(moge2_solver.recover_focal_shift(points, mask)[0] - focal))
                except moge2_solver.DegenerateGeometryError:
                    ours.append(float("nan"))  # refused: counted as a failure
                xyz, uv = moge2_solver._subsample(points, moge2_solver.view_plane_uv(height, width), mask, 64, 1024)
                moge.append(abs(moge_reference(uv, xyz)[0] - focal))
            row = {
                "outliers": fraction, "case": f"{height}x{width} f={focal}",
                "ours_max": float(np.max(ours)), "moge_max": float(np.max(moge)),
            }
            rows.append(row)
            print(f"{fraction:4.0%} {row['case']:>18}: focal error ours max {row['ours_max']:.3g}, MoGe max {row['moge_max']:.3g}")
    print(json.dumps({"bench": "moge2_outliers", "worst_ours": max(r["ours_max"] for r in rows),
                      "worst_moge": max(r["moge_max"] for r in rows)}))


if __name__ == "__main__":
    main()
