"""The plugin execution providers the add-on knows, and their rows in the device table
(runtime/providers.py), added when the runtime is imported so every reader of the table (the
device menu, ``--device``, the fallback warning) sees them.

Each package exposes ``get_library_path()`` and ``get_ep_name()`` (their published usage);
registration is ``onnxruntime.register_execution_provider_library(name, path)``, then
``get_ep_devices()`` and ``SessionOptions.add_provider_for_devices`` (runtime/plugin_eps/registry.py).
None of them has an arena ORT can shrink, and what they hold goes back only when their sessions
go (DESIGN.md §7): their release rule is UNLOAD.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..providers import DEVICE_BY_KIND, UNLOAD, DeviceKind, add_device


@dataclass(frozen=True)
class PluginEp:
    kind: str  # the device string
    package: str  # what the user installs into the worker's Python
    module: str  # its import name
    provider: str  # the provider name its get_ep_name() gives
    label: str
    needs: str  # what the machine needs besides the package (the doctor's hint)
    system_library: str = ""  # a system library it loads first, by ctypes.util.find_library's name
    enum_number: int = -1  # the preferences' stored number (never reuse or renumber one)
    aliases: tuple[str, ...] = ()  # other names the device string accepts


PLUGIN_EPS: tuple[PluginEp, ...] = (
    PluginEp("webgpu", "onnxruntime-ep-webgpu", "onnxruntime_ep_webgpu", "WebGpuExecutionProvider", "WebGPU",
             "a GPU driver with Vulkan (Linux: the Vulkan loader libvulkan.so.1), D3D12 (Windows) or Metal (macOS)",
             system_library="vulkan", enum_number=5),
    PluginEp("openvino", "onnxruntime-ep-openvino", "onnxruntime_ep_openvino", "OpenVINOExecutionProvider",
             "OpenVINO", "an Intel CPU, GPU or NPU with its driver", enum_number=6),
    PluginEp("rtx", "onnxruntime-ep-nv-tensorrt-rtx", "onnxruntime_ep_nv_tensorrt_rtx",
             "NvTensorRTRTXExecutionProvider", "TensorRT-RTX",
             "an NVIDIA RTX GPU (Ampere or newer) with a driver for CUDA 13", enum_number=7,
             aliases=("tensorrt-rtx",)),
)  # fmt: skip
PLUGIN_BY_PROVIDER = {p.provider: p for p in PLUGIN_EPS}
PLUGIN_BY_KIND = {p.kind: p for p in PLUGIN_EPS}


def _no_options(request, choices) -> dict:
    return {}


def device_row(plugin: PluginEp) -> DeviceKind:
    return DeviceKind(
        plugin.kind, plugin.provider, plugin.label, False, None, None, _no_options, UNLOAD,
        menu_label=plugin.label, menu_text=f"Run with the {plugin.package} plugin in the worker's Python",
        enum_number=plugin.enum_number, runtime_source=plugin.package,
        fallback_cause=f"{plugin.label} could not be used. It needs {plugin.needs}; the doctor says why",
        aliases=plugin.aliases, nvidia=plugin.kind == "rtx",
    )  # fmt: skip


for _plugin in PLUGIN_EPS:
    if _plugin.kind not in DEVICE_BY_KIND:
        add_device(device_row(_plugin))
