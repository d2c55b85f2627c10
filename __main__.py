"""`python -m lean_image_ai ...`: headless jobs without Blender. Also `python FOLDER ...` with the
add-on's folder (an installed extension's): the command the preferences show for the GPU engine
(runtime/cuda/engine_command.py) needs neither `cd` nor PYTHONPATH."""

import sys

if not __package__:  # run by path: import this folder as the package it is, under its own name
    import importlib.util
    import os

    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _here:
        del sys.path[0]  # the add-on's own subfolders (models, tools, ui) must not shadow other packages
    _spec = importlib.util.spec_from_file_location(
        "lean_image_ai", os.path.join(_here, "__init__.py"), submodule_search_locations=[_here]
    )
    sys.modules["lean_image_ai"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["lean_image_ai"])
    from lean_image_ai.ui.cli.main import main
else:
    from .ui.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
