"""`python -m lean_image_ai ...`: headless jobs without Blender."""

import sys

from .ui.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
