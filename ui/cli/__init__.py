"""The headless front-ends (bpy-free): the command line, its image files, the Ray farm driver and worker, the Flamenco job type."""
