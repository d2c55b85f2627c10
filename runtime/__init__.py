"""The shared inference runtime (bpy-free). Every ONNX run in the add-on goes through here."""

from .core import Runtime, RuntimeSettings, get_runtime
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
from .measure.memory import format_snapshot, memory_snapshot
from .operation import Operation
from .providers import DeviceRequest, parse_device
from .release.cpu_arena import env_cpu_arena_config
from .session import SessionHandle, TensorInfo, installed_providers, mark_last, runnable_providers

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
