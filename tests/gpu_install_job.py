"""One GPU-runtime install in its own process (two of these share one folder).

argv: folder, requirements file, the Python to run pip with, the local wheel folder. Prints one
JSON line, the outcome; exit 2 when the install raised GpuRuntimeError.
"""

import json
import sys

from lean_image_ai.runtime.cuda import gpu_install
from lean_image_ai.runtime.errors import GpuRuntimeError

folder, requirements, python, wheels = sys.argv[1:5]
try:
    done = gpu_install.install(folder, requirements, python=python, index_args=("--no-index", "--find-links", wheels))
    print(json.dumps({"ok": True, "path": str(done)}), flush=True)
except GpuRuntimeError as exc:
    print(json.dumps({"ok": False, "error": str(exc)}), flush=True)
    sys.exit(2)
