"""Stand-ins for what background-mode Blender lacks when a modal operator is driven by a test
(see tests/test_jobs_modal.py's module doc): events, a recording window manager and workspace,
a context made of those and the real ``bpy.context``, and a driver operator in whose ``execute``
(the one place a live operator instance exists) the test's script runs."""

from __future__ import annotations

import time
import types

import bpy


class Event:
    def __init__(self, type, value="NOTHING"):
        self.type, self.value = type, value


TIMER = Event("TIMER")
ESC = Event("ESC", "PRESS")


class RecordingWindowManager:
    """Records what the operator asks of the window manager (see module doc)."""

    def __init__(self):
        self.calls = []
        self.timers_added = []
        self.timers_removed = []
        self.handlers = []
        self.progress = []

    def event_timer_add(self, interval, window=None):
        timer = object()
        self.timers_added.append(timer)
        self.calls.append(("event_timer_add", interval))
        return timer

    def event_timer_remove(self, timer):
        assert timer in self.timers_added and timer not in self.timers_removed
        self.timers_removed.append(timer)
        self.calls.append(("event_timer_remove",))

    def modal_handler_add(self, operator):
        self.handlers.append(operator)
        self.calls.append(("modal_handler_add",))
        return True

    def progress_begin(self, low, high):
        self.calls.append(("progress_begin", low, high))

    def progress_update(self, value):
        self.progress.append(value)
        self.calls.append(("progress_update", value))

    def progress_end(self):
        self.calls.append(("progress_end",))

    @property
    def live_timers(self):
        return [t for t in self.timers_added if t not in self.timers_removed]


class RecordingWorkspace:
    def __init__(self):
        self.status = []

    def status_text_set(self, text):
        self.status.append(text)


class StandInContext:
    """The real context, except for the window manager, window and workspace (see module doc)."""

    def __init__(self):
        self.window_manager = RecordingWindowManager()
        self.window = object()
        self.workspace = RecordingWorkspace()
        self.screen = None

    def __getattr__(self, name):
        return getattr(bpy.context, name)


SCRIPT = {}


def _driver_execute(self, context):
    return SCRIPT.pop("script")(self)


def driver_class(real, idname: str, name: str):
    """A registered operator with ``real``'s bases, properties and methods, whose ``execute``
    runs the test's script. Built from the real class's own dict rather than by subclassing it:
    registering a subclass of a registered operator breaks Blender's lookup of the parent's
    Python class."""
    own = {
        key: value
        for key, value in vars(real).items()
        if key not in ("__dict__", "__weakref__", "bl_rna", "execute")
    }
    own.update(bl_idname=idname, bl_label=f"Drive {real.bl_label} (test)", execute=_driver_execute)
    own["__annotations__"] = dict(own.get("__annotations__", {}))
    driver = type(name, real.__bases__, own)
    for key, value in own.items():  # a method calling super() must see the driver as its class, not ``real``
        if isinstance(value, types.FunctionType) and "__class__" in value.__code__.co_freevars:
            cells = tuple(types.CellType(driver) if free == "__class__" else cell
                          for free, cell in zip(value.__code__.co_freevars, value.__closure__, strict=True))
            setattr(driver, key, types.FunctionType(value.__code__, value.__globals__, value.__name__,
                                                    value.__defaults__, cells))
    return driver


def drive(call, script, **props):
    """Run ``script(operator)`` inside a live operator (``call``: its ``bpy.ops`` function);
    returns what the script returned."""
    outcome = {}

    def wrapped(op):
        outcome["value"] = script(op)
        return {"FINISHED"}

    SCRIPT["script"] = wrapped
    call(**props)
    return outcome["value"]


def pump(op, ctx, *, timeout=20.0):
    """Send TIMER events like Blender's timer would, until modal stops running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = op.modal(ctx, TIMER)
        if result != {"RUNNING_MODAL"}:
            return result
        time.sleep(0.005)
    raise AssertionError("the job did not end in time")
