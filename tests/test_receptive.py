"""Receptive radius from the ONNX graph, the default overlap, exact tiles and deterministic plans."""

from __future__ import annotations

import numpy as np
import pytest
from builders_upscale import compact_model, global_context_model
from lean_image_ai.models.adapters import upscale
from lean_image_ai.models.base import RunOptions
from lean_image_ai.models.tiles import tile_memory
from lean_image_ai.models.tiles.receptive import graph_receptive_field
from lean_image_ai.runtime.core import Runtime, RuntimeSettings
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import save_model, sr_model


def opts(runtime):
    return RunOptions(device="cpu", runtime=runtime)


@pytest.fixture
def runtime():
    rt = Runtime(RuntimeSettings(intra_op_threads=2))
    yield rt
    rt.clear()


def picture(h, w, seed=0):
    return np.random.default_rng(seed).random((h, w, 3), dtype=np.float32)


@pytest.mark.parametrize("num_conv,radius", [(16, 18), (32, 34)])
def test_radius_of_compact_nets_is_read_from_the_graph(tmp_path, num_conv, radius):
    found = graph_receptive_field(compact_model(tmp_path / f"c{num_conv}.onnx", num_conv=num_conv))
    assert (found.radius, found.how) == (radius, "graph")


def test_small_and_builtin_models_and_a_global_one(tmp_path):
    assert graph_receptive_field(sr_model(tmp_path / "sr.onnx")).radius == 2
    assert graph_receptive_field(upscale.DEFAULT_MODEL_PATH).radius == 2  # a cubic resize: 2 taps
    found = graph_receptive_field(global_context_model(tmp_path / "g.onnx"))
    assert found.is_global and found.detail == "GlobalAveragePool"


@pytest.fixture(scope="module")
def compact32(tmp_path_factory):
    return compact_model(tmp_path_factory.mktemp("compact") / "c32.onnx", num_conv=32, scale=4)


@pytest.mark.parametrize("tile", [76, 90, 128])
def test_tiles_equal_one_whole_run_bit_for_bit_with_the_default_overlap(runtime, compact32, tile):
    image = picture(83, 101, seed=tile)
    whole = upscale.run(image, compact32, options=opts(runtime), tile_size=None)
    tiled = upscale.run(image, compact32, options=opts(runtime), tile_size=tile)
    assert whole.overlap == tiled.overlap == 34 and tiled.receptive_radius == 34
    assert tiled.exact and not tiled.warnings
    assert tiled.tile_size_used <= tile
    np.testing.assert_array_equal(tiled.image, whole.image)  # the whole image, borders included


def test_overlap_below_the_radius_warns_and_differs(runtime, compact32):
    image = picture(83, 101, seed=1)
    whole = upscale.run(image, compact32, options=opts(runtime), tile_size=None)
    short = upscale.run(image, compact32, options=opts(runtime), tile_size=76, overlap=16)
    assert not short.exact and any("below" in w and "34 px" in w for w in short.warnings)
    assert not np.array_equal(short.image, whole.image)


def test_a_global_model_is_reported_as_not_exactly_tileable(tmp_path, runtime):
    model = global_context_model(tmp_path / "g.onnx")
    image = picture(150, 160)  # past the smallest window a 32 px overlap and its feather allow (136)
    one = upscale.run(image, model, options=opts(runtime))  # auto: one window, exact
    assert one.exact and one.receptive_radius is None
    tiled = upscale.run(image, model, options=opts(runtime), tile_size=48)
    assert not tiled.exact and tiled.receptive_radius is None and tiled.feather == 16  # blended
    assert any("cannot be tiled exactly" in w for w in tiled.warnings)


