"""One model run's mechanics: outputs bound to the caller's memory (IOBinding) or returned as
owned copies, and an error's frames dropped so a failed run's session can go (bpy-free)."""

from __future__ import annotations

import numpy as np


def without_frames(exc: BaseException) -> BaseException:
    """``exc`` and the errors chained to it, without their tracebacks (the frames that hold the
    session); their type and text stay for the report."""
    seen = set()
    current = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = None
        current = current.__cause__ or current.__context__
    return exc


def bindable(handle, out) -> bool:
    """IOBinding into host memory where a SessionHandle's row allows it (the CPU provider writes
    there directly, CUDA copies there)."""
    return bool(out) and handle.device is not None and handle.device.io_binding


def run_bound(session, names, feeds, out, run_options):
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, np.ascontiguousarray(value))
    for name in names:
        target = out.get(name)
        if target is None:
            binding.bind_output(name, "cpu")
            continue
        if not target.flags.c_contiguous:
            raise ValueError(f"the output array for {name!r} must be C-contiguous")
        binding.bind_output(name, "cpu", 0, target.dtype, list(target.shape), target.ctypes.data)
    session.run_with_iobinding(binding, run_options)
    if all(name in out for name in names):
        return [out[name] for name in names]  # written in place: no copy
    copies = binding.copy_outputs_to_cpu()
    return [out.get(name, value) for name, value in zip(names, copies, strict=True)]


def copy_into(target, value, owned_copy: bool):
    if target is None:
        return np.array(value, copy=True) if owned_copy else value
    np.copyto(target, value)
    return target
