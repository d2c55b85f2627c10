"""tools/publish_repository.py: the built zip published as a static extension repository, which a
clean bpy 5.0.1 installs from (a ``file://`` remote repository, as a studio share would be) and
then offers the update from when a higher version is published there. Blender's own extension
code does the installing (bl_pkg's ``extension`` command: repo-add, install --sync, list, update),
in subprocesses whose user folders are the test's own; the blender.org repository is switched
off first, so nothing leaves the machine."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
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


# -- what artists install from is never left worse (issue 39, items 1-6): small extension zips made
# here (Blender's generator reads any zip with a manifest), the tool run as a user runs it ---------
TINY_MANIFEST = """schema_version = "1.0.0"
id = "{id}"
version = "{version}"
name = "Tiny"
tagline = "A test extension"
maintainer = "Tests"
type = "{type}"
blender_version_min = "4.2.0"
license = ["SPDX:GPL-3.0-or-later"]
"""


def tiny_zip(folder: Path, name: str, version: str = "1.0.0", *, ext_id: str = "tiny", kind: str = "add-on",
             manifest: str | None = None, payload: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("blender_manifest.toml", manifest or TINY_MANIFEST.format(id=ext_id, version=version, type=kind))
        archive.writestr("__init__.py", "def register():\n    pass\n\n\ndef unregister():\n    pass\n")
        if payload:  # random bytes stay their size in the zip
            archive.writestr("payload.bin", os.urandom(payload))
    return path


def run_tool(repo: Path, *zips: Path, preexec=None) -> tuple[int, list[str], str]:
    proc = subprocess.run([sys.executable, str(TOOL), "--repo-dir", str(repo), *map(str, zips)], capture_output=True,
                          text=True, timeout=300, preexec_fn=preexec)
    return proc.returncode, proc.stderr.strip().splitlines(), proc.stdout


def one_line(code: int, err: list[str], expected_code: int = 1) -> str:
    assert code == expected_code and len(err) == 1 and err[0].startswith("error: "), (code, err)
    return err[0]


def folder_state(repo: Path) -> dict:
    """Every entry of the folder (hidden ones too) with its bytes: what a host serves."""
    return {p.name: p.read_bytes() if p.is_file() else "folder" for p in sorted(repo.iterdir())}


def published_one(tmp_path: Path) -> tuple[Path, dict]:
    repo = tmp_path / "repo"
    code, err, _ = run_tool(repo, tiny_zip(tmp_path / "v1", "tiny-1.0.0.zip"))
    assert code == 0, err
    state = folder_state(repo)
    assert sorted(state) == ["index.json", "tiny-1.0.0.zip"]
    return repo, state


def test_a_newer_zip_the_generator_rejects_leaves_the_published_one_and_its_index(tmp_path):
    repo, before = published_one(tmp_path)
    rejected = tiny_zip(tmp_path / "v2", "tiny-2.0.0.zip", "2.0.0", kind="keymap")  # Blender takes add-on or theme
    line = one_line(*run_tool(repo, rejected)[:2])
    assert "nothing was published" in line, line
    assert folder_state(repo) == before


def _file_size_limit(limit: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def test_a_full_disk_while_copying_leaves_the_published_zip_and_its_index(tmp_path):
    repo, before = published_one(tmp_path)
    newer = tiny_zip(tmp_path / "v2", "tiny-2.0.0.zip", "2.0.0", payload=512 << 10)
    line = one_line(*run_tool(repo, newer, preexec=_file_size_limit(128 << 10))[:2])
    assert "as they were" in line, line
    assert folder_state(repo) == before
    code, err, _ = run_tool(repo, newer)  # with room, the newer build replaces the older one
    assert code == 0, err
    assert sorted(folder_state(repo)) == ["index.json", "tiny-2.0.0.zip"]


def test_a_link_planted_at_the_old_temporary_name_is_not_written_through(tmp_path):
    repo, victim = tmp_path / "repo", tmp_path / "victim.txt"
    repo.mkdir()
    victim.write_text("not yours")
    zip_path = tiny_zip(tmp_path / "dist", "tiny-1.0.0.zip")
    (repo / f".{zip_path.name}.partial").symlink_to(victim)
    code, err, _ = run_tool(repo, zip_path)
    assert code == 0, err
    assert victim.read_text() == "not yours"
    published = repo / zip_path.name
    assert not published.is_symlink() and published.read_bytes() == zip_path.read_bytes()


def test_two_zips_of_one_name_are_refused_and_nothing_is_published(tmp_path):
    first = tiny_zip(tmp_path / "a", "x.zip", ext_id="first_one")
    second = tiny_zip(tmp_path / "b", "x.zip", ext_id="second_one")
    line = one_line(*run_tool(tmp_path / "repo", first, second)[:2], expected_code=2)
    assert str(first) in line and str(second) in line, line
    assert not (tmp_path / "repo").exists()


def test_a_zip_named_with_a_space_and_an_accent_is_published_and_reported(tmp_path):
    repo = tmp_path / "repo"
    zip_path = tiny_zip(tmp_path / "dist", "tiny addon é-1.0.0.zip")
    code, err, out = run_tool(repo, zip_path)
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["published"][0]["zip"] == zip_path.name
    (item,) = json.loads((repo / "index.json").read_text())["data"]
    assert item["archive_url"] != f"./{zip_path.name}" and (repo / zip_path.name).is_file()  # a URL: encoded


def test_versions_compare_as_semantic_versions(tmp_path):
    repo = tmp_path / "repo"
    for version in ("1.2.0", "1.2.0+build.5"):  # one version: the later file replaces the earlier
        code, err, _ = run_tool(repo, tiny_zip(tmp_path / version, f"tiny-{version}.zip", version))
        assert code == 0, err
    assert sorted(folder_state(repo)) == ["index.json", "tiny-1.2.0+build.5.zip"]
    before = folder_state(repo)
    line = one_line(*run_tool(repo, tiny_zip(tmp_path / "rc", "tiny-1.2.0-rc.1.zip", "1.2.0-rc.1"))[:2])
    assert "newer" in line, line  # a pre-release comes before its release
    assert folder_state(repo) == before


def test_a_repo_dir_that_is_a_file_is_one_line(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("a file")
    line = one_line(*run_tool(taken, tiny_zip(tmp_path / "dist", "tiny-1.0.0.zip"))[:2])
    assert "is a file" in line and taken.read_text() == "a file"


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_a_repo_dir_the_user_cannot_write_is_one_line():
    """A real read-only folder: as root (which writes anywhere) the tool drops to 'nobody' once its
    modules are imported, as tests/test_hostile_outputs.py's read-only case does."""
    base = Path(tempfile.mkdtemp(prefix="lean_image_ai_publish_"))
    try:
        base.chmod(0o755)
        zip_path = tiny_zip(base / "dist", "tiny-1.0.0.zip")
        locked = base / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        drop = "os.setgroups([]); os.setgid(65534); os.setuid(65534)" if os.geteuid() == 0 else ""
        for repo in (locked, locked / "repo"):  # there and not writable; to be made where it cannot be
            # zip names' codec loaded before the drop: this Python's own files may not be readable by nobody
            code = (f"import os, sys, encodings.cp437\nsys.path.insert(0, {str(TOOL.parent)!r})\nimport publish_repository as tool\n"
                    f"{drop}\nsys.exit(tool.main(['--repo-dir', {str(repo)!r}, {str(zip_path)!r}]))")
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=base)
            line = one_line(proc.returncode, proc.stderr.strip().splitlines())
            assert "not writable" in line or "cannot be made" in line, line
        assert not any(locked.iterdir())
    finally:
        locked.chmod(0o755)
        shutil.rmtree(base)


