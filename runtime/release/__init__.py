"""Giving memory back: the shared CPU arena, warm output buffers, the release deferred until jobs stop coming (bpy-free)."""
