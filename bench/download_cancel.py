"""How long a Cancel and a stall take to end a download from a slow-drip server (issue #21).

A loopback server (tests/model_server.py) sends the model one byte every 0.5 s, so no socket
timeout ever fires. Each trial starts an install on a worker thread, waits for a few bytes, then
either sets the cancel flag and measures the seconds until install() has raised (and its lock is
free), or lets the stall detector (``TransferLimits(stall_seconds=S)``) give up and measures how
far past S it ended. For scale, the time the drip alone would take to send the file is printed
beside them. Ends with one JSON line.

    .venv/bin/python bench/download_cancel.py [--trials 5] [--stall 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from lean_image_ai.models.store import installer  # noqa: E402
from lean_image_ai.models.store.transfer.http_watch import TransferLimits  # noqa: E402
from model_server import loopback_entry, loopback_http, onnx_payload, serving  # noqa: E402

DRIP = 0.5
SIZE = 64 * 1024


def _trial(folder: Path, *, cancel_after_bytes: int | None, limits: TransferLimits) -> tuple[float, str]:
    """(seconds from the cancel, or from the stall window's end, to install() raising; error type)."""
    with serving() as srv, loopback_http():
        srv.files["/m.onnx"] = onnx_payload(SIZE)
        srv.drip = DRIP
        entry = loopback_entry(srv.url("/m.onnx"), None)
        flag = threading.Event()
        outcome: dict = {}

        def work():
            started = time.monotonic()
            try:
                installer.install(entry, folder, cancel=flag.is_set, timeout=5, limits=limits)
            except Exception as exc:  # noqa: BLE001 - the outcome is what is measured
                outcome["error"], outcome["end"] = type(exc).__name__, time.monotonic()
            outcome["start"] = started

        worker = threading.Thread(target=work)
        worker.start()
        if cancel_after_bytes is not None:
            while srv.dripped < cancel_after_bytes:
                time.sleep(0.01)
            flag.set()
            asked = time.monotonic()
            worker.join()
            return outcome["end"] - asked, outcome["error"]
        worker.join()
        return outcome["end"] - outcome["start"] - limits.stall_seconds, outcome["error"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--stall", type=float, default=2.0, help="stall window in seconds")
    args = parser.parse_args()
    cancels, stalls = [], []
    with tempfile.TemporaryDirectory(prefix="lean_image_ai_bench_") as tmp:
        for trial in range(args.trials):
            folder = Path(tmp) / f"c{trial}"
            seconds, error = _trial(folder, cancel_after_bytes=3, limits=TransferLimits())
            assert error == "OperationCancelled", error
            cancels.append(seconds)
            folder = Path(tmp) / f"s{trial}"
            limits = TransferLimits(stall_seconds=args.stall)
            seconds, error = _trial(folder, cancel_after_bytes=None, limits=limits)
            assert error == "ModelInstallError", error
            stalls.append(seconds)
            print(f"trial {trial + 1}: cancel took {cancels[-1]:.3f} s; stall ended {stalls[-1]:.3f} s past its window")
    drip_total = SIZE * DRIP
    result = {
        "bench": "download_cancel",
        "drip_seconds_per_byte": DRIP,
        "file_bytes": SIZE,
        "drip_would_take_s": drip_total,
        "cancel_s_median": round(statistics.median(cancels), 3),
        "cancel_s_max": round(max(cancels), 3),
        "stall_window_s": args.stall,
        "stall_past_window_s_median": round(statistics.median(stalls), 3),
        "stall_past_window_s_max": round(max(stalls), 3),
        "cancel_over_drip": round(max(cancels) / drip_total, 8),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
