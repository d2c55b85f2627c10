"""The doctor's report as readable text, one fact per line (bpy-free): what
:func:`diagnostics.collect` found, part by part (onnxruntime, the Auto session, NVML, the add-on's
GPU runtime, the CUDA/cuDNN libraries, the CUDA probe)."""

from __future__ import annotations


def _mib(value) -> str:
    return "?" if value is None else f"{value / 2**20:.0f} MiB"


def format_report(report) -> str:
    """The text of a diagnostics.Report."""
    lines = [f"Python: {report.python}", f"Platform: {report.platform}"]
    for part in (_worker_lines, _onnxruntime_lines, _session_lines, _nvml_lines, _gpu_runtime_lines,
                 _library_lines, _probe_lines, _plugin_lines):  # fmt: skip
        lines += part(report)
    lines.append(f"Next: {next_step(report)}")
    return "\n".join(lines)


def _worker_lines(report) -> list[str]:
    worker = getattr(report, "worker_python", None) or {}
    if not worker:
        return []
    head = f"The worker runs in: {worker['path']} (from {worker['source']})"
    return [f"{head}: {worker['facts']}" if worker.get("facts") else f"{head}: {worker['problem']}",
            "  (the lines below are of the doctor's own Python, the first line)"]  # fmt: skip


def _plugin_lines(report) -> list[str]:
    lines = []
    for plugin in getattr(report, "plugin_eps", None) or ():
        if plugin.get("problem"):
            lines.append(f"{plugin['package']}: cannot run: {plugin['problem']}")
        else:
            lines.append(f"{plugin['package']}: {plugin['provider']} on {plugin['devices']} device(s), "
                         f"from {plugin['library']}")  # fmt: skip
    return lines


def _version(text) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in str(text).split(".")[:2])
    except ValueError:
        return ()


def _cuda_step(report) -> str | None:
    """The one thing to do when the CUDA provider is offered but does not run (or is missing)."""
    nvml, probe = report.nvml or {}, report.cuda_probe
    gpus = len(nvml.get("gpus", [])) if nvml.get("available") else 0
    offered = report.cuda_offered
    if gpus and not offered:
        return ("an NVIDIA GPU is here but this onnxruntime has no CUDA: install the GPU engine with the command "
                "the add-on's preferences show (python <add-on folder> gpu install --target <folder>)")  # fmt: skip
    if not offered or probe is None or not probe.attempted or probe.ok:
        return None
    return _cuda_fallback_step(report, nvml, gpus)


def _cuda_fallback_step(report, nvml: dict, gpus: int) -> str:
    """Why a CUDA session fell back to the CPU, as the thing to do."""
    driver, build = _version(nvml.get("cuda_driver_version")), _version(report.build_cuda_version)
    if driver and build and driver < build:
        return (f"the NVIDIA driver supports CUDA {nvml.get('cuda_driver_version')} but this onnxruntime needs "
                f"CUDA {report.build_cuda_version}: update the NVIDIA driver")  # fmt: skip
    if not gpus:
        return "no NVIDIA GPU or driver is seen: install the NVIDIA driver, or choose another device"
    missing = [lib.name for lib in report.cuda_libraries if lib.where == "not found" and lib.required]
    if missing:
        return f"{', '.join(missing)} not found: install the GPU engine again (gpu install), which brings them"
    reason = report.cuda_probe.fallback_reason or "no reason given"
    return f"CUDA could not be used ({reason}): send this report with a bug report"


def next_step(report) -> str:
    """The one thing to do next, from the facts; 'nothing' when the best device here runs."""
    if report.onnxruntime_error:
        return report.onnxruntime_error
    worker = getattr(report, "worker_python", None) or {}
    if worker.get("problem"):
        return worker["problem"]
    step = _cuda_step(report)
    if step:
        return step
    stuck = [p for p in getattr(report, "plugin_eps", None) or () if p.get("problem")]
    if stuck:
        return stuck[0]["problem"]
    device = (report.session or {}).get("device")
    return f"nothing: models run on {device}" if device else "nothing found to fix"


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
