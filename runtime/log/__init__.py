"""What the runtime tells: structured events, their file on disk, onnxruntime's own log, the machine report (bpy-free)."""
