"""The headless front-ends (bpy-free): the command line, its image files, the Ray farm driver and
worker, the Flamenco job type.

They sit under ``ui/`` beside Blender's front-end (the panels and preferences directly in
``ui/``) but share nothing with it: they need no Blender, never import ``bpy``, ``operators/``
or Blender's UI modules (tests/test_import_graph.py forbids it), and build a ``JobSpec`` that
``models/`` runs. Blender's front-end goes through ``operators/``; these go straight to
``models/`` and ``runtime/``. See docs/architecture.md, "The two kinds of front-end".
"""
