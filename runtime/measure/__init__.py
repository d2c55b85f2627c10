"""Measuring memory: snapshots, the job's timeline, the budget check, the report and its picture, the leak check (bpy-free)."""
