"""The model worker process (bpy-free): Blender's model jobs run in a child process of its own
Python, which holds the shared runtime; Blender's process keeps no thread and no onnxruntime, and
gets every byte back when the worker ends. client.py starts and talks to it, serve.py is its side,
remote_batch.py is a BatchRun whose inference runs there, wire.py is what crosses between them.
"""
