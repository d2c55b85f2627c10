"""The family check (models/store/family_check.py): every registered family's stand-in against every
family (each identified by its own ``identify``), the declared order they are asked in, the probe for
what the graph cannot tell, and a job refusing a file of another family, or of no family."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from builders_families import ben2_like_model, da3_like_model, photo
from builders_moge2 import moge2_like_model
from builders_upscale import resize_model
from lean_image_ai.models import families, family
from lean_image_ai.models.adapters import ben2, da3
from lean_image_ai.models.base import RunOptions
from lean_image_ai.models.identify import ModelView, final_ops
from lean_image_ai.models.store import family_check
from lean_image_ai.runtime.errors import ModelContractError
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import save_model, sr_model
from PIL import Image

FAMILIES = families.IDS  # a family registered in the add-on without a stand-in below fails the first test


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("standins")
    return {
        "ben2": ben2_like_model(root / "ben2.onnx", size=64),
        "da3": da3_like_model(root / "da3.onnx", fixed_hw=(56, 84)),
        "moge2": moge2_like_model(root / "moge2.onnx"),
        "upscale": sr_model(root / "sr.onnx", scale=4),
    }


def test_every_registered_family_has_a_stand_in_and_its_own_signs(standins):
    assert set(standins) == set(FAMILIES)
    assert all(families.get(f).identify is not None and families.get(f).looks for f in FAMILIES)


@pytest.mark.parametrize("claimed", FAMILIES)
@pytest.mark.parametrize("actual", FAMILIES)
def test_each_family_against_each_stand_in(standins, fresh_runtime, claimed, actual):
    verdict, _io = family_check.check_file(claimed, standins[actual], fresh_runtime)
    assert verdict.finding.looks_like == actual, verdict.message()
    if claimed == actual:
        assert verdict.fits and not verdict.refused and verdict.warning is None
    else:
        assert verdict.refused, verdict.message()
        assert f"this looks like {families.get(actual).looks}" in verdict.message()
        assert f"Use {families.get(actual).command} ({families.get(actual).action} in Blender)" in verdict.message()
    assert fresh_runtime.cached_sessions() == []  # the check's session was dropped again


def test_a_final_sigmoid_is_found_through_shape_only_ops(standins):
    # the stand-in ends Sigmoid -> Identity; the SR stand-in ends in DepthToSpace
    assert final_ops(standins["ben2"]) == {"output": "Sigmoid"}
    assert final_ops(standins["upscale"]) == {"output": "DepthToSpace"}
    assert final_ops(Path(__file__)) == {}  # not an ONNX file: nothing, no error


@pytest.mark.parametrize("joined,final", [(["m"], "Sigmoid"), (["m", "m"], "Concat")])
def test_a_concat_of_one_input_is_looked_through_and_of_two_is_not(tmp_path, joined, final):
    # BEN2's forward ends torch.cat([matte]) over a batch of one: exported, a one-input Concat
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["m"]), helper.make_node("Concat", joined, ["y"], axis=0)],
        "joined",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [len(joined), 1, 8, 8])],
    )
    path = tmp_path / "joined.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert final_ops(path) == {"y": final}


def test_a_dynamic_upscaler_is_told_by_the_probe(tmp_path, fresh_runtime):
    path = resize_model(tmp_path / "x3.onnx", factor=3.0)  # dynamic shapes: the graph cannot tell
    verdict, _io = family_check.check_file("ben2", path, fresh_runtime)
    assert verdict.probed and verdict.refused
    assert "3x the probe (56x56 -> 168x168)" in verdict.message()
    assert family_check.check_file("upscale", path, fresh_runtime)[0].fits


def test_a_one_times_image_model_fits_no_family_and_is_refused(tmp_path, fresh_runtime):
    path = resize_model(tmp_path / "x1.onnx", factor=1.0)
    verdict, _io = family_check.check_file("upscale", path, fresh_runtime)
    assert verdict.finding.looks_like is None and verdict.refused and verdict.probed
    assert verdict.message() == ("this does not look like a super-resolution model or any model the add-on runs: "
                                 "on a 56x56 probe its outputs are 'output' [1, 3, 56, 56].")


def test_probe_ranges_decide_matte_or_depth_but_only_warn(tmp_path, fresh_runtime):
    # no Sigmoid, no 'depth' name: values in [0, 1] look like a matte, positive unbounded like depth
    matte = ben2_like_model(tmp_path / "constant.onnx", output="constant", constant=0.8, fixed=False)
    depth = da3_like_model(tmp_path / "unnamed.onnx", fixed_hw=None, depth_name="out", with_sky=False)
    as_depth, _ = family_check.check_file("da3", matte, fresh_runtime)
    assert as_depth.finding.looks_like == "ben2" and not as_depth.refused
    assert "within [0, 1] (values 0.8 to 0.8 on a probe image)" in as_depth.warning
    as_matte, _ = family_check.check_file("ben2", depth, fresh_runtime)
    assert as_matte.finding.looks_like == "da3" and not as_matte.refused
    assert "unbounded and positive" in as_matte.warning
    assert family_check.check_file("da3", depth, fresh_runtime)[0].fits


def test_a_job_refuses_a_model_of_another_family(standins, fresh_runtime):
    options = RunOptions(runtime=fresh_runtime)
    with pytest.raises(ModelContractError, match="this looks like a depth model: an output named 'depth'"):
        ben2.run(photo(), standins["da3"], options=options)
    with pytest.raises(ModelContractError, match="this looks like a background-removal"):
        da3.run(photo(), standins["ben2"], options=options)
    assert ben2.run(photo(), standins["ben2"], options=options).matte.shape == (37, 53)


LOOKS = {"ben2": "a background-removal", "da3": "a depth model", "moge2": "a MoGe-2", "upscale": "a super-resolution"}


@pytest.mark.parametrize("asked", ["upscale", "moge2"])
@pytest.mark.parametrize("given", ["ben2", "da3"])
def test_a_family_whose_contract_another_familys_file_fails_says_what_it_looks_like(standins, fresh_runtime, asked, given):
    """Upscale's and MoGe-2's own shape checks come first; a file that is plainly another family's
    is still refused with what it looks like and which button takes it (before: 'does not look
    like a super-resolution model: expected 3 channels, found 1')."""
    adapter = families.get(asked).run
    with pytest.raises(ModelContractError) as refused:
        adapter(photo(), standins[given], options=RunOptions(runtime=fresh_runtime))
    assert f"this looks like {LOOKS[given]}" in str(refused.value), str(refused.value)


REFERENCE_MANIFEST = Path(
    os.environ.get("LEAN_IMAGE_AI_REFERENCE_DIR", Path.home() / ".cache/lean_image_ai/reference_models")
) / "manifest.json"


def _reference_models():
    if not REFERENCE_MANIFEST.is_file():
        return []
    data = json.loads(REFERENCE_MANIFEST.read_text())
    items = data.get("models", data) if isinstance(data, dict) else data
    items = list(items.values()) if isinstance(items, dict) else items  # {name: record} or [record]
    found = []
    for item in items:
        family = item.get("family")
        path = REFERENCE_MANIFEST.parent / item.get("file", item.get("path", ""))
        if family in FAMILIES and path.is_file():
            found.append(pytest.param(family, path, id=path.name))
    return found


@pytest.mark.skipif(not _reference_models(), reason=f"no real-architecture exports at {REFERENCE_MANIFEST}")
@pytest.mark.parametrize("family,path", _reference_models() or [pytest.param(None, None, id="none")])
def test_real_architectures_fit_their_own_family_only(family, path, fresh_runtime):
    own, _ = family_check.check_file(family, path, fresh_runtime)
    assert own.fits, own.message()
    for other in FAMILIES:  # what the file looks like does not depend on the family asked for
        if other != family:
            assert family_check.Verdict(other, own.finding).refused, own.message()


def test_probe_feeds_follow_the_inputs(standins, fresh_runtime):
    handle = fresh_runtime.session(standins["moge2"], "cpu")
    feeds = family_check.probe_feeds(handle)
    assert feeds["image"].shape == (1, 3, 56, 56) and feeds["image"].dtype == np.float32
    assert feeds["num_tokens"].dtype == np.int64 and int(feeds["num_tokens"]) == family_check.PROBE_NUM_TOKENS


# ---- a model no family recognises; the order the families are asked in --------------------------


def one_conv_model(path: Path) -> Path:
    """One 1x1 conv, RGB -> one channel (R - G): the shape of a matte, values of neither a matte nor depth."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "h", "w"])
    weight = numpy_helper.from_array(np.array([1.0, -1.0, 0.0], np.float32).reshape(1, 3, 1, 1), "w")
    return save_model(helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "one_conv", [x], [y], [weight]), path)


LOOKS_OF_ONE_CONV = "one channel ('y') at the input size with negative values (values -1 to 1 on a probe image)"


@pytest.mark.parametrize("claimed", FAMILIES)
def test_a_one_conv_single_channel_model_is_refused_by_every_family_saying_what_it_looks_like(tmp_path, fresh_runtime, claimed):
    verdict, _io = family_check.check_file(claimed, one_conv_model(tmp_path / "one_conv.onnx"), fresh_runtime)
    assert verdict.refused and verdict.finding.looks_like is None
    assert verdict.message() == (f"this does not look like {families.get(claimed).looks} or any model the add-on runs: "
                                 f"{LOOKS_OF_ONE_CONV}.")


def test_a_one_conv_single_channel_model_is_not_run_as_remove_background(tmp_path, fresh_runtime, capsys):
    from lean_image_ai.ui.cli.main import main

    path = one_conv_model(tmp_path / "one_conv.onnx")
    with pytest.raises(ModelContractError, match=r"one_conv.onnx: this does not look like a background-removal"):
        ben2.run(photo(), path, options=RunOptions(runtime=fresh_runtime))
    Image.fromarray(photo()).save(tmp_path / "photo.png")
    code = main(["remove-background", str(tmp_path / "photo.png"), str(tmp_path / "cut.png"), "--model", str(path), "--device", "cpu"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and LOOKS_OF_ONE_CONV in line, line
    assert not (tmp_path / "cut.png").exists()


def relu_model(path: Path, weights=(3.0, 3.0, 3.0)) -> Path:
    """One 1x1 conv and a Relu, RGB -> one channel: the shape of a matte, positive values far past 1."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "h", "w"])
    weight = numpy_helper.from_array(np.array(weights, np.float32).reshape(1, 3, 1, 1), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    return save_model(helper.make_graph(nodes, "relu", [x], [y], [weight]), path)


def test_a_relu_output_run_as_remove_background_says_what_it_looks_like(tmp_path, fresh_runtime, capsys):
    """Issue #39 item 15: the probe's unbounded values point to depth (a warning, not a refusal),
    but the job dropped the warning: the cut-out came out without a word."""
    from lean_image_ai.ui.cli.main import main

    path = relu_model(tmp_path / "relu.onnx")
    looks = "relu.onnx: this looks like a depth model: one channel ('y') at the input size, unbounded and positive"
    result = ben2.run(photo(), path, options=RunOptions(runtime=fresh_runtime))
    assert [w for w in result.warnings if w.startswith(looks)] and "use depth" in result.warnings[-1], result.warnings
    Image.fromarray(photo()).save(tmp_path / "photo.png")
    code = main(["remove-background", str(tmp_path / "photo.png"), str(tmp_path / "cut.png"), "--model", str(path), "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0 and out.count(f"warning: {looks}") == 1, out
    # a model that fits its family gets no such line
    assert not [w for w in ben2.run(photo(), ben2_like_model(tmp_path / "b.onnx", fixed=False), options=RunOptions(runtime=fresh_runtime)).warnings
                if "looks like" in w]


def test_the_families_are_asked_in_their_declared_order(standins, fresh_runtime, monkeypatch):
    # a MoGe-2 export's mask is one channel ending in a Sigmoid: alone, a sure sign of a matte
    handle = fresh_runtime.session(standins["moge2"], "cpu")
    view = ModelView(handle, final_ops(standins["moge2"]))
    assert families.get("ben2").identify(view).confidence == families.get("moge2").identify(view).confidence == 1.0
    assert [f.id for f in family.IDENTIFY_ORDER].index("moge2") < [f.id for f in family.IDENTIFY_ORDER].index("ben2")
    assert family_check.ask_families(view)[0].id == "moge2"
    monkeypatch.setattr(family, "IDENTIFY_ORDER", sorted(family.IDENTIFY_ORDER, key=lambda f: f.id != "ben2"))
    assert family_check.ask_families(view)[0].id == "ben2"  # asked first, the matte's sign wins the tie


def test_a_registered_family_is_asked_after_the_built_ins_unless_it_asks_first(standins, fresh_runtime, monkeypatch):
    import dataclasses

    from lean_image_ai.models.identify import Match

    monkeypatch.setattr(families, "ALL", families.ALL)
    monkeypatch.setattr(families, "IDS", families.IDS)
    monkeypatch.setattr(families, "_BY_ID", dict(families._BY_ID))
    monkeypatch.setattr(family, "IDENTIFY_ORDER", list(family.IDENTIFY_ORDER))
    greedy = dataclasses.replace(families.get("upscale"), id="greedy", command="greedy", options=(),
                                 identify=lambda model: Match(1.0, "it takes anything"))
    families.register(greedy)
    view = ModelView(fresh_runtime.session(standins["da3"], "cpu"), final_ops(standins["da3"]))
    assert family_check.ask_families(view)[0].id == "da3"
    family.IDENTIFY_ORDER.remove(greedy)
    family.IDENTIFY_ORDER.insert(0, greedy)
    assert family_check.ask_families(view)[0].id == "greedy"
