"""A fifth model family defined here, in one module and one registry entry, with nothing else of
the add-on edited: it shows up in the command line's subcommands and runs there, in the farm's
subcommands and its worker, in the scene settings, the N-panel and Process Sequence (real bpy), in
the Flamenco job type the command line writes (and its tasks run), is recognised by its own
``identify`` (and its model by no other family), and writes its files. Its model, built here,
inverts the colours (1 - x).

The Blender part and the command-line run happen in fresh interpreters: the operators' and the
scene settings' properties are made from the registry when those modules are imported, so the
family is registered first, as a plug-in would be. The in-process checks put the registry back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from lean_image_ai.models import families, family
from lean_image_ai.models.outputs import OutputPolicy
from lean_image_ai.ui.cli import main as cli
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import save_model
from PIL import Image

TESTS = Path(__file__).resolve().parent

TOY_MODULE = '''
"""Colour inversion: a family written by tests/test_toy_family.py, outside the add-on."""

from dataclasses import dataclass, field

import numpy as np

from lean_image_ai.models.family import Family, Option, Output
from lean_image_ai.models.frame_loop import run_frames
from lean_image_ai.models.identify import NO, SURE, Match
from lean_image_ai.models.imaging import from_nchw, to_nchw
from lean_image_ai.models.result_images import ColourImage


@dataclass
class InvertResult:
    image: np.ndarray  # HxWx3 in 0..1
    input_kind: str = "8-bit"
    warnings: list = field(default_factory=list)


def run(images, model_path, *, options=None, invert_amount=1.0):
    def invert(frame):
        prepared = frame.prepare()
        outputs = frame.run({frame.handle.inputs[0].name: to_nchw(prepared.rgb)})
        inverted = from_nchw(outputs[frame.handle.outputs[0].name])
        mixed = prepared.rgb + invert_amount * (inverted - prepared.rgb)
        return InvertResult(np.clip(mixed, 0.0, 1.0), prepared.kind)

    return run_frames("invert", images, model_path, options, check=None, body=invert)


def identify(model):
    """Its sign: on a probe image, the output is one minus the input."""
    probed = model.probe()
    if probed is None or model.image_input is None:
        return NO
    image = model.feeds[model.image_input.name]
    out = probed[1].get(model.outputs[0].name)
    if out is not None and np.shape(out) == image.shape and np.allclose(out, 1.0 - image, atol=1e-5):
        return Match(SURE, "its output is one minus its input on a probe image")
    return NO


FAMILY = Family(
    id="invert",
    identify=identify,
    looks="a colour-inversion model",
    title="colour inversion",
    produces="the image with its colours inverted",
    run=run,
    settings=(),
    user_defaults={},
    options=(Option("invert_amount", float, 1.0, "Amount", "0: unchanged, 1: fully inverted", min=0.0, max=1.0),),
    action="Invert Colours",
    icon="IMAGE_RGB",
    command="invert",
    output=Output(tag="inverted", what="an inverted image", suffix=".png", float_suffix=".exr", image=ColourImage("image")),
    downloads=({"id": "invert-own", "variant": "own", "title": "Colour inversion (bring your own ONNX)",
                "filename": "invert.onnx", "url": None, "size_bytes": None, "sha256": None,
                "license": "MIT", "source": "tests/test_toy_family.py"},),
)
'''

REGISTER = "import sys\nsys.path.insert(0, {folder!r})\nimport toy_invert\nfrom lean_image_ai.models import families\nfamilies.register(toy_invert.FAMILY)\n"


def invert_model(path: Path) -> Path:
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, "h", "w"])
    one = numpy_helper.from_array(np.ones((1,), np.float32), "one")
    node = helper.make_node("Sub", ["one", "input"], ["output"])
    return save_model(helper.make_graph([node], "invert", [x], [y], [one]), path)


@pytest.fixture
def toy(tmp_path):
    """(folder holding toy_invert.py, the model, a folder of three frames)."""
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "toy_invert.py").write_text(textwrap.dedent(TOY_MODULE))
    model = invert_model(tmp_path / "invert.onnx")
    frames = tmp_path / "plates"
    frames.mkdir()
    rng = np.random.default_rng(0)
    for n in range(1, 4):
        Image.fromarray((rng.random((12, 16, 3)) * 255).astype(np.uint8)).save(frames / f"plate_{n:04d}.png")
    return folder, model, frames


def assert_inverted(source: Path, written: Path) -> None:
    with Image.open(source) as a, Image.open(written) as b:
        expected = 255 - np.asarray(a.convert("RGB"), np.int16)
        got = np.asarray(b.convert("RGB"), np.int16)
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 1, written


@pytest.fixture
def registered_here(toy, monkeypatch):
    """The family registered in this process; the registry is put back after the test."""
    monkeypatch.setattr(families, "ALL", families.ALL)
    monkeypatch.setattr(families, "IDS", families.IDS)
    monkeypatch.setattr(families, "_BY_ID", dict(families._BY_ID))
    monkeypatch.setattr(family, "IDENTIFY_ORDER", list(family.IDENTIFY_ORDER))
    monkeypatch.syspath_prepend(str(toy[0]))
    import toy_invert

    families.register(toy_invert.FAMILY)
    yield toy_invert.FAMILY
    sys.modules.pop("toy_invert", None)


def test_the_command_line_and_the_farm_list_it_with_its_options(registered_here):
    parser = cli.build_parser()
    args = parser.parse_args(["invert", "in.png", "out.png", "--invert-amount", "0.5"])
    assert args.family is registered_here and args.invert_amount == 0.5
    farm = parser.parse_args(["farm", "invert", "in_####.png", "out/", "--workers", "2", "--invert-amount", "0"])
    assert farm.family is registered_here and farm.invert_amount == 0.0 and farm.workers == 2
    with pytest.raises(SystemExit):  # its option's range is checked like the others'
        parser.parse_args(["invert", "in.png", "--invert-amount", "2"])
    assert OutputPolicy.of("invert").default_name("photo") == "photo_inverted.png"
    assert cli.build_parser().parse_args(["invert", "in.png"]).family.command == "invert"
    assert family.command_of("invert") == "invert"
    assert OutputPolicy.of("invert").default_suffix("float") == ".exr"


def test_its_record_brings_its_download_to_the_catalog(registered_here, tmp_path):
    from lean_image_ai.models.store import library

    entry = library.catalog(tmp_path / "models").get("invert-own")
    assert entry.family == "invert" and entry.title == "Colour inversion (bring your own ONNX)"
    assert [e.id for e in library.catalog(tmp_path / "models").entries("invert")] == ["invert-own"]


def test_it_is_recognised_by_its_own_identify_and_its_model_by_no_other_family(registered_here, toy, tmp_path, fresh_runtime):
    from lean_image_ai.models.store import family_check
    from onnx_builders import sr_model

    _, model, _ = toy
    own, _io = family_check.check_file("invert", model, fresh_runtime)
    assert own.fits and own.probed and own.finding.why == "its output is one minus its input on a probe image"
    as_upscale, _io = family_check.check_file("upscale", model, fresh_runtime)
    assert as_upscale.refused
    assert as_upscale.message().startswith("this looks like a colour-inversion model: its output is one minus its input")
    assert "Use invert (Invert Colours in Blender) for it (upscale cannot use it)" in as_upscale.message()
    upscaler, _io = family_check.check_file("invert", sr_model(tmp_path / "sr.onnx", scale=2, mid_channels=4), fresh_runtime)
    assert upscaler.refused and upscaler.finding.looks_like == "upscale"  # asked after the built-ins, it takes none of theirs


def test_the_farm_worker_writes_its_frames(registered_here, toy, tmp_path):
    from lean_image_ai.models.model_run import ModelRun
    from lean_image_ai.ui.cli.farm_worker import FrameWorker

    _, model, frames = toy
    out = tmp_path / "farm_out"
    out.mkdir()
    chunk = [(n, str(frames / f"plate_{n:04d}.png"), str(out / f"plate_inverted_{n:04d}.png")) for n in (1, 2)]
    job = ModelRun.resolve("invert", tmp_path, model_path=str(model), values={"invert_amount": 1.0}, device="cpu")
    worker = FrameWorker(job.for_worker())  # what the farm's driver hands each worker
    messages = list(worker.process(chunk))
    assert [m["frame"] for m in messages if "frame" in m and "error" not in m] == [1, 2], messages
    for _, source, written in chunk:
        assert_inverted(Path(source), Path(written))


def test_the_command_line_runs_it_on_an_image_and_a_folder(toy, tmp_path):
    folder, model, frames = toy
    code = REGISTER.format(folder=str(folder)) + textwrap.dedent(f"""
        from lean_image_ai.ui.cli.main import main
        one = main(["invert", {str(frames / "plate_0001.png")!r}, {str(tmp_path / "one.png")!r},
                    "--model", {str(model)!r}, "--device", "cpu"])
        many = main(["invert", {str(frames)!r}, "--model", {str(model)!r}, "--device", "cpu"])
        sys.exit(one or many)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    assert_inverted(frames / "plate_0001.png", tmp_path / "one.png")
    written = tmp_path / "plates_inverted"  # the family's tag names the default folder
    assert sorted(p.name for p in written.iterdir()) == [f"plate_inverted_{n:04d}.png" for n in (1, 2, 3)]
    for n in (1, 2, 3):
        assert_inverted(frames / f"plate_{n:04d}.png", written / f"plate_inverted_{n:04d}.png")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["command"] == "invert"


