"""NVIDIA's CUDA/cuDNN libraries for onnxruntime-gpu: installing, loading, and which NVML device an index names (bpy-free)."""