def test_a_manifest_that_inflates_to_gigabytes_is_one_line(tmp_path):
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive, \
            archive.open("blender_manifest.toml", "w", force_zip64=True) as member:
        block = b"\0" * (16 << 20)
        for _ in range(96):  # 1.5 GiB inflated, 7 MB in the zip
            member.write(block)

    def memory_limit():  # far below the inflated size: reading it whole fails, as on a smaller machine
        resource.setrlimit(resource.RLIMIT_AS, (768 << 20, 768 << 20))

    line = one_line(*run_tool(tmp_path / "repo", bomb, preexec=memory_limit)[:2])
    assert "larger than" in line, line


GOOD = TINY_MANIFEST.format(id="other", version="1.0.0", type="add-on")  # beside the published one
REJECTED_MANIFESTS = {  # what Blender refuses, by the field it names
    "version = 1": GOOD.replace('\nversion = "1.0.0"', "\nversion = 1"),
    "id": GOOD.replace('id = "other"\n', "") + '[id]\nname = "other"\n',  # a table comes after the keys
    "schema_version": GOOD.replace('schema_version = "1.0.0"\n', ""),
    "license": GOOD.replace('license = ["SPDX:GPL-3.0-or-later"]', 'license = "GPL"'),
    "version = '1.0'": GOOD.replace('\nversion = "1.0.0"', '\nversion = "1.0"'),
}


@pytest.mark.parametrize("field", REJECTED_MANIFESTS)
def test_a_manifest_blender_rejects_is_refused_before_anything_is_copied(tmp_path, field):
    repo, before = published_one(tmp_path)
    line = one_line(*run_tool(repo, tiny_zip(tmp_path / "bad", "other-1.0.0.zip", manifest=REJECTED_MANIFESTS[field]))[:2])
    assert field in line, line
    assert folder_state(repo) == before
