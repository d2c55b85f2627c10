"""The model worker process (bpy-free): Blender's model jobs run in a child process of its own
Python, which holds the shared runtime; Blender's process keeps no thread and no onnxruntime, and
gets every byte back when the worker ends. client.py owns its life and talks to it, serve.py is its side,
remote_batch.py is a BatchRun whose inference runs there, protocol.py is every message, wire.py
how they cross, launch.py how the process starts, outcome.py what the artist is told when it ends.
"""
