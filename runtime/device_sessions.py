"""The session options one device needs, from the device table (runtime/providers.py), and what
onnxruntime said while it made the session (bpy-free)."""

from __future__ import annotations

from pathlib import Path

from .log import native_log
from .providers import DEVICE_BY_PROVIDER, coreml_partition_warning, coreml_partitions

ORT_INFO = 1  # SessionOptions.log_severity_level: 0 verbose, 1 info, 2 warning (ORT's default)


def session_options(ort, providers: list[tuple[str, dict]], *, intra_op_threads: int = 0):
    """``ort.SessionOptions`` for a session whose first provider is ``providers[0]``: the session
    config entries its device row lists, and what that provider needs besides."""
    options = ort.SessionOptions()
    options.log_severity_level = native_log.SESSION_LOG_SEVERITY  # what ORT says is kept, not printed
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    device = DEVICE_BY_PROVIDER.get(providers[0][0])
    if device is None:
        return options
    for key, value in device.session_entries:
        options.add_session_config_entry(key, value)
    if not device.memory_pattern:
        # said here so the session does not depend on ORT turning them off with a warning
        options.enable_mem_pattern = False
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if device.partition_report:
        # its partition summary is logged at INFO when the graph is one piece (or none)
        options.log_severity_level = ORT_INFO
    cache = providers[0][1].get(device.cache_option) if device.cache_option else None
    if cache:
        Path(cache).mkdir(parents=True, exist_ok=True)
    return options


def note_partitions(handle, lines: list[str]) -> None:
    """From ORT's log lines of a session's creation (runtime/log/native_log.py), a CoreML session's partition report (``handle.partitions``) and, when CoreML takes little
    of the graph, the artist's warning (``handle.partition_warning``)."""
    reports = handle.device is not None and handle.device.partition_report
    handle.partitions = coreml_partitions(lines) if reports else None
    handle.partition_warning = coreml_partition_warning(handle.model_name, handle.partitions)
    if handle.partition_warning and not handle.fallback_warning:  # the artist hears it as a fallback
        handle.fallback_warning = handle.partition_warning
