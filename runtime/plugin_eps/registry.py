"""Plugin execution providers in the process that runs models (the worker, the command line, the
doctor's child; never Blender's own): each installed package's library registered once with
``onnxruntime.register_execution_provider_library``, the devices it finds, and why one that is
installed cannot run (its library did not load, it finds no device), with what to do.
"""

from __future__ import annotations

import ctypes.util
import importlib
import sys
from dataclasses import dataclass

from ..errors import first_line
from .table import PLUGIN_BY_PROVIDER, PLUGIN_EPS, PluginEp


@dataclass
class PluginStatus:
    plugin: PluginEp
    library: str = ""  # the library registered (the package's get_library_path())
    provider: str = ""  # its get_ep_name()
    devices: int = 0  # the EP devices onnxruntime lists for it
    problem: str = ""  # why it cannot run here and what to do; "" when it can

    @property
    def runnable(self) -> bool:
        return self.devices > 0 and not self.problem


_status: dict[str, PluginStatus] = {}  # by kind: registration is once per process


def _missing_system_library(plugin: PluginEp) -> str:
    if plugin.system_library and sys.platform.startswith("linux") and not ctypes.util.find_library(plugin.system_library):
        return f" (no lib{plugin.system_library} here: install the system's Vulkan loader, e.g. libvulkan1)"
    return ""


def _register(ort, plugin: PluginEp, module) -> PluginStatus:
    status = PluginStatus(plugin)
    try:
        status.library = str(module.get_library_path())
        status.provider = str(module.get_ep_name())
        ort.register_execution_provider_library(plugin.kind, status.library)
    except Exception as exc:
        status.problem = (
            f"{plugin.package} is installed but its library did not load ({first_line(exc)})"
            f"{_missing_system_library(plugin)}: it needs {plugin.needs} and an onnxruntime it was built for."
        )
        return status
    status.devices = len(ep_devices(ort, status.provider))
    if not status.devices:
        status.problem = (
            f"{plugin.package} loaded but finds no device{_missing_system_library(plugin)}: it needs {plugin.needs}."
        )
    return status


def statuses(ort, importer=importlib.import_module) -> list[PluginStatus]:
    """One status per plugin package installed in this Python (registered on the first call)."""
    found = []
    for plugin in PLUGIN_EPS:
        if plugin.kind not in _status:
            try:
                module = importer(plugin.module)
            except ImportError:
                continue  # not installed: nothing to say
            _status[plugin.kind] = _register(ort, plugin, module)
        found.append(_status[plugin.kind])
    return found


def runnable_providers(ort) -> list[str]:
    """Plugin providers that found a device here (what `get_available_providers()` does not list)."""
    return [s.provider for s in statuses(ort) if s.runnable]


def ep_devices(ort, provider: str) -> list:
    return [d for d in ort.get_ep_devices() if d.ep_name == provider]


def is_plugin(provider: str) -> bool:
    return provider in PLUGIN_BY_PROVIDER


def add_to_session_options(ort, session_options, provider: str, provider_options: dict) -> None:
    """What a plugin provider needs instead of ``providers=[...]``: its devices and options on the
    session options (onnxruntime then falls back to the CPU for what it does not take)."""
    statuses(ort)
    devices = ep_devices(ort, provider)
    session_options.add_provider_for_devices(devices, {k: str(v) for k, v in provider_options.items()})


def inference_session(ort, model_path: str, session_options, providers: list[tuple[str, dict]]):
    """The one place sessions are made: by provider names, or a plugin provider by its devices."""
    if is_plugin(providers[0][0]):
        add_to_session_options(ort, session_options, *providers[0])
        return ort.InferenceSession(model_path, sess_options=session_options)
    return ort.InferenceSession(model_path, sess_options=session_options, providers=providers)


def forget() -> None:
    """Tests: register again on the next call (a new onnxruntime stand-in)."""
    _status.clear()
