"""The add-on as a Blender extension: manifest, build, install into a clean Blender, import rules,
register/unregister cycles. Uses Blender's own extension CLI and real bpy."""

from __future__ import annotations

import json
import shutil
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

MANIFEST = bh.REPO_ROOT / "blender_manifest.toml"
DEV_ONLY_TOP = ("tests/", "bench/", "tools/", "ui/cli/flamenco/", "examples/", ".venv/", ".ci/", ".git/", "pyproject.toml")


@pytest.fixture(scope="module")
def built_zip(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ext_build")
    proc = bh.run_extension_cli(
        "build",
        "--source-dir",
        str(bh.REPO_ROOT),
        "--output-dir",
        str(out),
        "--valid-tags",
        str(bh.valid_tags_file()),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    zips = list(out.glob("*.zip"))
    assert len(zips) == 1, (zips, proc.stdout)
    return zips[0]


# --- (a) manifest ----------------------------------------------------------------------------------


def test_blender_validator_accepts_repository():
    proc = bh.run_extension_cli("validate", str(bh.REPO_ROOT), "--valid-tags", str(bh.valid_tags_file()))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout


def test_validator_is_strict_enough_to_catch_a_broken_manifest(tmp_path):
    # Guards the test above: the same validator rejects a manifest with an over-long tagline.
    broken = tmp_path / "pkg"
    broken.mkdir()
    shutil.copy(bh.REPO_ROOT / "__init__.py", broken / "__init__.py")
    text = MANIFEST.read_text().replace('tagline = "', 'tagline = "' + "x" * 80, 1)
    (broken / "blender_manifest.toml").write_text(text)
    proc = bh.run_extension_cli("validate", str(broken), "--valid-tags", str(bh.valid_tags_file()))
    assert proc.returncode != 0
    assert "tagline" in proc.stdout + proc.stderr


def test_manifest_fields():
    data = tomllib.loads(MANIFEST.read_text())
    assert data["schema_version"] == "1.0.0"
    assert data["id"] == bh.PACKAGE
    assert data["name"] == "Lean Image AI"
    assert data["type"] == "add-on"
    assert data["blender_version_min"] == "4.2.0"
    assert data["license"] == ["SPDX:GPL-3.0-or-later"]
    assert set(data["permissions"]) == {"network", "files"}
    assert all(reason and not reason.endswith(".") for reason in data["permissions"].values())
    # numpy comes with Blender; any wheel listed must exist in the repository.
    for wheel in data.get("wheels", []):
        assert "numpy" not in wheel.lower()
        assert (bh.REPO_ROOT / wheel).is_file(), wheel
    patterns = data["build"]["paths_exclude_pattern"]
    for needed in (
        "/tests/",
        "/bench/",
        "/ui/cli/flamenco/",
        "/tools/",
        "/.venv/",
        "/.ci/",
        "/.git/",
        "__pycache__/",
        "/pyproject.toml",
        "*.part",
    ):
        assert needed in patterns, needed


def test_manifest_version_matches_pyproject():
    manifest = tomllib.loads(MANIFEST.read_text())
    pyproject = tomllib.loads((bh.REPO_ROOT / "pyproject.toml").read_text())
    assert manifest["version"] == pyproject["project"]["version"]


# --- (b) build + install into a clean Blender ---------------------------------------------------------


def test_built_zip_holds_the_addon_and_no_development_files(built_zip):
    names = zipfile.ZipFile(built_zip).namelist()
    for required in (
        "__init__.py",
        "blender_manifest.toml",
        "operators/__init__.py",
        "operators/image_io.py",
        "ui/__init__.py",
        "ui/preferences.py",
        "runtime/errors.py",
    ):
        assert required in names, required
    for name in names:
        assert not name.startswith(DEV_ONLY_TOP), name
        assert "__pycache__/" not in name and not name.endswith((".pyc", ".part", ".zip")), name
        assert not Path(name).name.startswith("."), name


INSTALL_SCRIPT = r"""
import importlib, json, sys
import bpy
zip_path, user_root = sys.argv[1], sys.argv[2]
out = {"user_extensions": bpy.utils.user_resource("EXTENSIONS")}
result = bpy.ops.extensions.package_install_files(
    filepath=zip_path, repo="user_default", enable_on_install=True)
out["result"] = sorted(result)
name = "bl_ext.user_default.lean_image_ai"
out["enabled"] = name in bpy.context.preferences.addons.keys()
module = importlib.import_module(name)
out["module_file"] = module.__file__
from bl_ext.user_default.lean_image_ai.ui import preferences as P
from bl_ext.user_default.lean_image_ai.operators import prefs as R
out["addon_id"] = R.ADDON_ID
prefs = R.get_prefs(bpy.context)
out["prefs_class"] = type(prefs).__name__
out["device_string"] = R.device_string(prefs)
out["models_dir"] = str(R.models_folder(bpy.context, create=True))
out["prefs_registered"] = P.LeanImageAIPreferences.is_registered
bpy.ops.preferences.addon_disable(module=name)
out["enabled_after_disable"] = name in bpy.context.preferences.addons.keys()
out["prefs_registered_after_disable"] = P.LeanImageAIPreferences.is_registered
print("RESULT " + json.dumps(out))
"""


def test_zip_installs_and_enables_in_clean_blender(built_zip, tmp_path):
    root = tmp_path / "user"
    env = bh.isolated_blender_env(root)
    script = tmp_path / "install.py"
    script.write_text(INSTALL_SCRIPT)
    proc = bh.run_python(
        f"import runpy, sys; sys.argv = ['install.py', {str(built_zip)!r}, {str(root)!r}]; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')",
        env=env,
        cwd=tmp_path,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    # Blender really used the temporary user folders, not the real ones.
    assert Path(out["user_extensions"]).resolve().is_relative_to(root.resolve())
    assert out["result"] == ["FINISHED"]
    assert out["enabled"] is True
    assert out["prefs_registered"] is True
    installed = Path(out["module_file"]).resolve()
    assert installed.is_relative_to(root.resolve())
    assert not (installed.parent / "tests").exists() and not (installed.parent / "bench").exists()
    assert out["addon_id"] == "bl_ext.user_default.lean_image_ai"
    assert out["prefs_class"] == "LeanImageAIPreferences"
    assert out["device_string"] == "auto"
    models_dir = Path(out["models_dir"])
    assert models_dir.name == "models" and models_dir.is_dir()
    assert models_dir.resolve().is_relative_to(root.resolve())
    assert out["enabled_after_disable"] is False
    assert out["prefs_registered_after_disable"] is False


# --- (c) importing the package never imports bpy -------------------------------------------------------


def test_import_package_does_not_import_bpy(tmp_path):
    search = bh.package_search_dir(tmp_path / "path")
    code = (
        "import sys\n"
        "import lean_image_ai\n"
        "import os\n"
        f"assert os.path.realpath(lean_image_ai.__file__) == {str(bh.REPO_ROOT / '__init__.py')!r}\n"
        "assert callable(lean_image_ai.register) and callable(lean_image_ai.unregister)\n"
        "print('BPY_LOADED', 'bpy' in sys.modules)\n"
    )
    proc = bh.run_python(code, env=bh.isolated_blender_env(tmp_path / "u", pythonpath=[search]), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "BPY_LOADED False" in proc.stdout


def test_bpy_free_layers_do_not_import_bpy(tmp_path):
    """runtime/ and models/ (every module in them) import without pulling in bpy."""
    search = bh.package_search_dir(tmp_path / "path")
    code = (
        "import importlib, pkgutil, sys\n"
        "import lean_image_ai\n"
        "names = []\n"
        "for sub in ('runtime', 'models'):\n"
        "    pkg = importlib.import_module('lean_image_ai.' + sub)\n"
        "    for info in pkgutil.iter_modules(pkg.__path__):\n"
        "        importlib.import_module(f'lean_image_ai.{sub}.{info.name}')\n"
        "        names.append(info.name)\n"
        "        assert 'bpy' not in sys.modules, (sub, info.name)\n"
        "print('OK', len(names))\n"
    )
    proc = bh.run_python(code, env=bh.isolated_blender_env(tmp_path / "u", pythonpath=[search]), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout


def test_subprocess_check_would_notice_bpy(tmp_path):
    # Guards the two tests above: the same probe reports True once bpy is imported.
    search = bh.package_search_dir(tmp_path / "path")
    code = "import sys, lean_image_ai, bpy\nprint('BPY_LOADED', 'bpy' in sys.modules)\n"
    proc = bh.run_python(code, env=bh.isolated_blender_env(tmp_path / "u", pythonpath=[search]), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "BPY_LOADED True" in proc.stdout


# --- (d) register / unregister cycles in one process ------------------------------------------------


def test_register_unregister_register_again():
    import bpy  # noqa: F401  (real Blender in this process)

    package = bh.import_package()
    from lean_image_ai.operators import prefs
    from lean_image_ai.ui import preferences

    cls = preferences.LeanImageAIPreferences
    assert prefs.ADDON_ID == bh.PACKAGE
    try:
        package.register()
        assert cls.is_registered
        assert cls.bl_idname == bh.PACKAGE
        package.unregister()
        assert not cls.is_registered
        package.unregister()  # a second unregister is harmless
        assert not cls.is_registered
        package.register()
        assert cls.is_registered
        package.register()  # and so is a second register
        assert cls.is_registered
        assert cls.bl_rna.identifier == "LeanImageAIPreferences"
    finally:
        package.unregister()
    assert not cls.is_registered


def test_unregister_cancels_running_jobs_first(monkeypatch):
    bh.import_package()
    from lean_image_ai import operators

    calls = []
    monkeypatch.setattr(operators, "cancel_running_jobs", lambda: calls.append("cancel"))
    operators.register()
    operators.unregister()
    operators.unregister()
    assert calls == ["cancel", "cancel"]


def test_failed_register_rolls_back(monkeypatch):
    import bpy

    bh.import_package()
    from lean_image_ai import ui
    from lean_image_ai.ui import preferences

    class BrokenPanel(bpy.types.Panel):  # no draw(), no bl_space_type: Blender refuses it
        bl_idname = "LEANIMAGEAI_PT_broken_for_test"
        bl_label = "Broken"

    monkeypatch.setattr(ui, "_classes", lambda: (preferences.LeanImageAIPreferences, BrokenPanel))
    with pytest.raises((AttributeError, RuntimeError, ValueError)):
        ui.register()
    assert not preferences.LeanImageAIPreferences.is_registered
    ui.unregister()  # nothing left to remove; must not raise
