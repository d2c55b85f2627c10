"""The model families' adapters: BEN2, Depth Anything 3, MoGe-2 and upscale, each a FAMILY record and its per-frame body (bpy-free)."""
