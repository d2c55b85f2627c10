"""Publish built extension zips as a static Blender extension repository (a folder to host).

    python tools/publish_repository.py --repo-dir public/ dist/*.zip          # add, replace, index
    python tools/publish_repository.py --repo-dir public/ --html dist/*.zip   # also index.html

Blender installs and updates extensions from a *remote repository*: a URL whose ``index.json``
lists each zip with its manifest, size and sha256 (schema v1). Any static file host serves one
(a web server, a bucket, a shared drive as ``file://``); artists add its URL once in Preferences >
Get Extensions > Repositories and then see updates there. Steps:

1. Read ``blender_manifest.toml`` from each zip (refused if it has none, or no id/version).
2. Copy each zip into the folder (through a temporary name, so a host never serves half a file)
   and remove the older zips of the same extension *and the same build* (same platforms and
   Blender range): one version per build, so Blender offers the new one as the update.
3. Write ``index.json`` with Blender's own generator (``blender_ext.py server-generate``, the
   code behind ``blender --command extension server-generate``; it runs on plain Python, taken
   from the installed ``bpy`` package) and check that it lists every published zip.

Prints one JSON line: the repository folder, the index, and per zip its id, version and platforms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_extension import extension_cli  # noqa: E402 (one place that finds Blender's CLI)

MANIFEST = "blender_manifest.toml"


class PublishError(Exception):
    """A zip or folder that cannot be published: one line saying what and what to do."""


def read_manifest(zip_path: Path) -> dict:
    """The manifest of an extension zip (at its top level or in its single top folder)."""
    try:
        with zipfile.ZipFile(zip_path) as archive:
            names = [n for n in archive.namelist() if n == MANIFEST or n.endswith("/" + MANIFEST)]
            if not names:
                raise PublishError(f"{zip_path}: no {MANIFEST} inside; give a zip built by tools/build_extension.py.")
            manifest = tomllib.loads(archive.read(min(names, key=len)).decode("utf-8"))
    except (zipfile.BadZipFile, OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PublishError(f"{zip_path}: not a readable extension zip ({exc}).") from None
    if not manifest.get("id") or not manifest.get("version"):
        raise PublishError(f"{zip_path}: its {MANIFEST} has no id or version.")
    return manifest


def build_key(manifest: dict) -> tuple:
    """What makes two zips of one extension the same build (one replaces the other)."""
    return (
        manifest["id"],
        tuple(sorted(manifest.get("platforms") or ())),
        manifest.get("blender_version_min", ""),
        manifest.get("blender_version_max", ""),
    )


def _version(text: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in str(text).replace("-", ".").split("."))


def published(repo_dir: Path) -> dict[Path, dict]:
    return {path: read_manifest(path) for path in sorted(repo_dir.glob("*.zip"))}


def add_zip(repo_dir: Path, zip_path: Path) -> dict:
    """Copy ``zip_path`` in and remove the older zips of its build; returns its manifest."""
    manifest = read_manifest(zip_path)
    target = repo_dir / zip_path.name
    for path, other in published(repo_dir).items():
        if path != target and build_key(other) == build_key(manifest):
            if _version(other["version"]) > _version(manifest["version"]):
                raise PublishError(
                    f"{zip_path.name}: the repository already has the newer {path.name} ({other['version']}); "
                    "remove it first to publish an older version."
                )
            path.unlink()
    partial = repo_dir / f".{zip_path.name}.partial"
    shutil.copyfile(zip_path, partial)
    os.replace(partial, target)
    return manifest


def generate_index(repo_dir: Path, *, html: bool = False) -> Path:
    """``index.json`` (and ``index.html``) by Blender's own generator; returns the index path."""
    args = [sys.executable, str(extension_cli()), "server-generate", "--repo-dir", str(repo_dir)]
    proc = subprocess.run(args + (["--html"] if html else []), capture_output=True, text=True, timeout=300)
    index = repo_dir / "index.json"
    if proc.returncode != 0 or not index.is_file():
        raise PublishError(f"Blender's server-generate failed on {repo_dir}: {(proc.stderr or proc.stdout).strip()}")
    listed = {Path(item.get("archive_url", "")).name for item in json.loads(index.read_text("utf-8"))["data"]}
    missing = sorted(path.name for path in repo_dir.glob("*.zip") if path.name not in listed)
    if missing:
        raise PublishError(f"index.json leaves out {', '.join(missing)}: {(proc.stdout + proc.stderr).strip()}")
    return index


def publish(repo_dir: Path, zips: list[Path], *, html: bool = False) -> dict:
    repo_dir.mkdir(parents=True, exist_ok=True)
    manifests = [read_manifest(path) for path in zips]  # every zip checked before any is copied
    for path in zips:
        add_zip(repo_dir, path)
    index = generate_index(repo_dir, html=html)
    return {
        "repo_dir": str(repo_dir),
        "index": str(index),
        "url": repo_dir.resolve().as_uri() + "/index.json",
        "published": [
            {"zip": path.name, "id": m["id"], "version": m["version"], "platforms": m.get("platforms", [])}
            for path, m in zip(zips, manifests, strict=True)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("zips", nargs="*", type=Path, help="built zips (dist/*.zip); none: just regenerate the index")
    parser.add_argument("--repo-dir", type=Path, required=True, help="the folder to host (made if missing)")
    parser.add_argument("--html", action="store_true", help="also write index.html for browsing")
    args = parser.parse_args(argv)
    try:
        result = publish(args.repo_dir, args.zips, html=args.html)
    except PublishError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
