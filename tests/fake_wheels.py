"""Tiny real wheels laid out like NVIDIA's (nvidia/<pkg>/lib/<library>), for GPU-runtime installs
through the real pip with ``--no-index --find-links``; no network.

    wheel = build_wheel(folder, "nvidia-fake-lib", "1.0", {"nvidia/fake/lib/libfake.so.1": b"..."})
    write_requirements(path, [wheel])     # name==version --hash=sha256:<real> # size: <real>
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A py3-none-any wheel with correct METADATA, WHEEL and RECORD (pip verifies RECORD's form)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    contents = dict(files)
    contents[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    contents[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: lean_image_ai tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{path},{_record_hash(data)},{len(data)}" for path, data in contents.items()]
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in contents.items():
            zf.writestr(member, data)
    return path


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_requirements(path: Path, wheels: list[Path], *, digests: dict[str, str] | None = None) -> Path:
    """A requirements file in the format tools/build_extension.py writes (`digests` overrides by name)."""
    lines = ["# test requirements"]
    for wheel in wheels:
        dist, version = wheel.name.split("-")[:2]
        name = dist.replace("_", "-")
        digest = (digests or {}).get(name, sha256_file(wheel))
        lines.append(f"{name}=={version} --hash=sha256:{digest}  # size: {wheel.stat().st_size}")
    path.write_text("\n".join(lines) + "\n")
    return path
