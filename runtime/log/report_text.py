"""The doctor's report as readable text, one fact per line (bpy-free): what
:func:`diagnostics.collect` found, part by part (onnxruntime, the Auto session, NVML, the add-on's
GPU runtime, the CUDA/cuDNN libraries, the CUDA probe)."""

from __future__ import annotations


def _mib(value) -> str:
    return "?" if value is None else f"{value / 2**20:.0f} MiB"


def format_report(report) -> str:
    """The text of a diagnostics.Report."""
    lines = [f"Python: {report.python}", f"Platform: {report.platform}"]
    for part in (_onnxruntime_lines, _session_lines, _nvml_lines, _gpu_runtime_lines, _library_lines, _probe_lines):
        lines += part(report)
    return "\n".join(lines)


def _onnxruntime_lines(report) -> list[str]:
    if report.onnxruntime_error:
        lines = [f"onnxruntime: {report.onnxruntime_error}"]
    else:
        lines = [
            f"onnxruntime: {report.onnxruntime_package or 'onnxruntime'} {report.onnxruntime_version}"
            f" from {report.onnxruntime_location}"
            + (f" (built for CUDA {report.build_cuda_version})" if report.build_cuda_version else ""),
            f"Providers offered: {', '.join(report.available_providers) or 'none'}",
        ]
    if report.bundled_wheels:
        lines.append(f"Bundled with this zip: {', '.join(report.bundled_wheels)}")
    return lines


def _session_lines(report) -> list[str]:
    session = report.session
    if session.get("device"):
        return [
            f"A job on Auto runs on: {session['device']} ({', '.join(session['providers'])});"
            f" release rule: {session['release_rule']}: {session['release_text']}"
        ]
    if session.get("error"):
        return [f"A job on Auto: no session ({session['error']})"]
    return []


def _nvml_lines(report) -> list[str]:
    nvml = report.nvml
    if not nvml.get("available"):
        extra = ""
        if "driver_library_found" in nvml:
            extra = "; NVIDIA driver library " + ("found" if nvml["driver_library_found"] else "not found")
        return [f"{nvml.get('error', 'NVML not available')}{extra}"]
    lines = [
        f"NVIDIA driver {nvml.get('driver_version', '?')} (CUDA {nvml.get('cuda_driver_version', '?')}),"
        f" {len(nvml.get('gpus', []))} GPU(s)"
    ]
    for gpu in nvml.get("gpus", []):
        lines.append(
            f"  GPU {gpu['index']}: {gpu['name']}, {_mib(gpu['total_bytes'])} total, {_mib(gpu['free_bytes'])} free"
        )
    if nvml.get("error"):
        lines.append(f"  NVML error: {nvml['error']}")
    return lines


def _gpu_runtime_lines(report) -> list[str]:
    gpu = report.gpu_runtime
    if not gpu:
        return []
    if gpu.get("error"):
        return [f"Add-on GPU runtime: {gpu['error']}"]
    return [
        f"Add-on GPU runtime: {gpu.get('version') or '?'} in {gpu['folder']},"
        f" {len(gpu.get('loaded', []))} loaded"
        + (f", failed: {', '.join(gpu['failed'])}" if gpu.get("failed") else "")
    ]


def _library_lines(report) -> list[str]:
    if report.cuda_libraries_note:
        return [f"CUDA/cuDNN libraries: {report.cuda_libraries_note}"]
    if not report.cuda_libraries:
        return []
    missing = [lib.name for lib in report.cuda_libraries if lib.where == "not found" and lib.required]
    lines = ["CUDA/cuDNN libraries: " + ("all required found" if not missing else f"missing {', '.join(missing)}")]
    for lib in report.cuda_libraries:
        tag = "" if lib.required else " (optional)"
        lines.append(f"  {lib.name}{tag}: {lib.where}" + (f" {lib.path}" if lib.path else ""))
    return lines


def _probe_lines(report) -> list[str]:
    probe = report.cuda_probe
    if probe is None:
        return []
    if not probe.attempted:
        lines = [f"CUDA session: not tried ({probe.fallback_reason})"]
    elif probe.ok:
        lines = [f"CUDA session: OK ({', '.join(probe.providers)})"]
    else:
        got = ", ".join(probe.providers) or "no session"
        lines = [f"CUDA session: fell back to {got}: {probe.fallback_reason or 'no reason given by ORT'}"]
    if probe.ort_messages:  # ORT's own log while the session was made (kept off the console)
        lines.append("  onnxruntime said:")
        lines.extend(f"    {message}" for message in probe.ort_messages)
    return lines
