"""ui/cli/flamenco/lean_image_ai.js, the Flamenco 3 job type, run under node with a stand-in of
Flamenco's `author` API: its tasks' frames follow the CLI's shard rule, and the commands it
compiles, run as a render node would (bpy standing in for Blender), write every frame once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lean_image_ai.models.batch import frame_lists

REPO = Path(__file__).resolve().parents[1]
JOB_TYPE = REPO / "ui" / "cli" / "flamenco" / "lean_image_ai.js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed: the job type cannot be run here")

# Flamenco runs job compiler scripts in its own JavaScript engine with `author` and `print` as
# globals; this stand-in records what compileJob() authors.
HARNESS = r"""
const fs = require("fs");
const vm = require("vm");
const [script, settingsJson] = process.argv.slice(2);
const tasks = [];
const author = {
    Task: (name, type) => {
        const task = { name, type, commands: [], addCommand(command) { this.commands.push(command); } };
        return task;
    },
    Command: (name, parameters) => ({ name, parameters }),
};
const context = { author, print: () => {}, console };
vm.createContext(context);
vm.runInContext(fs.readFileSync(script, "utf8") + "\n;this.JOB_TYPE = JOB_TYPE;", context);
const job = { settings: JSON.parse(settingsJson), addTask: (task) => tasks.push(task) };
try {
    context.compileJob(job);
    process.stdout.write(JSON.stringify({ job_type: context.JOB_TYPE, tasks: tasks.map(({ name, type, commands }) => ({ name, type, commands })) }));
} catch (error) {
    process.stdout.write(JSON.stringify({ error: String(error.message) }));
}
"""

SETTINGS = {
    "command": "upscale",
    "input": "/shots/plate_####.png",
    "output": "/out/",
    "frames": "1001-1100",
    "chunk_size": 10,
    "script": "/farm/farm_sequence.py",
    "model_id": "",
    "model_path": "",
    "blendfile": "/farm/empty.blend",
}


def compile_job(tmp_path, job_type: Path = JOB_TYPE, **overrides) -> dict:
    harness = tmp_path / "harness.js"
    harness.write_text(HARNESS)
    settings = json.dumps({**SETTINGS, **overrides})
    done = subprocess.run([NODE, str(harness), str(job_type), settings], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def task_args(task) -> list[str]:
    (command,) = task["commands"]
    return command["parameters"]["args"]


@pytest.mark.parametrize(
    "frames, chunk",
    [("1001-1100", 10), ("1-7", 3), ("1-7", 100), ("5", 1), ("1-48:2", 5), ("10-29:3", 2), ("1-2001", 64)],
)
def test_the_tasks_frames_follow_the_cli_shard_rule(tmp_path, frames, chunk):
    compiled = compile_job(tmp_path, frames=frames, chunk_size=chunk)
    numbers = list(frame_lists.parse_frames(frames))
    tasks = compiled["tasks"]
    total = len(tasks)
    assert total == -(-len(numbers) // chunk)  # ceil: parts of at most chunk_size frames
    covered = []
    for index, task in enumerate(tasks, start=1):
        args = task_args(task)
        assert args[args.index("--shard") + 1] == f"{index}/{total}"
        assert frame_lists.parse_frames(args[args.index("--frames") + 1]) == frame_lists.parse_frames(frames)
        mine = numbers[frame_lists.shard_slice(len(numbers), (index, total))]  # what the CLI will do
        assert task["name"] == f"upscale-{mine[0]}-{mine[-1]}" and task["type"] == "blender"
        covered += mine
    assert covered == numbers  # every frame in exactly one task


def test_the_command_is_a_background_blender_call_of_the_farm_script(tmp_path):
    compiled = compile_job(tmp_path, model_id="realesr-x2")
    assert compiled["job_type"]["label"] == "Lean Image AI Sequence"
    assert {s["key"] for s in compiled["job_type"]["settings"]} >= set(SETTINGS)
    (command,) = compiled["tasks"][0]["commands"]
    parameters = command["parameters"]
    assert command["name"] == "blender-render" and parameters["exe"] == "{blender}"
    assert parameters["argsBefore"] == ["--background", "--python-exit-code", "1"]
    assert parameters["blendfile"] == "/farm/empty.blend"
    assert parameters["args"] == [
        "--python", "/farm/farm_sequence.py", "--", "upscale", "/shots/plate_####.png", "/out/",
        "--frames", "1001-1100", "--shard", "1/10", "--skip-existing", "--model-id", "realesr-x2",
    ]


def test_the_job_type_offers_the_registry_commands_as_the_command_line_writes_it(tmp_path):
    from lean_image_ai.models import families
    from lean_image_ai.ui.cli import cli_flamenco
    from lean_image_ai.ui.cli.main import main

    (command,) = [s for s in compile_job(tmp_path)["job_type"]["settings"] if s["key"] == "command"]
    assert command["choices"] == [f.command for f in families.ALL]
    assert command["default"] in command["choices"]
    assert main(["flamenco-job-type", str(tmp_path)]) == 0  # a folder: the file goes in it, by its name
    assert (tmp_path / JOB_TYPE.name).read_text() == JOB_TYPE.read_text()  # the shipped file is up to date
    assert cli_flamenco.job_type_source(["a", "b"]).count('choices: ["a", "b"], ') == 1


@pytest.mark.parametrize("frames", ["1-30, 40", "10-1", "1-5:0", ""])
def test_frames_the_cli_would_refuse_fail_the_job_at_submission(tmp_path, frames):
    assert "Frames" in compile_job(tmp_path, frames=frames)["error"]


def test_the_compiled_tasks_run_as_a_render_node_would_write_every_frame_once(tmp_path):
    pytest.importorskip("bpy")
    from onnx_builders import sr_model
    from PIL import Image

    (tmp_path / "in").mkdir()
    for n in range(1, 8):
        Image.new("RGB", (24, 16), (n * 30, 80, 160)).save(tmp_path / "in" / f"plate_{n:04d}.png")
    out = tmp_path / "out"
    out.mkdir()
    script = REPO / "examples" / "farm_sequence.py"
    model = sr_model(tmp_path / "sr.onnx", scale=2, mid_channels=4)
    compiled = compile_job(
        tmp_path, input=str(tmp_path / "in" / "plate_####.png"), output=str(out) + "/", frames="1-7",
        chunk_size=3, script=str(script), model_path=str(model),
    )
    assert [t["name"] for t in compiled["tasks"]] == ["upscale-1-2", "upscale-3-4", "upscale-5-7"]
    before: set[str] = set()
    for task in reversed(compiled["tasks"]):  # a farm runs tasks in any order
        args = task_args(task)
        assert args[:2] == ["--python", str(script)]
        # bpy as a module stands in for `blender --background empty.blend --python farm_sequence.py -- ...`
        code = f"import runpy, sys\nsys.argv = ['blender', *{args[2:]!r}]\nrunpy.run_path({str(script)!r}, run_name='__main__')\n"
        env = {**os.environ, "LEAN_IMAGE_AI_MODELS_DIR": str(tmp_path / "models")}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        now = {p.name for p in out.iterdir()}
        first, last = (int(n) for n in task["name"].split("-")[1:])
        assert now - before == {f"plate_upscaled_{n:04d}.png" for n in range(first, last + 1)}  # its label's frames
        before = now
    assert len(before) == 7 and not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]
