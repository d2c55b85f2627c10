"""``python -m lean_image_ai.models.worker``: the model worker process (see models/worker/client.py).

Started by the client with the host's Python and ``sys.path``; never run by hand.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="lean_image_ai.models.worker")
    parser.add_argument("--fd", type=int, default=-1, help="the inherited socket (POSIX)")
    parser.add_argument("--address", default="", help="the client's pipe (Windows)")
    parser.add_argument("--exchange", required=True, help="the folder arrays cross in")
    parser.add_argument("--gpu-runtime", default="", help="the add-on's installed CUDA/cuDNN libraries")
    args = parser.parse_args(argv)
    if args.gpu_runtime:  # before anything imports onnxruntime, as `doctor --gpu-runtime` does
        from ...runtime.cuda import gpu_loading

        gpu_loading.activate(args.gpu_runtime)
    from multiprocessing.connection import Client, Connection

    if args.fd >= 0:
        conn = Connection(args.fd)
    else:  # Windows: the client's named pipe; the key comes on stdin, never on the command line
        conn = Client(args.address, family="AF_PIPE", authkey=bytes.fromhex(sys.stdin.readline().strip()))
    from .serve import Worker

    Worker(conn, args.exchange).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