BLENDER_CHECK = """
import bpy
import lean_image_ai
from lean_image_ai.ui import panels
sys.path.insert(0, {tests!r})
from recording_layout import RecordingLayout

lean_image_ai.register()
try:
    settings = bpy.context.scene.lean_image_ai
    report = {{"settings": [n for n in ("invert_model", "invert_amount") if n in settings.bl_rna.properties]}}
    family_items = bpy.ops.lean_image_ai.process_sequence.get_rna_type().properties["family"].enum_items
    report["sequence_families"] = [item.identifier for item in family_items]
    settings.invert_amount = 0.75
    for use_sequence in (False, True):
        settings.use_sequence = use_sequence
        layout = RecordingLayout()
        panels._draw_actions(layout, bpy.context)
        buttons = [c for c in layout.operators("lean_image_ai.process_sequence") if c.props.get("family") == "invert"]
        report[f"sequence_buttons_{{use_sequence}}"] = [c.props.get("invert_amount") for c in buttons]
        report[f"labels_{{use_sequence}}"] = [t for t in layout.texts() if "Works on image sequences" in t]
    report["run"] = sorted(bpy.ops.lean_image_ai.process_sequence(
        family="invert", source={frames!r}, output={out!r} + "/", model_path={model!r}, invert_amount=1.0))
finally:
    lean_image_ai.unregister()
print(json.dumps(report))
"""


