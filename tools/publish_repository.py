"""Publish built extension zips as a static Blender extension repository (a folder to host).

    python tools/publish_repository.py --repo-dir public/ dist/*.zip          # add, replace, index
    python tools/publish_repository.py --repo-dir public/ --html dist/*.zip   # also index.html

Blender installs and updates extensions from a *remote repository*: a URL whose ``index.json``
lists each zip with its manifest, size and sha256 (schema v1). Any static file host serves one
(a web server, a bucket, a shared drive as ``file://``); artists add its URL once in Preferences >
Get Extensions > Repositories and then see updates there. What artists install from is never
left worse than it was: every step that can fail comes before the folder changes.

1. Read ``blender_manifest.toml`` from each zip (bounded; refused if it has none, or a field
   Blender requires is missing or of the wrong type), and plan: one version per build (same id,
   platforms and Blender range), so the older zips of a build are to go; publishing an older
   version over a newer one, or two zips of one name or one build in one call, is refused.
2. Build the repository to be in a hidden folder inside it: the new zips copied in with the
   add-on's own writer (a new, private temporary file, never through a link), the kept ones linked,
   and its ``index.json`` written there by Blender's own generator (``blender_ext.py
   server-generate``, run on plain Python from the installed ``bpy`` package), then checked to list
   every zip.
3. Only then change the folder: the new zips renamed in, the index swapped in by one rename, the
   older builds removed last.

Prints one JSON line: the repository folder, the index, and per zip its id, version and platforms.
Errors are one line: exit 2 for arguments that contradict each other, 1 for anything else.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_extension import extension_cli  # noqa: E402 (one place that finds Blender's CLI)


def _addon_writer():
    """The add-on's one writer (models/files.py: all or nothing, never through a link), loaded by
    its path: it needs only the standard library, and importing the package would load every
    model family (numpy and all) into a tool that only copies files."""
    path = Path(__file__).resolve().parents[1] / "models" / "files.py"
    spec = importlib.util.spec_from_file_location("lean_image_ai_files", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


files = _addon_writer()

MANIFEST = "blender_manifest.toml"
# a manifest is a few hundred bytes; one that inflates past this is not read (a zip bomb's would
# take the memory of the machine that publishes)
MAX_MANIFEST_BYTES = 1 << 20
STAGING_PREFIX = ".publishing-"  # hidden: Blender's generator skips names starting with "."
INDEX_FILES = ("index.json", "index.html")
EXIT_FAILED = 1
EXIT_USAGE = 2
# what Blender's generator requires of a manifest (blender_ext.py pkg_manifest_known_keys_and_types),
# checked here before anything is copied: field -> its type
REQUIRED = {
    "schema_version": str, "id": str, "name": str, "tagline": str, "version": str, "type": str,
    "maintainer": str, "license": list, "blender_version_min": str,
}
OPTIONAL = {
    "blender_version_max": str, "website": str, "copyright": list, "permissions": (dict, list),
    "tags": list, "platforms": list, "wheels": list,
}
# Blender's semantic version (blender_ext.py RE_MANIFEST_SEMVER)
SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)


class PublishError(Exception):
    """A zip or folder that cannot be published: one line saying what and what to do."""

    exit_code = EXIT_FAILED


class UsageError(PublishError):
    """The arguments contradict each other (two zips of one name or one build)."""

    exit_code = EXIT_USAGE


def _manifest_text(archive: zipfile.ZipFile, zip_path: Path) -> str:
    names = [n for n in archive.namelist() if n == MANIFEST or n.endswith("/" + MANIFEST)]
    if not names:
        raise PublishError(f"{zip_path}: no {MANIFEST} inside; give a zip built by tools/build_extension.py.")
    with archive.open(min(names, key=len)) as member:  # read bounded: the header's size may lie
        data = member.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise PublishError(f"{zip_path}: its {MANIFEST} is larger than {MAX_MANIFEST_BYTES >> 20} MiB; "
                           "no manifest is: give a zip built by tools/build_extension.py.")
    return data.decode("utf-8")


def read_manifest(zip_path: Path) -> dict:
    """The manifest of an extension zip (at its top level or in its single top folder), with the
    fields Blender requires of the types it requires."""
    try:
        with zipfile.ZipFile(zip_path) as archive:
            manifest = tomllib.loads(_manifest_text(archive, zip_path))
    except (zipfile.BadZipFile, OSError, EOFError, tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise PublishError(f"{zip_path}: not a readable extension zip ({exc}).") from None
    _check_fields(zip_path, manifest)
    return manifest


def _check_fields(zip_path: Path, manifest: dict) -> None:
    missing = [name for name in REQUIRED if name not in manifest]
    if missing:
        raise PublishError(f"{zip_path}: its {MANIFEST} has no {', '.join(missing)}; Blender requires them.")
    for name, kind in {**REQUIRED, **OPTIONAL}.items():
        value = manifest.get(name)
        if value is None:
            continue
        if not isinstance(value, kind) or (isinstance(value, list) and name != "permissions" and
                                           not all(isinstance(item, str) for item in value)):
            wants = "a list of text" if kind is list else "text" if kind is str else "a table or a list"
            raise PublishError(f"{zip_path}: its {MANIFEST} has {name} = {_shown(value)}; Blender requires {wants}.")
    if not manifest["id"].isidentifier():
        raise PublishError(f"{zip_path}: its {MANIFEST} has id = {manifest['id']!r}; Blender requires a Python name.")
    if SEMVER.fullmatch(manifest["version"]) is None:
        raise PublishError(f"{zip_path}: its {MANIFEST} has version = {manifest['version']!r}; Blender requires "
                           "a semantic version such as 1.2.0.")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def version_key(text: str) -> tuple:
    """Semantic-version precedence: a release after its pre-releases, build metadata ignored
    (1.2.0 and 1.2.0+build.5 are one version), numeric identifiers before words."""
    match = SEMVER.fullmatch(text)
    if match is None:
        raise PublishError(f"version {text!r} is not a semantic version such as 1.2.0.")
    core = tuple(int(part) for part in match.group(1, 2, 3))
    if match.group(4) is None:
        return (*core, (1,))
    identifiers = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in match.group(4).split("."))
    return (*core, (0, identifiers))


def build_key(manifest: dict) -> tuple:
    """What makes two zips of one extension the same build (one replaces the other)."""
    return (
        manifest["id"],
        tuple(sorted(manifest.get("platforms") or ())),
        manifest.get("blender_version_min", ""),
        manifest.get("blender_version_max", ""),
    )


def published(repo_dir: Path) -> dict[Path, dict]:
    return {path: read_manifest(path) for path in sorted(repo_dir.glob("*.zip")) if not path.name.startswith(".")}


@dataclass
class Plan:
    """What the folder is to hold: the new zips, the published ones kept, those to go."""

    new: list[tuple[Path, dict]] = field(default_factory=list)
    keep: list[Path] = field(default_factory=list)
    remove: list[Path] = field(default_factory=list)


def _given(zips: list[Path]) -> list[tuple[Path, dict]]:
    """Every zip read (none copied yet); two of one name or one build in one call refused."""
    given = [(path, read_manifest(path)) for path in zips]
    names: dict[str, Path] = {}
    builds: dict[tuple, Path] = {}
    for path, manifest in given:
        other = names.setdefault(path.name, path)
        if other != path and not os.path.samefile(other, path):
            raise UsageError(f"{other} and {path} are both named {path.name}; a repository holds one file per name: "
                             "rename one (tools/build_extension.py names zips by id, version and platform).")
        earlier = builds.setdefault(build_key(manifest), path)
        if earlier.name != path.name:
            raise UsageError(f"{earlier.name} and {path.name} are the same build of {manifest['id']} "
                             "(one replaces the other); give only the one to publish.")
    return [(path, manifest) for path, manifest in given if names[path.name] is path]


def plan(repo_dir: Path, zips: list[Path]) -> Plan:
    result = Plan(new=_given(zips))
    incoming = {path.name: manifest for path, manifest in result.new}
    by_build = {build_key(manifest): (path, manifest) for path, manifest in result.new}
    for path, other in published(repo_dir).items():
        if path.name in incoming:
            continue  # replaced by the new file of that name
        newer = by_build.get(build_key(other))
        if newer is None:
            result.keep.append(path)
        elif version_key(other["version"]) > version_key(newer[1]["version"]):
            raise PublishError(
                f"{newer[0].name}: the repository already has the newer {path.name} ({other['version']}); "
                "remove it first to publish an older version."
            )
        else:
            result.remove.append(path)
    return result


def copy_into(source: Path, target: Path) -> None:
    """``source`` as ``target``, all or nothing, with the add-on's writer: its temporary file is
    new and private, and it is written through a descriptor that never follows a link."""
    with files.atomic_path(target) as tmp, open(source, "rb") as reader:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))
        with os.fdopen(fd, "wb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)


def generate_index(folder: Path, *, html: bool = False) -> Path:
    """``index.json`` (and ``index.html``) of ``folder`` by Blender's own generator, checked to
    list every zip there; returns the index path."""
    args = [sys.executable, str(extension_cli()), "server-generate", "--repo-dir", str(folder)]
    proc = subprocess.run(args + (["--html"] if html else []), capture_output=True, text=True, timeout=300)
    index = folder / "index.json"
    said = " ".join((proc.stderr or proc.stdout).split())
    if proc.returncode != 0 or not index.is_file():
        raise PublishError(f"Blender's server-generate failed, nothing was published: {said}")
    # the index names each zip as a URL ("./my%20addon.zip"): compared as the file name it stands for
    listed = {unquote(item.get("archive_url", "").rpartition("/")[2]) for item in json.loads(index.read_text("utf-8"))["data"]}
    missing = sorted(path.name for path in folder.glob("*.zip") if path.name not in listed)
    if missing:
        said = " ".join((proc.stdout + proc.stderr).split())
        raise PublishError(f"Blender's generator leaves out {', '.join(missing)}, nothing was published: {said}")
    return index


def _stage(staging: Path, todo: Plan, *, html: bool) -> None:
    """The repository to be, in ``staging``: new zips copied, kept ones linked, its index made."""
    for path in todo.keep:
        try:
            os.link(path, staging / path.name)
        except OSError:  # a file system without hard links: a copy reads the same
            copy_into(path, staging / path.name)
    for path, _ in todo.new:
        copy_into(path, staging / path.name)
    generate_index(staging, html=html)


def _swap_in(staging: Path, repo_dir: Path, todo: Plan, *, html: bool) -> None:
    """The checked repository moved in: zips first (an index never names a missing one), the
    index by one rename, the older builds last."""
    for path, _ in todo.new:
        os.replace(staging / path.name, repo_dir / path.name)
    for name in INDEX_FILES if html else INDEX_FILES[:1]:
        files.replace_into(staging / name, repo_dir / name)
    for path in todo.remove:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _not_a_file(repo_dir: Path) -> None:
    if repo_dir.exists() and not repo_dir.is_dir():
        raise PublishError(f"--repo-dir {repo_dir} is a file; give a folder (made if missing).")


def _repo_folder(repo_dir: Path) -> None:
    try:
        repo_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PublishError(f"--repo-dir {repo_dir} cannot be made ({exc.strerror}); give a folder you can write.") from None
    if not os.access(repo_dir, os.W_OK | os.X_OK):
        raise PublishError(f"--repo-dir {repo_dir} is not writable by you; give a folder you can write.")


def publish(repo_dir: Path, zips: list[Path], *, html: bool = False) -> dict:
    _not_a_file(repo_dir)
    todo = plan(repo_dir, zips)  # every zip read and checked before the folder is made or touched
    _repo_folder(repo_dir)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=repo_dir))
    try:
        _stage(staging, todo, html=html)
        _swap_in(staging, repo_dir, todo, html=html)
    except OSError as exc:
        what = exc.strerror or str(exc)
        raise PublishError(f"publishing into {repo_dir} failed ({what}); its index.json and zips are as they were.") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {
        "repo_dir": str(repo_dir),
        "index": str(repo_dir / "index.json"),
        "url": repo_dir.resolve().as_uri() + "/index.json",
        "published": [
            {"zip": path.name, "id": m["id"], "version": m["version"], "platforms": m.get("platforms", [])}
            for path, m in todo.new
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
        return exc.exit_code
    except OSError as exc:  # reading a zip or the folder (the publishing itself says what it kept)
        print(f"error: {exc.filename or args.repo_dir}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
