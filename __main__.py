"""`python -m lean_image_ai ...`: headless jobs without Blender (see models/cli.py)."""

import sys

from .models.cli import main

if __name__ == "__main__":
    sys.exit(main())
