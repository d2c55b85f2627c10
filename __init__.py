"""Lean Image AI: BEN2, Depth Anything 3, MoGe-2 and upscalers on ONNX Runtime inside Blender.

Importing this package never imports bpy: runtime/ and models/ work in any Python, and the
Blender glue (operators/, ui/) is imported only from register()/unregister().
"""


def register():
    from . import operators, ui

    operators.check_family_operators()  # before anything is registered: no half-made panel
    ui.register()
    operators.register()


def unregister():
    from . import operators, ui

    operators.unregister()
    ui.unregister()
