"""The session options one device needs, from the device table (runtime/providers.py), and what
onnxruntime said while it made the session (bpy-free)."""

from __future__ import annotations

from pathlib import Path

from .log import native_log
from .providers import COREML, DEVICE_BY_PROVIDER, DML, coreml_partition_warning, coreml_partitions

ORT_INFO = 1  # SessionOptions.log_severity_level: 0 verbose, 1 info, 2 warning (ORT's default)


def session_options(ort, providers: list[tuple[str, dict]], *, intra_op_threads: int = 0):
    """``ort.SessionOptions`` for a session whose first provider is ``providers[0]``: the session
    config entries its device row lists, and what that provider needs besides."""
    options = ort.SessionOptions()
    options.log_severity_level = native_log.SESSION_LOG_SEVERITY  # what ORT says is kept, not printed
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    primary = providers[0][0]
    device = DEVICE_BY_PROVIDER.get(primary)
    for key, value in device.session_entries if device else ():
        options.add_session_config_entry(key, value)
    if primary == DML:
        # DirectML runs neither memory patterns nor parallel execution (ORT's DirectML notes);
        # said here so the session does not depend on ORT turning them off with a warning
        options.enable_mem_pattern = False
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if primary == COREML:
        # CoreML's partition summary is logged at INFO when the graph is one piece (or none)
        options.log_severity_level = ORT_INFO
        cache = providers[0][1].get("ModelCacheDirectory")
        if cache:
            Path(cache).mkdir(parents=True, exist_ok=True)
    return options


def note_partitions(handle, lines: list[str]) -> None:
    """From ORT's log lines of a session's creation (runtime/log/native_log.py), a CoreML session's partition report (``handle.partitions``) and, when CoreML takes little
    of the graph, the artist's warning (``handle.partition_warning``)."""
    handle.partitions = coreml_partitions(lines) if handle.providers[:1] == [COREML] else None
    handle.partition_warning = coreml_partition_warning(handle.model_name, handle.partitions)
    if handle.partition_warning and not handle.fallback_warning:  # the artist hears it as a fallback
        handle.fallback_warning = handle.partition_warning
