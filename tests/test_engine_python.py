"""The worker's engine: which Python runs the worker (preference > LEAN_IMAGE_AI_WORKER_PYTHON >
the host's own) and the one-line refusal of one that cannot run it (models/worker/engine_python.py).
Real interpreters: pyenv's 3.10 and bare 3.13, and a 3.13 venv with numpy 2 and onnxruntime."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from engine_pythons import engine_venv, pyenv_python
from lean_image_ai.models.worker import engine_python
from lean_image_ai.models.worker.engine_python import ENV_VAR, EnginePythonError


def test_the_preference_wins_then_the_environment_then_the_host():
    env = {ENV_VAR: "/opt/studio/bin/python3"}
    assert engine_python.choose("/home/me/env/bin/python", env) == engine_python.EngineChoice(
        "/home/me/env/bin/python", "preference"
    )
    assert engine_python.choose("", env) == engine_python.EngineChoice("/opt/studio/bin/python3", "environment")
    assert engine_python.choose("  ", {ENV_VAR: " "}) == engine_python.EngineChoice(sys.executable, "host")
    assert engine_python.worker_python("", {}) == sys.executable


def test_a_python_313_venv_with_numpy_and_onnxruntime_is_accepted():
    python = engine_venv("3.13")
    facts = engine_python.check(python)
    assert facts.version[:2] == (3, 13)
    assert facts.numpy.startswith("2.")  # another numpy than the host's 1.26
    assert facts.onnxruntime == "1.31.1"
    assert "CPUExecutionProvider" in facts.providers
    assert "engine-py313" in facts.onnxruntime_file  # imported from that venv, not from the host's path


def test_the_hosts_search_path_does_not_leak_into_the_candidate(monkeypatch):
    # Blender's PYTHONPATH (its numpy for 3.11) must not answer for a 3.13 venv
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    facts = engine_python.check(engine_venv("3.13"))
    assert facts.numpy.startswith("2.")


def test_python_310_is_refused_in_one_line_naming_what_to_install():
    python = pyenv_python("3.10")
    with pytest.raises(EnginePythonError) as caught:
        engine_python.check(python)
    text = str(caught.value)
    assert "\n" not in text
    assert "is Python 3.10." in text and "3.11 or newer" in text
    assert "numpy onnxruntime" in text


def test_a_python_313_without_numpy_or_onnxruntime_is_refused_naming_both():
    python = pyenv_python("3.13")
    with pytest.raises(EnginePythonError) as caught:
        engine_python.check(python)
    text = str(caught.value)
    assert "\n" not in text
    assert "(Python 3.13.0) cannot import numpy or onnxruntime" in text
    assert f'"{python}" -m pip install numpy onnxruntime' in text


def test_a_missing_interpreter_and_one_that_hangs_are_refused_in_one_line(tmp_path):
    with pytest.raises(EnginePythonError, match=r"^The worker Python .*nowhere/python cannot be started"):
        engine_python.check(str(tmp_path / "nowhere" / "python"))
    hangs = tmp_path / "hangs"
    hangs.write_text("#!/bin/sh\nsleep 30\n")
    hangs.chmod(0o755)
    with pytest.raises(EnginePythonError, match="gave no answer in 1 s") as caught:
        engine_python.check(str(hangs), timeout=1)
    assert "\n" not in str(caught.value)
    not_python = tmp_path / "not_python"
    not_python.write_text("#!/bin/sh\necho hello\n")
    not_python.chmod(0o755)
    with pytest.raises(EnginePythonError, match="gave no answer a Python gives"):
        engine_python.check(str(not_python))


def test_an_accepted_python_is_asked_once_a_refused_one_again(tmp_path):
    python = engine_venv("3.13")
    engine_python.forget()
    first = engine_python.checked(python)
    assert engine_python.checked(python) is first
    with pytest.raises(EnginePythonError):
        engine_python.checked(pyenv_python("3.10"))
    assert all(key[0] != pyenv_python("3.10") for key in engine_python._checked)


def test_the_doctor_names_the_workers_python_and_its_onnxruntime(tmp_path):
    """What Run Doctor asks (its --worker-python is the preference): the worker's interpreter and
    what it has, beside the doctor's own Python."""
    from lean_image_ai.runtime.log import doctor_process
    from lean_image_ai.runtime.paths import ADDON_ROOT

    python = engine_venv("3.13")
    assert doctor_process.command("/engine", python)[-5:] == ["doctor", "--gpu-runtime", "/engine", "--worker-python", python]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", ENV_VAR)}
    done = subprocess.run([sys.executable, str(ADDON_ROOT), "doctor", "--no-cuda-probe", "--worker-python", python],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("The worker runs in: "))
    assert line.startswith(f"The worker runs in: {python} (from the add-on preference Worker Python): Python 3.13.")
    assert ", numpy 2." in line and "onnxruntime 1.31.1 from " in line and "engine-py313" in line
