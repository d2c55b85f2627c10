"""'~user' paths naming a user this machine does not have: one line naming the mistake, exit 2,
on every command-line path a user gives (pathlib raises a bare RuntimeError: the bug line before)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from lean_image_ai.runtime.errors import LeanImageError, user_path
from PIL import Image

NOBODY = "~lean_image_ai_no_such_user_x"


def test_user_path_expands_a_known_home_and_refuses_an_unknown_user():
    assert user_path("~/x").is_absolute()
    with pytest.raises(LeanImageError, match=r"this machine has no user 'lean_image_ai_no_such_user_x'.*Give the full path"):
        user_path(f"{NOBODY}/a.png")


def test_the_gpu_runtime_folder_variable_with_an_unknown_user_is_one_clear_error(monkeypatch):
    from lean_image_ai.runtime.cuda import gpu_libraries

    monkeypatch.setenv(gpu_libraries.FOLDER_ENV, NOBODY)
    with pytest.raises(LeanImageError, match="no user"):
        gpu_libraries.folder("/unused")


@pytest.mark.parametrize("where", ["input", "output", "model", "memory plot"])
def test_the_command_line_says_what_is_wrong_with_a_tilde_user_path(tmp_path, where):
    photo = tmp_path / "p.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(photo)
    args = {"input": [f"{NOBODY}/a.png", str(tmp_path / "o.png")],
            "output": [str(photo), f"{NOBODY}/o.png"],
            "model": [str(photo), str(tmp_path / "o.png"), "--model", f"{NOBODY}/m.onnx"],
            "memory plot": [str(photo), str(tmp_path / "o.png"), "--memory-plot", f"{NOBODY}/p.png"]}[where]
    command = ["upscale", *args]
    done = subprocess.run([sys.executable, "-m", "lean_image_ai", *command], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-500:])
    assert "no user 'lean_image_ai_no_such_user_x'" in done.stderr and "a bug" not in done.stderr, done.stderr
    assert not (tmp_path / "o.png").exists()
