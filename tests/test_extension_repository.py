"""tools/publish_repository.py: the built zip published as a static extension repository, which a
clean bpy 5.0.1 installs from (a ``file://`` remote repository, as a studio share would be) and
then offers the update from when a higher version is published there. Blender's own extension
code does the installing (bl_pkg's ``extension`` command: repo-add, install --sync, list, update),
in subprocesses whose user folders are the test's own; the blender.org repository is switched
off first, so nothing leaves the machine."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

pytest.importorskip("bpy")
TOOL = bh.REPO_ROOT / "tools" / "publish_repository.py"
EXT_ID = "lean_image_ai"

CLIENT = r"""
import json, re, sys, tomllib
from pathlib import Path
import bpy

step, url = sys.argv[1], sys.argv[2]
if step != "install":
    bpy.ops.wm.read_userpref()  # the repository added by the install step
prefs = bpy.context.preferences
prefs.system.use_online_access = True  # Blender asks it for any remote repository, file:// too
for repo in prefs.extensions.repos:
    if repo.module == "blender_org":
        repo.enabled = False  # this test talks to its own folder only
from bl_pkg import bl_extension_cli as cli

out = {}
if step == "install":
    out["repo_add"] = cli.cli_extension_handler(["repo-add", "--name", "Studio", "--url", url, "studio"])
    out["install"] = cli.cli_extension_handler(["install", "--sync", "--enable", "studio.lean_image_ai"])
    bpy.ops.wm.save_userpref()
elif step == "list":
    out["list"] = cli.cli_extension_handler(["list", "--sync"])
else:
    out["update"] = cli.cli_extension_handler(["update", "--sync"])
root = Path(bpy.utils.user_resource("EXTENSIONS")) / "studio" / "lean_image_ai"
manifest = root / "blender_manifest.toml"
out["installed_dir"] = str(root)
out["installed_version"] = tomllib.loads(manifest.read_text())["version"] if manifest.is_file() else None
print("RESULT " + json.dumps(out))
"""


def build_zip(source: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    proc = bh.run_extension_cli("build", "--source-dir", str(source), "--output-dir", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (zip_path,) = out.glob("*.zip")
    return zip_path


def with_version(zip_path: Path, version: str, work: Path) -> Path:
    """The same add-on as ``zip_path`` with its manifest's version set to ``version``."""
    source = work / f"src-{version}"
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(source)
    manifest = source / "blender_manifest.toml"
    text = re.sub(r'(?m)^version = ".*"$', f'version = "{version}"', manifest.read_text())
    manifest.write_text(text)
    return build_zip(source, work / f"dist-{version}")


def publish(repo: Path, *zips: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--repo-dir", str(repo), *map(str, zips)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def client(step: str, url: str, root: Path) -> tuple[dict, str]:
    env = bh.isolated_blender_env(root)  # makes root
    script = root / "client.py"
    script.write_text(CLIENT)
    proc = subprocess.run(
        [sys.executable, str(script), step, url],
        capture_output=True, text=True, env=env, cwd=root, timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :]), re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)


def test_bpy_installs_from_the_published_repository_and_sees_the_update(tmp_path):
    version = tomllib.loads((bh.REPO_ROOT / "blender_manifest.toml").read_text())["version"]
    first = build_zip(bh.REPO_ROOT, tmp_path / "dist")
    repo, user = tmp_path / "repo", tmp_path / "user"
    result = publish(repo, first)
    assert result["published"] == [{"zip": first.name, "id": EXT_ID, "version": version, "platforms": []}]
    index = json.loads((repo / "index.json").read_text())
    assert index["version"] == "v1"
    assert [(p["id"], p["version"], p["archive_url"]) for p in index["data"]] == [(EXT_ID, version, f"./{first.name}")]

    url = repo.resolve().as_uri()
    out, _ = client("install", url, user)
    assert (out["repo_add"], out["install"]) == (0, 0)
    assert out["installed_version"] == version
    assert Path(out["installed_dir"]).resolve().is_relative_to(user.resolve())  # the test's own folders

    newer = with_version(first, "99.0.0", tmp_path)
    result = publish(repo, newer)
    assert sorted(p.name for p in repo.glob("*.zip")) == [newer.name]  # the older zip of the build is gone
    out, text = client("list", url, user)
    assert out["list"] == 0 and out["installed_version"] == version
    assert f"outdated: {version} -> 99.0.0" in text, text[-2000:]
    out, _ = client("update", url, user)
    assert out["update"] == 0 and out["installed_version"] == "99.0.0"


def test_publishing_refuses_what_is_not_an_extension_and_leaves_the_folder_alone(tmp_path):
    repo = tmp_path / "repo"
    bogus = tmp_path / "notes.zip"
    with zipfile.ZipFile(bogus, "w") as archive:
        archive.writestr("readme.txt", "hello")
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--repo-dir", str(repo), str(bogus)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"error: {bogus}: no blender_manifest.toml inside; give a zip built by tools/build_extension.py."]
    assert not repo.exists() or not any(repo.iterdir())
