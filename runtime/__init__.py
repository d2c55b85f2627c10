"""The shared inference runtime (bpy-free). Every ONNX run in the add-on goes through here.

The runtime belongs to the model worker and the command line: Blender's process imports only its
plain modules (errors, paths, providers' tables, settings, the event file, the memory report and
picture), never the ones that make threads or load onnxruntime (docs/building.md, "Which modules
run where"). So the names below that live in those modules load on first use, not with the package.
"""

import importlib

from .errors import (
    DeviceSpecError,
    InferenceError,
    InferenceOutOfMemoryError,
    InvalidImageError,
    InvalidModelOutputError,
    LeanImageError,
    ModelContractError,
    ModelFileError,
    ModelInstallError,
    OperationCancelled,
    ProviderUnavailableError,
    SessionClosedError,
)
from .plugin_eps import table as _plugin_rows  # noqa: F401 - its rows join the device table on import
from .providers import DeviceRequest, parse_device

_LOADED_ON_USE = {
    "Runtime": ".core",
    "RuntimeSettings": ".core",
    "get_runtime": ".core",
    "format_snapshot": ".measure.memory",
    "memory_snapshot": ".measure.memory",
    "Operation": ".operation",
    "env_cpu_arena_config": ".release.cpu_arena",
    "SessionHandle": ".session",
    "TensorInfo": ".session",
    "installed_providers": ".session",
    "mark_last": ".session",
    "runnable_providers": ".session",
}


def __getattr__(name: str):
    module = _LOADED_ON_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


__all__ = [
    "DeviceRequest",
    "DeviceSpecError",
    "InferenceError",
    "InferenceOutOfMemoryError",
    "InvalidImageError",
    "InvalidModelOutputError",
    "LeanImageError",
    "ModelContractError",
    "ModelFileError",
    "ModelInstallError",
    "Operation",
    "OperationCancelled",
    "ProviderUnavailableError",
    "Runtime",
    "RuntimeSettings",
    "SessionClosedError",
    "SessionHandle",
    "TensorInfo",
    "env_cpu_arena_config",
    "format_snapshot",
    "installed_providers",
    "runnable_providers",
    "get_runtime",
    "mark_last",
    "memory_snapshot",
    "parse_device",
]
