"""runtime/cuda/gpu_libraries.py with the real pip (this venv's) and tiny real wheels from a local
folder (``--no-index --find-links``): install, wrong hash, cancel, remove, download size, activate.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fake_wheels import build_wheel, sha256_file, write_requirements  # noqa: E402
from lean_image_ai.runtime.cuda import gpu_install as GI  # noqa: E402
from lean_image_ai.runtime.cuda import gpu_libraries as G  # noqa: E402
from lean_image_ai.runtime.cuda import gpu_loading as L  # noqa: E402
from lean_image_ai.runtime.errors import OperationCancelled  # noqa: E402
from lean_image_ai.runtime.log import diagnostics  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def wheels(tmp_path):
    folder = tmp_path / "index"
    return [
        build_wheel(folder, "nvidia-fake-lib", "1.0", {"nvidia/fake/lib/libfake.so.1": b"\x7fELF not really" * 64}),
        build_wheel(folder, "nvidia-fake-dnn", "2.3", {"nvidia/fakednn/lib/libfakednn.so.9": b"dnn" * 1000}),
    ]


@pytest.fixture(autouse=True)
def _keep_activation(monkeypatch):
    """activate() records its result process-wide; each test starts and ends without one."""
    monkeypatch.setattr(L, "_active", None)


def _index(wheels):
    return ("--no-index", "--find-links", str(wheels[0].parent))


def test_requirements_parse_and_download_size(tmp_path, wheels):
    req = write_requirements(tmp_path / "req.txt", wheels)
    parsed = G.parse_requirements(req)
    assert [(r.name, r.version) for r in parsed] == [("nvidia-fake-lib", "1.0"), ("nvidia-fake-dnn", "2.3")]
    assert parsed[0].sha256 == sha256_file(wheels[0])
    assert G.download_size(req) == sum(w.stat().st_size for w in wheels)
    (tmp_path / "nosize.txt").write_text(f"a==1 --hash=sha256:{'0' * 64}\n")
    assert G.download_size(tmp_path / "nosize.txt") is None  # unknown, never guessed
    (tmp_path / "bad.txt").write_text("a>=1\n")
    with pytest.raises(G.GpuRuntimeError, match="line 1"):
        G.parse_requirements(tmp_path / "bad.txt")


def test_install_puts_libraries_in_place_and_remove_deletes(tmp_path, wheels):
    req = write_requirements(tmp_path / "req.txt", wheels)
    target = tmp_path / "user" / "gpu_runtime"
    steps = []
    result = GI.install(target, req, index_args=_index(wheels), progress=lambda f, s: steps.append((f, s)))
    assert result == target.resolve()
    assert (target / "nvidia/fake/lib/libfake.so.1").read_bytes() == b"\x7fELF not really" * 64
    assert (target / "nvidia/fakednn/lib/libfakednn.so.9").is_file()
    assert G.installed_packages(target) == {"nvidia-fake-lib": "1.0", "nvidia-fake-dnn": "2.3"}
    assert G.is_current(target, req)
    assert sorted(p.name for p in target.parent.iterdir()) == ["gpu_runtime"]  # staging gone
    fractions = [f for f, _ in steps]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any(s.startswith("downloading nvidia-fake-dnn") for _, s in steps)
    # a reinstall replaces the folder as a whole
    GI.install(target, req, index_args=_index(wheels))
    assert sorted(p.name for p in target.parent.iterdir()) == ["gpu_runtime"]
    assert G.remove(target) is True
    assert not target.exists() and G.installed_version(target) is None
    assert G.remove(target) is False


def test_installed_version_names_cuda_and_cudnn(tmp_path):
    folder = tmp_path / "idx"
    wheels = [
        build_wheel(folder, "nvidia-cuda-runtime", "13.5.37", {"nvidia/cu13/lib/libcudart.so.13": b"x"}),
        build_wheel(folder, "nvidia-cudnn-cu13", "9.28.1.4", {"nvidia/cudnn/lib/libcudnn.so.9": b"y"}),
    ]
    req = write_requirements(tmp_path / "req.txt", wheels)
    GI.install(tmp_path / "gpu", req, index_args=_index(wheels))
    assert G.installed_version(tmp_path / "gpu") == "CUDA 13.5.37, cuDNN 9.28.1.4"


def test_wrong_hash_is_refused_and_nothing_installed(tmp_path, wheels):
    req = write_requirements(tmp_path / "req.txt", wheels, digests={"nvidia-fake-dnn": "ab" * 32})
    target = tmp_path / "user" / "gpu_runtime"
    with pytest.raises(G.GpuRuntimeError, match="checksum"):
        GI.install(target, req, index_args=_index(wheels))
    assert list(target.parent.iterdir()) == []  # not even the first, correct wheel


def test_an_existing_install_survives_a_failed_update(tmp_path, wheels):
    target = tmp_path / "gpu_runtime"
    GI.install(target, write_requirements(tmp_path / "good.txt", wheels), index_args=_index(wheels))
    bad = write_requirements(tmp_path / "bad.txt", wheels, digests={"nvidia-fake-lib": "cd" * 32})
    with pytest.raises(G.GpuRuntimeError):
        GI.install(target, bad, index_args=_index(wheels))
    assert G.installed_packages(target) == {"nvidia-fake-lib": "1.0", "nvidia-fake-dnn": "2.3"}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("gpu_runtime")) == ["gpu_runtime"]


def test_cancel_while_pip_runs_leaves_nothing(tmp_path, wheels):
    req = write_requirements(tmp_path / "req.txt", wheels)
    target = tmp_path / "user" / "gpu_runtime"
    seen = []

    def cancel():  # as soon as pip has started on the first wheel
        return any(stage.startswith("downloading") for stage in seen)

    with pytest.raises(OperationCancelled):
        GI.install(target, req, index_args=_index(wheels), progress=lambda f, s: seen.append(s), cancel=cancel)
    assert list(target.parent.iterdir()) == []
    assert G.installed_version(target) is None


def test_pip_failure_names_what_pip_said(tmp_path, wheels):
    req = tmp_path / "req.txt"
    req.write_text(f"nvidia-not-there==1.0 --hash=sha256:{'0' * 64}  # size: 10\n")
    with pytest.raises(G.GpuRuntimeError, match="nothing was installed") as info:
        GI.install(tmp_path / "gpu", req, index_args=_index(wheels))
    assert "nvidia-not-there" in str(info.value)
    assert not (tmp_path / "gpu").exists() and not (tmp_path / "gpu.staging").exists()


def _user_folder(path: Path) -> dict[str, bytes]:
    path.mkdir(parents=True)
    files = {"thesis.docx": b"years of work", "sub/notes.txt": b"more"}
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return files


def _still_there(path: Path, files: dict[str, bytes]) -> None:
    assert {name: (path / name).read_bytes() for name in files} == files


def test_remove_refuses_a_folder_the_add_on_did_not_make(tmp_path, monkeypatch):
    shared = tmp_path / "studio share"
    kept = _user_folder(shared)
    monkeypatch.setenv(G.FOLDER_ENV, str(shared))
    with pytest.raises(G.GpuRuntimeError, match="not made by this add-on") as info:
        G.remove(G.folder(tmp_path / "default"))
    assert str(shared) in str(info.value) and "nothing was deleted" in str(info.value)
    _still_there(shared, kept)


def test_install_refuses_to_replace_a_folder_the_add_on_did_not_make(tmp_path, wheels):
    shared = tmp_path / "home"
    kept = _user_folder(shared)
    with pytest.raises(G.GpuRuntimeError, match="not made by this add-on") as info:
        GI.install(shared, write_requirements(tmp_path / "req.txt", wheels), index_args=_index(wheels))
    assert str(shared) in str(info.value)
    _still_there(shared, kept)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "index", "req.txt"]  # pip never ran


@pytest.mark.parametrize("leftover", [".old", ".staging"])
def test_a_user_folder_named_like_a_leftover_is_never_deleted(tmp_path, wheels, leftover):
    target = tmp_path / "gpu_runtime"
    lookalike = tmp_path / f"gpu_runtime{leftover}"
    kept = _user_folder(lookalike)
    req = write_requirements(tmp_path / "req.txt", wheels)
    with pytest.raises(G.GpuRuntimeError, match=str(lookalike)):
        GI.install(target, req, index_args=_index(wheels))
    with pytest.raises(G.GpuRuntimeError, match=str(lookalike)):
        G.remove(target)
    _still_there(lookalike, kept)


def test_a_file_or_a_link_at_the_folder_is_refused(tmp_path, wheels):
    req = write_requirements(tmp_path / "req.txt", wheels)
    afile = tmp_path / "libs"
    afile.write_bytes(b"not a folder")
    with pytest.raises(G.GpuRuntimeError, match="is a file"):
        GI.install(afile, req, index_args=_index(wheels))
    with pytest.raises(G.GpuRuntimeError, match="is a file"):
        G.remove(afile)
    assert afile.read_bytes() == b"not a folder"
    real = tmp_path / "real"
    GI.install(real, req, index_args=_index(wheels))
    (tmp_path / "real.staging").symlink_to(tmp_path / "index")  # someone else's link beside ours
    with pytest.raises(G.GpuRuntimeError, match="symbolic link"):
        G.remove(real)
    assert G.installed_packages(real) and (tmp_path / "index").is_dir()


def test_an_empty_folder_made_for_the_libraries_is_used_and_kept(tmp_path, wheels):
    target = tmp_path / "gpu_runtime"
    target.mkdir()
    assert G.remove(target) is False and target.is_dir()  # nothing of ours in it
    GI.install(target, write_requirements(tmp_path / "req.txt", wheels), index_args=_index(wheels))
    assert G.installed_packages(target)
    assert G.remove(target) is True and not target.exists()


def test_a_staging_folder_left_by_a_killed_install_is_cleared(tmp_path, wheels):
    target = tmp_path / "gpu_runtime"
    staging = tmp_path / "gpu_runtime.staging"
    (staging / "site").mkdir(parents=True)
    (staging / G.STAGING_MARKER).write_text("x")
    (staging / "site" / "half.so").write_bytes(b"half")
    GI.install(target, write_requirements(tmp_path / "req.txt", wheels), index_args=_index(wheels))
    assert not staging.exists() and G.installed_packages(target)


GATED_PIP = """#!{python}
# pip for these tests: the first one started waits at a gate (the test opens it), then every
# one runs the real pip with the same arguments
import os, sys, time
from pathlib import Path

