"""Using the installed GPU runtime in a process: its onnxruntime-gpu and CUDA/cuDNN libraries (bpy-free).

Installing it is runtime/cuda/gpu_libraries.py's job. The zips carry the CPU onnxruntime (the lean
rule, tools/build_extension.py); the GPU runtime folder holds onnxruntime-gpu beside NVIDIA's
libraries. activate() is the one entry for a process that runs models (the model worker, the CLI,
`doctor --gpu-runtime`): called before anything imports onnxruntime, it puts the folder first on
sys.path, so `import onnxruntime` gets the GPU build, then loads the libraries through
onnxruntime's own ``preload_dlls`` and says what loaded, what is missing and why.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import io
import os
import platform
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .gpu_libraries import MARKER


@dataclass
class Activation:
    """What activate() did: which libraries onnxruntime now has from the folder, and which not."""

    folder: str
    loaded: list[str] = field(default_factory=list)  # paths of libraries now in the process
    missing: list[str] = field(default_factory=list)  # library files not in the folder
    failed: dict[str, str] = field(default_factory=dict)  # file name -> why it did not load
    messages: list[str] = field(default_factory=list)  # what onnxruntime's preload_dlls() said
    error: str | None = None  # why nothing was tried (not installed, not a CUDA build, ...)
    on_path: bool = False  # the folder's onnxruntime-gpu is the onnxruntime this process imports

    @property
    def ok(self) -> bool:
        return self.error is None and not self.failed and bool(self.loaded)

    def summary(self) -> str:
        if self.error:
            return self.error
        text = f"{len(self.loaded)} CUDA/cuDNN librar{'y' if len(self.loaded) == 1 else 'ies'} loaded from {self.folder}"
        if self.missing:
            text += f"; not in the folder: {', '.join(Path(m).name for m in self.missing)}"
        if self.failed:
            text += "; failed: " + "; ".join(f"{name}: {why}" for name, why in self.failed.items())
        return text


_active: Activation | None = None


def active() -> Activation | None:
    """The latest activate() result in this process, or None when it was never called."""
    return _active


# --- loading --------------------------------------------------------------------------------------

# What onnxruntime 1.31's preload_dlls() loads for a CUDA 13 build, for an onnxruntime that does not
# say (its private _get_nvidia_dll_paths is used when present).
_FALLBACK_LIBRARIES = {
    "Linux": (
        [("nvidia", "cu13", "lib", n) for n in ("libcublasLt.so.13", "libcublas.so.13", "libnvrtc.so.13",
                                                "libcurand.so.10", "libcufft.so.12", "libcudart.so.13")],
        [("nvidia", "cudnn", "lib", "libcudnn.so.9")],
    ),
    "Windows": (
        [("nvidia", "cu13", "bin", "x86_64", n) for n in ("cublasLt64_13.dll", "cublas64_13.dll",
                                                          "cufft64_12.dll", "cudart64_13.dll")],
        [("nvidia", "cudnn", "bin", f"{n}64_9.dll") for n in ("cudnn_engines_runtime_compiled",
         "cudnn_engines_precompiled", "cudnn_heuristic", "cudnn_ops", "cudnn_adv", "cudnn_graph",
         "cudnn", "cudnn_engines_tensor_ir")],
    ),
}  # fmt: skip


def library_paths(ort, system: str | None = None) -> tuple[list[tuple], list[tuple]]:
    """(CUDA, cuDNN) libraries as paths relative to a site-packages folder: nvidia/<pkg>/lib|bin/..."""
    system = system or platform.system()
    paths_of = getattr(ort, "_get_nvidia_dll_paths", None)  # private; present in 1.2x-1.3x
    if paths_of is not None:
        is_windows = system == "Windows"
        return list(paths_of(is_windows, True, False)), list(paths_of(is_windows, False, True))
    cuda, cudnn = _FALLBACK_LIBRARIES.get(system, ([], []))
    return list(cuda), list(cudnn)


def _loaded_paths() -> set[str] | None:
    """Real paths of the shared libraries in this process (Linux), or None where it cannot be read."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return {os.path.realpath(ln.split(None, 5)[5].strip()) for ln in maps if len(ln.split(None, 5)) == 6}
    except OSError:
        return None


def _is_loaded(path: Path, maps: set[str] | None) -> bool:
    if maps is not None:
        return os.path.realpath(path) in maps
    if platform.system() == "Windows":
        get_module = ctypes.windll.kernel32.GetModuleHandleW  # type: ignore[attr-defined]
        get_module.restype = ctypes.c_void_p
        return bool(get_module(str(path)))
    return False


_dll_directories: list = []  # os.add_dll_directory handles: a closed handle removes the directory


def _put_on_path(target: Path) -> str | None:
    """Put target first on sys.path so its onnxruntime-gpu is the one imported; the reason when
    another onnxruntime (not a CUDA build) is already in this process, which no path can replace."""
    if not (target / "onnxruntime" / "__init__.py").is_file():
        return None  # installed before the GPU runtime carried onnxruntime-gpu: activate() says so
    loaded = sys.modules.get("onnxruntime")
    if loaded is not None:
        where = Path(os.path.abspath(getattr(loaded, "__file__", "") or "")).parent
        if where.parent == target or getattr(loaded, "cuda_version", None):
            return None  # already the runtime's own, or a CUDA build the libraries serve as well
        return (
            f"{getattr(loaded, 'package_name', 'onnxruntime')} was imported from {where} before the GPU runtime in "
            f"{target} was put on the path, so this process runs models on the CPU; the GPU runtime is used "
            "from the next process that runs models (restart Blender if models run inside it)."
        )
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
        importlib.invalidate_caches()
    return None


