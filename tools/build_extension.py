"""Build the installable extension zips: one per build and per Blender Python, with onnxruntime.

    python tools/build_extension.py                                  # every build, Python 3.11 and 3.13
    python tools/build_extension.py --platform linux-x64 --python 3.11 --output-dir dist
    python tools/build_extension.py --pin-onnxruntime                # rewrite tools/onnxruntime_pins/

A stock Blender has no onnxruntime, so each zip carries the onnxruntime wheel of its build
(BUILDS: the CPU onnxruntime on linux-x64 and in the Windows "-cuda" zip, onnxruntime-directml in
the Windows "-directml" zip for any DirectX 12 GPU, and onnxruntime, with CoreML, on macos-arm64)
and Blender installs it into the extensions' own site-packages on enable. Both Windows zips have
the same extension id: installing one replaces the other.

The lean rule: onnxruntime-gpu (OPT_IN_ONLY) is never in a zip. Its CUDA provider runs nothing
without NVIDIA's CUDA/cuDNN libraries, a separate download of over 1 GiB, so it comes with them:
the GPU runtime the artist installs from the preferences is onnxruntime-gpu plus those libraries
(gpu_requirements/), and only a process that runs models puts it on its path
(runtime/cuda/gpu_loading.activate). That keeps every zip under MAX_ZIP_BYTES (the Linux
onnxruntime-gpu wheel alone is 256 MB); the build refuses a zip over it (`--max-zip-mb`). Steps:

1. `pip download --no-deps --only-binary=:all: --require-hashes -r tools/onnxruntime_pins/<build>-cpXY.txt`
   (the version and sha256 pinned per build and Python, written by `--pin-onnxruntime` from the
   downloaded files) into the wheels folder (`./wheels/`, gitignored; `--wheels-dir` to share one
   cache). A wheel already there is checked against its pinned sha256 and not downloaded again.
2. Copy the source tree to a staging folder, link the wheels in, and write the build copy of the
   manifest there (`wheels`, `platforms`, Blender version range). The committed manifest never
   names a wheel, so a clean clone still validates.
3. Run Blender's own extension CLI (`blender_ext.py build --split-platforms`, from the installed
   `bpy` package) and `blender_ext.py validate` on each zip.

One zip set per Python rather than cp311 and cp313 wheels side by side: a both-Pythons zip
would carry a wheel no Blender loads. The Python 3.11 set says `blender_version_max = "5.1.0"` (exclusive: 4.2 to 5.0), the 3.13 set
`blender_version_min = "5.1.0"`.

Only onnxruntime is bundled, none of its declared requirements: numpy comes with Blender (an
extension must not ship it), and flatbuffers, packaging and protobuf are imported only by
`onnxruntime.tools`, `.quantization`, `.transformers` and `.backend`, never by
`import onnxruntime` or by creating and running a session (checked against 1.31.1's source;
tests/test_stock_blender.py runs the add-on in a Blender whose Python has none of them).

Prints each zip's size and top-level contents, then one JSON line: per zip its name, size,
sha256, build, platform, Python, onnxruntime and wheels (with their sha256), each validated.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# the zips' onnxruntime (linux-x64, windows-x64 -cuda) and the GPU runtime's onnxruntime-gpu: the
# version the test suite runs; bump them together (--pin-onnxruntime, then --gpu-requirements)
ORT_VERSION = "1.31.1"
PINS_DIR = Path(__file__).resolve().parent / "onnxruntime_pins"


@dataclass(frozen=True)
class Build:
    """One zip per Python: a Blender platform with one onnxruntime build."""

    name: str  # "windows-x64-directml": the pin file's and the build's name
    platform: str  # Blender's platform: linux-x64, windows-x64, macos-arm64
    distribution: str
    version: str
    pip_platform: str
    markers: tuple[str, ...]  # substrings every matching wheel file name has
    zip_suffix: str = ""  # after Blender's platform in the zip's name: "-directml"
    note: str = ""  # written into the zip's manifest as a comment, for people and `doctor`
    gpu_runtime: bool = False  # ships gpu_requirements/: onnxruntime-gpu + CUDA/cuDNN, the opt-in download


BUILDS: tuple[Build, ...] = (
    Build("linux-x64", "linux-x64", "onnxruntime", ORT_VERSION, "manylinux_2_28_x86_64", ("manylinux", "x86_64"),
          note="the CPU; NVIDIA GPUs once the GPU runtime is installed from the preferences", gpu_runtime=True),
    Build("windows-x64-cuda", "windows-x64", "onnxruntime", ORT_VERSION, "win_amd64", ("win_amd64",), "-cuda",
          note="the CPU; NVIDIA GPUs once the GPU runtime is installed from the preferences", gpu_runtime=True),
    # the newest DirectML build on the package index (no 1.25+ onnxruntime-directml wheel)
    Build("windows-x64-directml", "windows-x64", "onnxruntime-directml", "1.24.4", "win_amd64", ("win_amd64",),
          "-directml", note="any DirectX 12 GPU (AMD, Intel, NVIDIA) through DirectML, else the CPU"),
    # onnxruntime >= 1.24 ships macOS wheels for macOS 14+ only (macosx_14_0_arm64): the floor
    Build("macos-arm64", "macos-arm64", "onnxruntime", "1.32.0", "macosx_14_0_arm64", ("macosx", "arm64"),
          note="Apple silicon through CoreML; needs macOS 14 or later"),
)  # fmt: skip
BUILD_BY_NAME = {b.name: b for b in BUILDS}
PLATFORMS = tuple(dict.fromkeys(b.platform for b in BUILDS))  # Blender platforms, in BUILDS' order

# The lean rule (module docstring): distributions only the opt-in GPU runtime download brings.
OPT_IN_ONLY = ("onnxruntime-gpu",)
# extensions.blender.org's practical size for an uploaded zip; decimal MB, the stricter reading.
MAX_ZIP_BYTES = 200 * 1000 * 1000

# NVIDIA's libraries onnxruntime-gpu's CUDA provider needs, as its wheel's extras name them
# (`cuda`: nvrtc, runtime, cufft, curand; `cudnn`: nvidia-cudnn-cu13), plus what those require
# themselves: nvidia-cudnn-cu13 9.x requires nvidia-cublas (unpinned there: ~=13.0 keeps CUDA 13),
# nvidia-cufft 12.x requires nvidia-nvjitlink. Installed with --no-deps, so all of them are listed.
GPU_LIBRARIES = (
    "nvidia-cuda-runtime~=13.0",
    "nvidia-cublas~=13.0",
    "nvidia-cuda-nvrtc~=13.0",
    "nvidia-nvjitlink~=13.0",
    "nvidia-curand~=10.0",
    "nvidia-cufft~=12.0",
    "nvidia-cudnn-cu13~=9.0",
)
# `pip download --platform` matches tags exactly: every manylinux tag these wheels use is named,
# newest first (the order a glibc 2.28+ pip prefers them in).
GPU_PLATFORM_TAGS: dict[str, tuple[str, ...]] = {
    "linux-x64": ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux2014_x86_64",
                  "manylinux_2_17_x86_64", "manylinux2010_x86_64", "manylinux_2_12_x86_64",
                  "manylinux1_x86_64", "manylinux_2_5_x86_64"),
    "windows-x64": ("win_amd64",),
}  # fmt: skip
GPU_REQUIREMENTS_DIR = REPO_ROOT / "gpu_requirements"

# Blender's Python -> Blender versions running it ([min, max) as the manifest reads them).
PYTHONS: dict[str, tuple[str, str | None]] = {
    "3.11": ("4.2.0", "5.1.0"),
    "3.13": ("5.1.0", None),
}

# Top-level keys the build copy of the manifest sets; the committed values are replaced.
_BUILD_KEYS = ("blender_version_min", "blender_version_max", "platforms", "wheels")


def bpy_scripts_dir() -> Path:
    spec = importlib.util.find_spec("bpy")
    if spec is None or not spec.origin:
        raise SystemExit("bpy is not installed in this Python: pip install bpy==5.0.1 (the dev extra has it)")
    found = sorted(p for p in Path(spec.origin).parent.glob("*/scripts") if p.is_dir())
    if not found:
        raise SystemExit(f"no <version>/scripts folder next to {spec.origin}")
    return found[-1]


def extension_cli() -> Path:
    return bpy_scripts_dir() / "addons_core" / "bl_pkg" / "cli" / "blender_ext.py"


def valid_tags_file() -> Path:
    return bpy_scripts_dir() / "modules" / "_bpy_internal" / "extensions" / "tags.py"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pin_path(build: Build, python: str) -> Path:
    return PINS_DIR / f"{build.name}-cp{python.replace('.', '')}.txt"


def read_pin(build: Build, python: str) -> tuple[str, str]:
    """(wheel file name, sha256) that tools/onnxruntime_pins/ pins for the build and Python."""
    path = pin_path(build, python)
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run tools/build_extension.py --pin-onnxruntime first")
    for line in path.read_text().splitlines():
        match = re.match(r"^(\S+)==(\S+) --hash=sha256:([0-9a-f]{64})\s+# size: \d+ (\S+\.whl)", line)
        if match:
            if (match.group(1), match.group(2)) != (build.distribution, build.version):
                raise SystemExit(f"{path} pins {match.group(1)}=={match.group(2)}, the build {build.name} "
                                 f"wants {build.distribution}=={build.version}: run --pin-onnxruntime")
            return match.group(4), match.group(3)
    raise SystemExit(f"{path} holds no pinned wheel line")


def _pip_download(build: Build, python: str, dest: Path, requirement: list[str]) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp", "--platform", build.pip_platform,
        "--dest", str(dest), "--progress-bar", "off", *requirement,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True)


def ensure_wheel(wheels_dir: Path, build: Build, python: str, log=print) -> Path:
    """The pinned onnxruntime wheel of (build, python) in wheels_dir, downloaded only when absent,
    its sha256 checked against the pin either way."""
    name, digest = read_pin(build, python)
    path = wheels_dir / name
    if not path.is_file():
        wheels_dir.mkdir(parents=True, exist_ok=True)
        proc = _pip_download(build, python, wheels_dir, ["--require-hashes", "-r", str(pin_path(build, python))])
        if proc.returncode != 0 or not path.is_file():
            raise SystemExit(
                f"pip download of {name} for {build.name} / Python {python} failed"
                f" (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        log(f"  fetched  {name}")
    else:
        log(f"  have     {name}")
    if sha256_of(path) != digest:
        raise SystemExit(f"{path} does not match its pinned sha256 {digest}: delete it and build again")
    return path


def write_onnxruntime_pins(builds: list[Build], pythons: list[str], wheels_dir: Path, log=print) -> list[dict]:
    """Download each build's onnxruntime wheel (no hash yet) and write its pin file from the file
    itself: `name==version --hash=sha256:... # size: N file`."""
    PINS_DIR.mkdir(parents=True, exist_ok=True)
    written = []
    for build in builds:
        for python in pythons:
            proc = _pip_download(build, python, wheels_dir, [f"{build.distribution}=={build.version}"])
            cp = "cp" + python.replace(".", "")
            prefix = f"{build.distribution.replace('-', '_')}-{build.version}-{cp}-{cp}-"
            found = [w for w in sorted(wheels_dir.glob(prefix + "*.whl")) if all(m in w.name for m in build.markers)]
            if proc.returncode != 0 or len(found) != 1:
                raise SystemExit(f"pip download for {build.name} / Python {python} failed or is ambiguous"
                                 f" ({[w.name for w in found]}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            wheel = found[0]
            text = (
                f"# onnxruntime for the {build.name} zip, Python {python}: {build.note}.\n"
                "# Written by tools/build_extension.py --pin-onnxruntime from the downloaded wheel. Do not edit by hand.\n"
                f"{build.distribution}=={build.version} --hash=sha256:{sha256_of(wheel)}"
                f"  # size: {wheel.stat().st_size} {wheel.name}\n"
            )
            pin_path(build, python).write_text(text)
            log(f"  pinned   {wheel.name}")
            written.append({"build": build.name, "python": python, "wheel": wheel.name, "size": wheel.stat().st_size})
    return written


_SAVED = re.compile(r"^(?:Saved|File was already downloaded)\s+(.+\.whl)\s*$")


def gpu_requirements_name(platform: str, python: str) -> str:
    return f"{platform}-cp{python.replace('.', '')}.txt"


def gpu_runtime_requirements(ort_version: str = ORT_VERSION) -> tuple[str, ...]:
    """What the opt-in GPU runtime download holds: onnxruntime-gpu itself (the lean rule keeps it
    out of the zips), then the NVIDIA libraries its CUDA provider loads."""
    return (f"onnxruntime-gpu=={ort_version}", *GPU_LIBRARIES)


def download_gpu_wheels(wheels_dir: Path, platform: str, python: str, log=print, ort_version: str = ORT_VERSION) -> list[Path]:
    """`pip download --no-deps --only-binary=:all:` of gpu_runtime_requirements() for (platform,
    python) into wheels_dir/gpu-<platform>; pip skips a file already there. Returns the wheels pip chose."""
    dest = wheels_dir / f"gpu-{platform}"
    dest.mkdir(parents=True, exist_ok=True)
    platform_args = [arg for tag in GPU_PLATFORM_TAGS[platform] for arg in ("--platform", tag)]
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp", *platform_args,
        "--dest", str(dest), "--progress-bar", "off", *gpu_runtime_requirements(ort_version),
    ]  # fmt: skip
    wanted = len(gpu_runtime_requirements(ort_version))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    saved = []
    for line in proc.stdout.splitlines():
        match = _SAVED.match(line.strip())
        if match:
            path = Path(match.group(1))
            saved.append(path if path.is_absolute() else (dest / path.name))
    if proc.returncode != 0 or len(saved) != wanted:
        raise SystemExit(
            f"pip download of the GPU libraries for {platform} / Python {python} failed (exit"
            f" {proc.returncode}, {len(saved)} of {wanted} wheels):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    for path in saved:
        log(f"  gpu      {path.name} ({path.stat().st_size / 2**20:.1f} MiB)")
    return saved


def gpu_requirements_text(wheels: list[Path], platform: str, python: str, ort_version: str) -> str:
    """The requirements file: one `name==version --hash=sha256:... # size: N` line per wheel, the
    hash and size computed from the downloaded file itself."""
    total = sum(w.stat().st_size for w in wheels)
    lines = [
        f"# The GPU runtime for {platform}, Python {python}: onnxruntime-gpu {ort_version} and the NVIDIA"
        " CUDA 13 / cuDNN 9 libraries it needs.",
        "# Written by tools/build_extension.py --gpu-requirements from the downloaded wheels; installed by",
        "# runtime/cuda/gpu_libraries.py with pip --require-hashes --no-deps. Do not edit by hand.",
        f"# total size: {total}",
    ]
    for wheel in wheels:
        dist, version = wheel.name.split("-")[:2]
        name = dist.replace("_", "-").lower()
        lines.append(f"{name}=={version} --hash=sha256:{sha256_of(wheel)}  # size: {wheel.stat().st_size} {wheel.name}")
    return "\n".join(lines) + "\n"


def write_gpu_requirements(
    platforms: list[str], pythons: list[str], wheels_dir: Path, out_dir: Path = GPU_REQUIREMENTS_DIR,
    ort_version: str = ORT_VERSION, log=print,
) -> list[dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for platform in platforms:
        if platform not in GPU_PLATFORM_TAGS:
            continue  # no CUDA build of onnxruntime there (macOS)
        for python in pythons:
            log(f"GPU libraries for {platform} / Python {python}:")
            wheels = download_gpu_wheels(wheels_dir, platform, python, log, ort_version)
            path = out_dir / gpu_requirements_name(platform, python)
            path.write_text(gpu_requirements_text(wheels, platform, python, ort_version))
            size = sum(w.stat().st_size for w in wheels)
            log(f"  wrote    {path} ({len(wheels)} wheels, {size / 2**20:.1f} MiB to download)")
            written.append({"path": str(path), "platform": platform, "python": python, "download_bytes": size})
    return written


def build_manifest_text(text: str, *, wheels: list[str], platforms: list[str], python: str, note: str = "") -> str:
    """The committed manifest with the build keys set (top-level keys go before the first table);
    ``note`` (which onnxruntime, for which GPUs) as a comment."""
    lines = [ln for ln in text.splitlines() if not re.match(rf"^({'|'.join(_BUILD_KEYS)})\s*=", ln)]
    first_table = next(i for i, ln in enumerate(lines) if ln.startswith("["))
    version_min, version_max = PYTHONS[python]
    added = [f"# Written by tools/build_extension.py for Python {python}." + (f" onnxruntime: {note}." if note else "")]
    added.append(f'blender_version_min = "{version_min}"')
    if version_max:
        added.append(f'blender_version_max = "{version_max}"')
    added.append("platforms = [" + ", ".join(json.dumps(p) for p in platforms) + "]")
    added.append("wheels = [" + "".join(f'\n  "./wheels/{w}",' for w in wheels) + "\n]")
    added.append("")
    return "\n".join(lines[:first_table] + added + lines[first_table:]) + "\n"


_STAGE_IGNORE = {
    ".git", ".venv", "venv", "wheels", "dist", "build", "out", ".pytest_cache", ".ruff_cache",
    "gpu_requirements",  # only the zip's own platform and Python file is copied in (below)
}  # fmt: skip


def stage_source(stage: Path, wheel_files: list[Path], manifest_text: str, gpu_requirements: list[Path] = ()) -> None:
    """A copy of the add-on's source; the manifest's [build] patterns still decide what ships."""

    def ignore(folder, names):
        top = Path(folder).resolve() == REPO_ROOT
        return [n for n in names if n == "__pycache__" or (top and (n in _STAGE_IGNORE or n.endswith(".zip")))]

    shutil.copytree(REPO_ROOT, stage, ignore=ignore, symlinks=False)
    (stage / "wheels").mkdir()
    for wheel in wheel_files:
        target = stage / "wheels" / wheel.name
        try:
            os.link(wheel, target)  # 256 MB wheels: a hard link where the file system allows one
        except OSError:
            shutil.copy2(wheel, target)
    (stage / "blender_manifest.toml").write_text(manifest_text)
    if gpu_requirements:
        (stage / "gpu_requirements").mkdir()
        for path in gpu_requirements:
            shutil.copy2(path, stage / "gpu_requirements" / path.name)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(extension_cli()), *args], capture_output=True, text=True)


def select_builds(platforms: list[str] | None = None, names: list[str] | None = None) -> list[Build]:
    """The builds of the given Blender platforms and/or build names (all when neither is given)."""
    if not platforms and not names:
        return list(BUILDS)
    return [b for b in BUILDS if b.platform in (platforms or ()) or b.name in (names or ())]


def check_lean(item: Build) -> None:
    """Refuse a build whose zip would carry what the lean rule leaves to the GPU runtime download."""
    if item.distribution in OPT_IN_ONLY:
        raise SystemExit(f"the build {item.name} bundles {item.distribution}, which only the opt-in GPU runtime "
                         "download may bring (OPT_IN_ONLY): bundle onnxruntime and set gpu_runtime=True")


def check_zip_size(path: Path, max_bytes: int = MAX_ZIP_BYTES) -> None:
    """Delete a zip over max_bytes and stop with one line: dist/ never holds a zip the extensions
    site would refuse."""
    size = path.stat().st_size
    if size > max_bytes:
        path.unlink()
        raise SystemExit(f"{path.name} is {size / 1e6:.1f} MB, over the {max_bytes / 1e6:.0f} MB limit "
                         "(extensions.blender.org's practical size), so it was deleted: move the large wheel to "
                         "the GPU runtime download (OPT_IN_ONLY) or raise --max-zip-mb")


def manifest_for(manifest: str, item: Build, python: str, wheel_name: str) -> str:
    """The build copy of the manifest for one zip (the build writes exactly this into it)."""
    note = f"{item.distribution} {item.version}, {item.note}"
    return build_manifest_text(manifest, wheels=[wheel_name], platforms=[item.platform], python=python, note=note)


def build(
    builds: list[Build], pythons: list[str], output_dir: Path, wheels_dir: Path, log=print,
    max_bytes: int = MAX_ZIP_BYTES,
) -> list[dict]:  # fmt: skip
    for item in builds:
        check_lean(item)
    output_dir.mkdir(parents=True, exist_ok=True)
    manifest = (REPO_ROOT / "blender_manifest.toml").read_text()
    ext_id = re.search(r'^id\s*=\s*"([^"]+)"', manifest, re.M).group(1)
    ext_version = re.search(r'^version\s*=\s*"([^"]+)"', manifest, re.M).group(1)
    results = []
    for python in pythons:
        log(f"Python {python} (Blender {PYTHONS[python][0]} to {PYTHONS[python][1] or 'newer'}):")
        out_base = output_dir / f"{ext_id}-{ext_version}-py{python.replace('.', '')}.zip"
        # One build per zip (not one split build for all): Blender's split filters only wheels,
        # and each zip carries only its own GPU requirements file.
        for item in builds:
            wheel = ensure_wheel(wheels_dir, item, python, log)
            gpu_file = GPU_REQUIREMENTS_DIR / gpu_requirements_name(item.platform, python)
            gpu_files = []
            if item.gpu_runtime:  # onnxruntime-gpu and its CUDA libraries, downloaded on request
                if not gpu_file.is_file():
                    raise SystemExit(f"{gpu_file} is missing: run tools/build_extension.py --gpu-requirements first")
                gpu_files = [gpu_file]
            text = manifest_for(manifest, item, python, wheel.name)
            # Blender appends the platform: <id>-<version>-pyXY-windows_x64.zip; the build's suffix follows
            written = out_base.with_name(f"{out_base.stem}-{item.platform.replace('-', '_')}.zip")
            path = written.with_name(f"{written.stem}{item.zip_suffix}.zip")
            with tempfile.TemporaryDirectory(prefix="lean_image_ai_build_") as tmp:
                stage = Path(tmp) / "src"
                stage_source(stage, [wheel], text, gpu_files)
                written.unlink(missing_ok=True)
                proc = run_cli(
                    "build", "--source-dir", str(stage), "--output-filepath", str(out_base),
                    "--split-platforms", "--valid-tags", str(valid_tags_file()),
                )  # fmt: skip
                if proc.returncode != 0 or not written.is_file():
                    raise SystemExit(f"blender_ext build did not write {written}:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
                if path != written:
                    written.replace(path)
            check_zip_size(path, max_bytes)
            results.append(_validated(path, item, python, wheel, gpu_files, log))
    return results


def _validated(path: Path, item: Build, python: str, wheel: Path, gpu_files: list[Path], log) -> dict:
    """Blender's own validator on the zip, then what it holds: exactly its wheel and GPU file."""
    check = run_cli("validate", str(path), "--valid-tags", str(valid_tags_file()))
    if check.returncode != 0:
        raise SystemExit(f"blender_ext validate rejected {path.name}:\n{check.stdout}{check.stderr}")
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
    zipped_wheels = sorted(Path(n).name for n in names if n.endswith(".whl"))
    if zipped_wheels != [wheel.name]:
        raise SystemExit(f"{path.name} holds wheels {zipped_wheels}, expected {wheel.name}")
    zipped_gpu = sorted(n for n in names if n.startswith("gpu_requirements/") and n.endswith(".txt"))
    if zipped_gpu != [f"gpu_requirements/{p.name}" for p in gpu_files]:
        raise SystemExit(f"{path.name} holds GPU requirements {zipped_gpu}, expected {gpu_files}")
    top = sorted({n.split("/", 1)[0] + ("/" if "/" in n else "") for n in names})
    size = path.stat().st_size
    log(f"{path.name}: {size / 2**20:.1f} MiB, {len(names)} files; top level: {' '.join(top)}")
    return {
        "name": path.name, "path": str(path), "size": size, "sha256": sha256_of(path), "build": item.name,
        "platform": item.platform, "python": python, "onnxruntime": f"{item.distribution}=={item.version}",
        "blender_version_min": PYTHONS[python][0], "blender_version_max": PYTHONS[python][1],
        "wheels": [{"name": wheel.name, "sha256": sha256_of(wheel)}],
        "gpu_requirements": [p.name for p in gpu_files], "validated": True,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", action="append", choices=PLATFORMS, help="every build of a platform; default: all")
    parser.add_argument("--build", action="append", choices=sorted(BUILD_BY_NAME), help="one build; default: all")
    parser.add_argument("--python", action="append", choices=sorted(PYTHONS), help="default: all")
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / "dist")
    parser.add_argument("--wheels-dir", type=Path, default=REPO_ROOT / "wheels")
    parser.add_argument(
        "--max-zip-mb", type=float, default=MAX_ZIP_BYTES / 1e6,
        help="fail (and delete the zip) when a zip is larger; default: extensions.blender.org's 200 MB",
    )  # fmt: skip
    parser.add_argument(
        "--gpu-requirements", action="store_true",
        help="download NVIDIA's CUDA/cuDNN wheels and (re)write gpu_requirements/<platform>-cpXY.txt"
        " from them (committed files; the zips ship them), then stop",
    )  # fmt: skip
    parser.add_argument(
        "--pin-onnxruntime", action="store_true",
        help="download each build's onnxruntime wheel and (re)write tools/onnxruntime_pins/ from them, then stop",
    )  # fmt: skip
    args = parser.parse_args(argv)
    pythons = args.python or list(PYTHONS)
    if args.gpu_requirements:
        written = write_gpu_requirements(
            args.platform or list(GPU_PLATFORM_TAGS), pythons, args.wheels_dir.resolve(), ort_version=ORT_VERSION
        )
        print(json.dumps({"gpu_requirements": written}))
        return 0
    builds = select_builds(args.platform, args.build)
    if args.pin_onnxruntime:
        print(json.dumps({"onnxruntime_pins": write_onnxruntime_pins(builds, pythons, args.wheels_dir.resolve())}))
        return 0
    max_bytes = int(args.max_zip_mb * 1e6)
    results = build(builds, pythons, args.output_dir.resolve(), args.wheels_dir.resolve(), max_bytes=max_bytes)
    print(json.dumps({"zips": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
