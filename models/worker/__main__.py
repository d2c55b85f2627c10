"""``python -m lean_image_ai.models.worker``: the model worker process (see models/worker/client.py).

Started by the client (models/worker/launch.py); never run by hand.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="lean_image_ai.models.worker")
    parser.add_argument("--fd", type=int, default=-1, help="the inherited socket (POSIX)")
    parser.add_argument("--address", default="", help="the client's listener to dial (Windows)")
    parser.add_argument("--exchange", required=True, help="the in-memory folder arrays cross in")
    parser.add_argument("--spill", default="", help="the folder on disk for arrays the first has no room for")
    parser.add_argument("--gpu-runtime", default="", help="the add-on's installed CUDA/cuDNN libraries")
    args = parser.parse_args(argv)
    import faulthandler

    faulthandler.enable()  # a native crash leaves its Python stack in stderr: the client logs it
    if args.gpu_runtime:  # before anything imports onnxruntime, as `doctor --gpu-runtime` does
        from ...runtime.cuda import gpu_loading

        gpu_loading.activate(args.gpu_runtime)
    from multiprocessing.connection import Connection

    from .launch import dial
    from .serve import Worker
    from .wire import Exchange

    key = ""
    if args.fd >= 0:
        conn = Connection(args.fd)
    else:  # the key comes on stdin, never on the command line
        key = sys.stdin.readline().strip()
        conn = dial(args.address)
    Worker(conn, Exchange(args.exchange, args.spill or args.exchange), key=key).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
