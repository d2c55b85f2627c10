"""Sequences: which frames a batch covers, the batch run, frames shared between processes, the shot's two passes, the one runner of a job (bpy-free)."""
