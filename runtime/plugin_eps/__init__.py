"""onnxruntime's plugin execution providers (bpy-free): packages such as onnxruntime-ep-webgpu that
bring a provider library registered at run time (runtime/plugin_eps/registry.py), one device row
each (runtime/plugin_eps/table.py)."""
