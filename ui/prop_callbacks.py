"""The Python callbacks (items/get/set/update) of the add-on's PropertyGroup properties.

Blender 4.2 keeps its references to these functions after the class is unregistered. A function
keeps its module's globals alive, and through them every module they import, ``bpy`` included.
Uninstalling removes the add-on's modules from ``sys.modules``, so interpreter shutdown no longer
clears those globals: ``bpy`` then outlives Python's finalisation. The bpy wheel closes Blender
down (``WM_exit``) only when its module is freed, so it never did, and Blender's space types (with
Blender's own Python panels in them) were freed by a C++ static destructor after Python had gone:
``PyGILState_Ensure`` from ``bpy_class_free`` in ``SpaceType::~SpaceType()``, SIGSEGV at exit.

So the callbacks live here, in a module that imports nothing at module level: each looks its
implementation up in ui/model_menu.py when Blender calls it, and what Blender keeps reaches no
further than this module. tests/test_prop_callbacks.py checks that nothing here reaches bpy.
"""


def _menu():
    from . import model_menu  # at call time, so no module is kept in this module's globals

    return model_menu


def model_items(family: str):
    def items(self, context):
        return _menu().model_items(family, context)

    return items


def model_getter(family: str):
    def get(self):
        return _menu().get_model(family, self)

    return get


def model_setter(family: str):
    def set_(self, value):
        _menu().set_model(family, self, value)

    return set_
