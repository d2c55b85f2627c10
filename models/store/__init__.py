"""Model files: the catalog, the library folder, downloads and installs, the user's own files, the family check (bpy-free)."""