def activate(target_dir: str | os.PathLike) -> Activation:
    """Use the GPU runtime installed in target_dir in this process; the model process's entry,
    called before anything in it imports onnxruntime.

    First target_dir goes first on sys.path, so `import onnxruntime` finds the runtime's
    onnxruntime-gpu rather than the CPU onnxruntime the zip installed (Blender's process, which
    never runs models, never calls this). Then the CUDA/cuDNN libraries of target_dir are loaded
    with onnxruntime's own preload_dlls(), so the CUDA provider finds them at its first session.

    preload_dlls(directory=D) looks for each library *directly in D* (flat), while pip lays the
    wheels out as nvidia/cu13/lib (CUDA) and nvidia/cudnn/lib (cuDNN; bin/ on Windows). So it is
    called once per folder, CUDA first (cuDNN links against cuBLAS). Never raises: the result says
    what loaded, what is not in the folder and what failed.
    """
    global _active
    target = Path(os.path.abspath(target_dir))  # a sys.path entry must not depend on the working folder
    result = Activation(folder=str(target))
    _active = result
    if not (target / MARKER).is_file():  # a complete install only (install() writes it last)
        result.error = f"No GPU libraries are installed in {target}."
        return result
    result.error = _put_on_path(target)
    if result.error:
        return result
    try:
        import onnxruntime as ort
    except Exception as exc:
        result.error = f"onnxruntime cannot be imported ({type(exc).__name__}: {exc})."
        return result
    system = platform.system()
    if system not in ("Linux", "Windows"):
        result.error = f"CUDA libraries are not used on {system}."
        return result
    result.on_path = Path(os.path.abspath(ort.__file__)).parent.parent == target
    if not getattr(ort, "cuda_version", None):
        result.error = f"{getattr(ort, 'package_name', 'onnxruntime')} is not a CUDA build: nothing to load."
        if not (target / "onnxruntime").is_dir():
            result.error = (f"The GPU runtime in {target} has no onnxruntime-gpu (an older add-on version installed "
                            "it), so models run on the CPU: install it again from the preferences (Update).")
        return result
    preload = getattr(ort, "preload_dlls", None)
    groups = _groups(*library_paths(ort, system))
    for folder_parts, group in groups.items():
        folder = target.joinpath(*folder_parts)
        present = [n for n in group["names"] if (folder / n).is_file()]
        result.missing.extend(str(folder / n) for n in group["names"] if n not in present)
        if not present:
            continue
        if system == "Windows":
            with contextlib.suppress(OSError):  # lets the provider DLL resolve these DLLs' dependencies too
                _dll_directories.append(os.add_dll_directory(str(folder)))
        _preload(preload, folder, group, result)
    _check_loaded(target, groups, result)
    return result


def _groups(cuda, cudnn) -> dict[tuple, dict]:
    """The libraries by folder (relative parts), each folder's kinds and file names."""
    groups: dict[tuple, dict] = {}
    for kind, paths in (("cuda", cuda), ("cudnn", cudnn)):
        for relative in paths:
            group = groups.setdefault(tuple(relative[:-1]), {"cuda": False, "cudnn": False, "names": []})
            group[kind] = True
            group["names"].append(relative[-1])
    return groups


def _check_loaded(target: Path, groups: dict, result: Activation) -> None:
    """What really is in the process now: loaded, or failed with the loader's reason."""
    maps = _loaded_paths()
    for folder_parts, group in groups.items():
        folder = target.joinpath(*folder_parts)
        for name in group["names"]:
            path = folder / name
            if not path.is_file():
                continue
            if _is_loaded(path, maps):
                result.loaded.append(str(path))
            elif name not in result.failed:
                result.failed[name] = _reason_for(name, result.messages) or "not loaded"


def _preload(preload, folder: Path, group: dict, result: Activation) -> None:
    """One preload_dlls() call for one folder, its prints and warnings kept in result.messages."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if preload is not None:
                preload(cuda=group["cuda"], cudnn=group["cudnn"], msvc=group["cuda"], directory=str(folder))
            else:  # an onnxruntime without preload_dlls: load the files the same way it would
                for name in group["names"]:
                    if (folder / name).is_file():
                        try:
                            ctypes.CDLL(str(folder / name))
                        except OSError as exc:
                            result.failed[name] = str(exc)
    except Exception as exc:
        result.messages.append(f"onnxruntime could not preload the CUDA libraries: {type(exc).__name__}: {exc}")
    result.messages.extend(ln.strip() for ln in printed.getvalue().splitlines() if ln.strip())
    result.messages.extend(str(w.message) for w in caught)


def _reason_for(name: str, messages: list[str]) -> str | None:
    for message in messages:
        if name in message:
            return re.sub(r"^Failed to load \S+:\s*", "", message)
    return None