gate = Path({gate!r})
try:
    os.close(os.open(gate / "first", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    first = True
except FileExistsError:
    first = False
(gate / f"pip-{{os.getpid()}}").write_text(" ".join(sys.argv))
deadline = time.monotonic() + 60
while first and not (gate / "open").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
os.execv({python!r}, [{python!r}, *sys.argv[1:]])
"""


def _gated_pip(tmp_path) -> tuple[Path, Path]:
    gate = tmp_path / "gate"
    gate.mkdir()
    pip = tmp_path / "gated_python"
    pip.write_text(GATED_PIP.format(python=sys.executable, gate=str(gate)))
    pip.chmod(0o755)
    return pip, gate


def _wait_for(path: Path, process) -> None:
    for _ in range(3000):
        if path.exists() or process.poll() is not None:
            break
        time.sleep(0.02)
    assert path.exists(), process.communicate(timeout=30)


def _job(target, req, pip, wheels) -> list[str]:
    return [sys.executable, str(Path(__file__).parent / "gpu_install_job.py"), str(target), str(req), str(pip), str(wheels[0].parent)]


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the gated pip is a shebang script; /proc")


@linux_only
def test_a_second_install_into_the_folder_is_refused_and_the_first_completes(tmp_path, wheels):
    # the first install is held inside its pip (a gate): deterministic, no timing
    req = write_requirements(tmp_path / "req.txt", wheels)
    target = tmp_path / "user" / "gpu_runtime"
    pip, gate = _gated_pip(tmp_path)
    first = subprocess.Popen(_job(target, req, pip, wheels), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(gate / "first", first)
        staging = tmp_path / "user" / "gpu_runtime.staging"
        assert (staging / G.STAGING_MARKER).is_file()
        second = subprocess.run(_job(target, req, pip, wheels), capture_output=True, text=True, timeout=120)
        refusal = json.loads(second.stdout)["error"]
        assert second.returncode == 2 and "\n" not in refusal, second
        assert f"Another install of the GPU libraries into {target.resolve()} is running (process {first.pid} on" in refusal
        with pytest.raises(G.GpuRuntimeError, match=f"process {first.pid} on"):
            G.remove(target)  # nor is the folder removed under it
        assert (staging / G.STAGING_MARKER).is_file()  # the first's staging is untouched
        assert len(list(gate.glob("pip-*"))) == 1  # one pip run, never two into one staging folder
        (gate / "open").touch()
        out, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0 and json.loads(out.splitlines()[-1])["ok"], out
    assert G.is_current(target, req) and G.installed_packages(target) == {"nvidia-fake-lib": "1.0", "nvidia-fake-dnn": "2.3"}
    assert sorted(p.name for p in target.parent.iterdir()) == ["gpu_runtime"]  # no staging, no lock left


@linux_only
def test_a_killed_install_holds_the_folder_while_its_pip_lives_and_frees_it_after(tmp_path, wheels):
    """The install killed (as a crash takes Blender) while its pip runs: that pip, orphaned, still
    writes into the staging folder and holds the lock it inherited; once it ends, the OS frees the
    lock and the next install clears the staging folder and completes."""
    req = write_requirements(tmp_path / "req.txt", wheels)
    target = tmp_path / "gpu_runtime"
    pip, gate = _gated_pip(tmp_path)
    first = subprocess.Popen(_job(target, req, pip, wheels), stdout=subprocess.DEVNULL)
    try:
        _wait_for(gate / "first", first)
    finally:
        first.kill()
        first.wait()
    (orphan,) = [int(p.name.split("-")[1]) for p in gate.glob("pip-*")]
    with pytest.raises(G.GpuRuntimeError, match=f"Another install of the GPU libraries into {target.resolve()}"):
        GI.install(target, req, index_args=_index(wheels))
    assert (tmp_path / "gpu_runtime.staging" / G.STAGING_MARKER).is_file()
    (gate / "open").touch()
    for _ in range(3000):  # the orphan is not our child: watch its pid
        if not Path(f"/proc/{orphan}").exists() or Path(f"/proc/{orphan}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.02)
    GI.install(target, req, index_args=_index(wheels))
    assert G.is_current(target, req)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("gpu_runtime")) == ["gpu_runtime"]


def test_activate_without_libraries_reports_and_never_raises(tmp_path):
    empty = L.activate(tmp_path / "nothing")
    assert not empty.ok and "No GPU libraries" in empty.error
    assert L.active() is empty


def test_activate_reports_each_library_it_could_not_load(tmp_path):
    """A folder that looks installed but holds broken files: every library is named, nothing raises."""
    ort = pytest.importorskip("onnxruntime")
    if not getattr(ort, "cuda_version", None):
        pytest.skip("needs onnxruntime-gpu (a CUDA build)")
    cuda, cudnn = L.library_paths(ort)
    target = tmp_path / "gpu_runtime"
    broken = cuda[0]  # a file that is there but is no library
    (target.joinpath(*broken[:-1])).mkdir(parents=True)
    target.joinpath(*broken).write_bytes(b"not a shared library")
    (target / G.MARKER).write_text("{}")
    result = L.activate(target)
    assert result.error is None and not result.ok
    assert broken[-1] in result.failed
    assert not result.loaded
    assert {Path(m).name for m in result.missing} == {p[-1] for p in cuda + cudnn} - {broken[-1]}
    assert broken[-1] in result.summary()
    # the diagnostics report looks in the add-on's folder once it was activated
    report = diagnostics.collect(cuda_probe=False)
    libs = {lib.name: lib for lib in report.cuda_libraries}
    assert libs[broken[-1]].where == "add-on GPU runtime"
    assert libs[broken[-1]].path == str(target.joinpath(*broken))
    assert report.gpu_runtime["folder"] == str(target)
    assert "GPU runtime" in diagnostics.format_report(report)


def test_committed_requirement_files_are_well_formed():
    files = sorted((REPO / G.REQUIREMENTS_DIR).glob("*.txt"))
    assert any(f.name == "linux-x64-cp311.txt" for f in files)
    for path in files:
        parsed = G.parse_requirements(path)
        names = {r.name for r in parsed}
        assert {"nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13"} <= names, path
        assert G.download_size(path) > 0, path