def test_an_op_the_walk_does_not_know_is_measured_by_a_probe(tmp_path, runtime):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((12, 3, 5, 5)) * 0.2).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["input", "w"], ["c"], pads=[2, 2, 2, 2]),
            helper.make_node("Softsign", ["c"], ["s"]),  # local, but not in the walk's tables
            helper.make_node("DepthToSpace", ["s"], ["output"], blocksize=2, mode="CRD"),
        ],
        "probe",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, "OH", "OW"])],
        [w],
    )
    model = save_model(graph, tmp_path / "softsign.onnx")
    assert graph_receptive_field(model).radius is None
    result = upscale.run(picture(30, 30), model, options=opts(runtime), tile_size=24)
    # a probe measures, it does not prove: tiled, the result is never reported exact
    assert result.receptive_radius == 2 and result.overlap == 2 and not result.exact
    assert any("measured by an impulse probe, not proven" in w and "not exact" in w for w in result.warnings)
    one = upscale.run(picture(30, 30), model, options=opts(runtime), tile_size=None)
    assert one.exact  # one window is one whole-image run, whatever the radius


def resize_by_constant(path, constant: dict):
    """Conv 5x5 then a nearest x2 Resize whose scales sit in a `Constant` node, as
    `torch.onnx.export` writes them (`constant`: the node's attribute)."""
    w = numpy_helper.from_array(np.full((3, 3, 5, 5), 0.04, np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["input", "w"], ["c"], pads=[2, 2, 2, 2]),
            helper.make_node("Constant", [], ["scales"], **constant),
            helper.make_node("Resize", ["c", "", "scales"], ["r"], mode="nearest"),
            helper.make_node("Conv", ["r", "w"], ["output"], pads=[2, 2, 2, 2]),
        ],
        "constant_scales",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, "OH", "OW"])],
        [w],
    )
    return save_model(graph, path)


SCALES = [1.0, 1.0, 2.0, 2.0]


@pytest.mark.parametrize(
    "constant",
    [
        {"value": numpy_helper.from_array(np.array(SCALES, np.float32), "scales_value")},
        {"value_floats": SCALES},
    ],
    ids=["value", "value_floats"],
)
def test_resize_scales_in_a_constant_node_are_read(tmp_path, constant):
    found = graph_receptive_field(resize_by_constant(tmp_path / "c.onnx", constant))
    # 2 px before the x2 resize, then 2 output px = 1 input px after it
    assert (found.radius, found.scale, found.proven) == (3, 2.0, True)


def test_a_catalog_figure_is_exact_only_when_the_graph_proves_it(tmp_path, runtime):
    model = resize_by_constant(tmp_path / "c.onnx", {"value_floats": SCALES})
    covered = upscale.run(picture(30, 30), model, options=opts(runtime), tile_size=24, model_overlap=4)
    assert covered.exact and covered.overlap == 4
    short = upscale.run(picture(30, 30), model, options=opts(runtime), tile_size=24, model_overlap=2)
    assert not short.exact and short.overlap == 2


def test_the_catalog_figure_and_the_size_multiple(runtime, tmp_path):
    model = sr_model(tmp_path / "sr.onnx")
    assert upscale.run(picture(20, 20), model, options=opts(runtime), model_overlap=5).overlap == 5
    assert upscale.run(picture(20, 20), model, options=opts(runtime), size_multiple=8).overlap == 8


def test_overlap_is_an_artist_option_with_auto_default():
    option = upscale.FAMILY.option("overlap")
    assert option.default == -1 and option.min == -1
    kwargs = upscale.FAMILY.adapter_kwargs({"tile_overlap": 12}, overlap=-1, tile_size=0)
    assert kwargs == {"model_overlap": 12, "overlap": -1, "tile_size": 0}


def test_the_same_job_gives_the_same_plan_and_bytes_whatever_memory_is_free(runtime, compact32, monkeypatch):
    image = picture(96, 80, seed=3)
    runs = []
    for free in (600 << 20, 64 << 30):
        monkeypatch.setattr(tile_memory, "available_system_memory_bytes", lambda free=free: free)
        runs.append(upscale.run(image, compact32, options=opts(runtime)))
    assert runs[0].tile_size_used == runs[1].tile_size_used
    assert runs[0].image.tobytes() == runs[1].image.tobytes()