def test_blender_shows_it_and_process_sequence_writes_its_files(toy, tmp_path):
    pytest.importorskip("bpy")
    sys.path.insert(0, str(TESTS))
    import blender_helpers as bh

    folder, model, frames = toy
    out = tmp_path / "blender_out"
    code = "import json\n" + REGISTER.format(folder=str(folder)) + BLENDER_CHECK.format(
        tests=str(TESTS), frames=str(frames), out=str(out), model=str(model)
    )
    env = bh.isolated_blender_env(tmp_path / "blender", pythonpath=[bh.package_search_dir(tmp_path / "pkg")])
    done = bh.run_python(code, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["settings"] == ["invert_model", "invert_amount"]
    assert report["sequence_families"][-1] == "invert"
    assert report["sequence_buttons_True"] == [0.75]  # the scene's value goes to the button
    assert report["sequence_buttons_False"] == [] and report["labels_False"]  # no single-image operator
    assert report["run"] == ["FINISHED"]
    for n in (1, 2, 3):
        assert_inverted(frames / f"plate_{n:04d}.png", out / f"plate_inverted_{n:04d}.png")


BUTTON_CHECK = """
import bpy
import lean_image_ai
from lean_image_ai.ui import panels
sys.path.insert(0, {tests!r})
from recording_layout import RecordingLayout

lean_image_ai.register()
try:
    layout = RecordingLayout()
    panels._draw_actions(layout, bpy.context)
    report = {{"buttons": [c.text for c in layout.operators("lean_image_ai.invert_colours")]}}
    rna = bpy.ops.lean_image_ai.invert_colours.get_rna_type()
    report["label"] = rna.name
    report["amount"] = "invert_amount" in rna.properties
    report["run"] = sorted(bpy.ops.lean_image_ai.invert_colours(
        filepath={source!r}, output_path={out!r}, model_path={model!r}, invert_amount=1.0))
    report["images"] = sorted(i.name for i in bpy.data.images)
finally:
    lean_image_ai.unregister()
print(json.dumps(report))
"""


def test_its_blender_button_is_made_from_its_record_and_writes_its_image(toy, tmp_path):
    """The record names an operator and has an image output: the add-on makes the operator (no
    class written for it), the N-panel draws its button, and pressing it makes the image."""
    pytest.importorskip("bpy")
    sys.path.insert(0, str(TESTS))
    import blender_helpers as bh

    folder, model, frames = toy
    out = tmp_path / "button_out.png"
    register = REGISTER.format(folder=str(folder)).replace(
        "families.register(toy_invert.FAMILY)",
        "import dataclasses\nfamilies.register(dataclasses.replace(toy_invert.FAMILY, operator='invert_colours'))",
    )
    code = "import json\n" + register + BUTTON_CHECK.format(
        tests=str(TESTS), source=str(frames / "plate_0001.png"), out=str(out), model=str(model)
    )
    env = bh.isolated_blender_env(tmp_path / "blender", pythonpath=[bh.package_search_dir(tmp_path / "pkg")])
    done = bh.run_python(code, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["buttons"] == ["Invert Colours: …"]  # no image open: the button says so, disabled
    assert report["label"] == "Invert Colours" and report["amount"]
    assert report["run"] == ["FINISHED"]
    assert "plate_0001_inverted" in report["images"]  # the output's tag names the new image
    assert_inverted(frames / "plate_0001.png", out)


def test_a_family_naming_an_operator_its_result_cannot_make_is_refused_at_registration(toy, tmp_path):
    """A result that is not one image (a writer of its own) gets no operator from its record."""
    pytest.importorskip("bpy")
    sys.path.insert(0, str(TESTS))
    import blender_helpers as bh

    folder, _, _ = toy
    code = REGISTER.format(folder=str(folder)).replace(
        "families.register(toy_invert.FAMILY)",
        "import dataclasses\nfrom lean_image_ai.models.family import Output\n"
        "files = Output(tag='inverted', what='a point list', suffix='.ply', formats=('.ply',), write=lambda *a: [])\n"
        "families.register(dataclasses.replace(toy_invert.FAMILY, operator='invert_colours', output=files))",
    ) + textwrap.dedent("""
        import bpy
        import lean_image_ai
        try:
            lean_image_ai.register()
        except RuntimeError as exc:
            print("refused:", exc)
            print("panel registered:", hasattr(bpy.types, "LEAN_IMAGE_AI_PT_view3d"))
        else:
            print("registered")
    """)
    env = bh.isolated_blender_env(tmp_path / "blender", pythonpath=[bh.package_search_dir(tmp_path / "pkg")])
    done = bh.run_python(code, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused:" in done.stdout and "invert (lean_image_ai.invert_colours)" in done.stdout, done.stdout
    assert "panel registered: False" in done.stdout


RENDER_NODE = """
import runpy
sys.argv = ["blender", *{args!r}]
runpy.run_path({script!r}, run_name="__main__")
"""


def test_flamenco_offers_it_and_its_tasks_write_its_frames(toy, tmp_path):
    pytest.importorskip("bpy")
    import test_flamenco_job as flamenco

    if flamenco.NODE is None:
        pytest.skip("node is not installed: the job type cannot be run here")
    folder, model, frames = toy
    job_type = tmp_path / "scripts" / "lean_image_ai.js"
    job_type.parent.mkdir()
    code = REGISTER.format(folder=str(folder)) + f"from lean_image_ai.ui.cli.main import main\nsys.exit(main(['flamenco-job-type', {str(job_type.parent)!r}]))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    out = tmp_path / "flamenco_out"
    out.mkdir()
    script = flamenco.REPO / "examples" / "farm_sequence.py"
    compiled = flamenco.compile_job(
        tmp_path, job_type, command="invert", input=str(frames / "plate_####.png"), output=str(out) + "/",
        frames="1-3", chunk_size=2, script=str(script), model_path=str(model),
    )
    (command,) = [s for s in compiled["job_type"]["settings"] if s["key"] == "command"]
    assert command["choices"][-1] == "invert" and command["choices"][:-1] == [f.command for f in families.ALL]
    assert [t["name"] for t in compiled["tasks"]] == ["invert-1-1", "invert-2-3"]
    env = {**os.environ, "LEAN_IMAGE_AI_MODELS_DIR": str(tmp_path / "models")}
    for task in compiled["tasks"]:  # as a render node with the plug-in installed runs it (bpy stands in for Blender)
        args = flamenco.task_args(task)
        code = REGISTER.format(folder=str(folder)) + RENDER_NODE.format(args=args[2:], script=str(script))
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"plate_inverted_{n:04d}.png" for n in (1, 2, 3)]
    for n in (1, 2, 3):
        assert_inverted(frames / f"plate_{n:04d}.png", out / f"plate_inverted_{n:04d}.png")
