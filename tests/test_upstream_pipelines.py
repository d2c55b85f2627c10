"""The add-on's public outputs against the upstream projects' own inference, on the seeded exports
(tools/reference_models.py) and the same seeded torch nets, on two real photos of different aspect
(scikit-image's coffee at 640x360 and chelsea at 320x240; issue 42).

Upstream here: DA3's InputProcessor -> net -> OutputProcessor (what `DepthAnything3.inference`
runs for one view without cameras; `depth_anything_3.api` itself imports moviepy and open3d, which
the --no-deps install lacks), `MoGeModel.infer` with a given fov, BEN2.py's `inference`
(tools/ben2_model.py). torchvision does not load beside the CPU torch wheel here: DA3's
InputProcessor gets its ToTensor and Normalize as the two torch operations they are.
"""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from lean_image_ai.models.adapters import da3, moge2
from lean_image_ai.models.imaging import resize
from test_real_models import (  # noqa: F401 (the fixtures)
    _missing,
    ben2_base,
    da3_small,
    da3_small_dynamic,
    moge2_vits,
    opts,
)

pytestmark = pytest.mark.real_models
TOOLS = Path(__file__).resolve().parents[1] / "tools"
FOV_X = 60.0


def _photo(name: str, size: tuple[int, int]) -> np.ndarray:
    skimage_data = pytest.importorskip("skimage.data", reason="scikit-image is in the reference extra")
    from PIL import Image

    return np.asarray(Image.fromarray(getattr(skimage_data, name)()).resize(size, Image.LANCZOS))


PHOTOS = [("coffee", (640, 360)), ("chelsea", (320, 240))]


def _builds():
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    import reference_builds

    return reference_builds


def _torchvision_transforms():
    """ToTensor and Normalize as torchvision writes them, where torchvision cannot load."""
    try:
        import torchvision.transforms  # noqa: F401

        return
    except Exception:  # noqa: BLE001 (an ImportError or the CPU wheel's missing operator)
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
    import torch

    class ToTensor:
        def __call__(self, picture):
            array = torch.from_numpy(np.array(picture, copy=True))
            return array.permute(2, 0, 1).contiguous().to(torch.float32).div(255)

    class Normalize:
        def __init__(self, mean, std):
            self.mean, self.std = torch.as_tensor(mean), torch.as_tensor(std)

        def __call__(self, tensor):
            return tensor.sub(self.mean[:, None, None]).div(self.std[:, None, None])

    package, transforms = types.ModuleType("torchvision"), types.ModuleType("torchvision.transforms")
    transforms.ToTensor, transforms.Normalize = ToTensor, Normalize
    package.transforms = transforms
    sys.modules["torchvision"], sys.modules["torchvision.transforms"] = package, transforms


def _range_diff(ours, theirs) -> tuple[float, float]:
    span = float(theirs.max() - theirs.min())
    difference = np.abs(ours - theirs)
    return float(difference.max()) / span, float(difference.mean()) / span


def _da3_upstream(reference: str):
    """Upstream DA3's inference on the torch net a reference export was made from."""
    if _missing("imageio"):
        pytest.skip("imageio (scikit-image's) not installed")
    import torch

    _torchvision_transforms()
    from depth_anything_3.utils.io.input_processor import InputProcessor
    from depth_anything_3.utils.io.output_processor import OutputProcessor

    net = _builds().REFERENCES[reference].build().net.eval()

    def infer(picture):
        images, _, _ = InputProcessor()([picture], None, None, 504, "upper_bound_resize", num_workers=1)
        with torch.no_grad():  # fp32, as the export (inference's autocast is a GPU speed-up)
            return OutputProcessor()(net(images[None].float())).depth[0]

    return infer


@pytest.fixture(scope="module")
def da3_upstream(da3_small):  # noqa: F811
    return _da3_upstream("da3-small")


@pytest.fixture(scope="module")
def da3_dynamic_upstream(da3_small_dynamic):  # noqa: F811
    return _da3_upstream("da3-small-dynamic")


def test_da3_depth_is_upstreams_at_16_9(da3_small, da3_upstream, fresh_runtime):  # noqa: F811
    picture = _photo("coffee", (640, 360))
    ours = da3.run(picture, da3_small, options=opts(fresh_runtime))
    theirs = da3_upstream(picture)
    assert theirs.shape == ours.model_size == (280, 504)
    # upstream stops at the model's size; the same bilinear to the picture's size on both sides
    worst, mean = _range_diff(
        ours.depth, resize(theirs.astype(np.float32), picture.shape[:2], kernel="linear")
    )
    print(f"DA3 16:9, fixed 280x504 export: depth {worst:.4%} max, {mean:.5%} mean of the range")
    assert mean <= 0.001 and worst <= 0.01


@pytest.mark.parametrize("name,size", PHOTOS)
def test_da3_depth_is_upstreams_on_a_dynamic_export(
    da3_small_dynamic,  # noqa: F811
    da3_dynamic_upstream,
    fresh_runtime,
    name,
    size,
):
    picture = _photo(name, size)
    ours = da3.run(picture, da3_small_dynamic, options=opts(fresh_runtime))
    theirs = da3_dynamic_upstream(picture)
    assert theirs.shape == ours.model_size  # 280x504 at 16:9, 378x504 at 4:3: the picture's aspect
    assert not ours.warnings
    worst, mean = _range_diff(
        ours.depth, resize(theirs.astype(np.float32), picture.shape[:2], kernel="linear")
    )
    print(f"DA3 {name} {size[0]}x{size[1]}, dynamic export: depth {worst:.4%} max, {mean:.5%} mean of the range")
    assert mean <= 0.001 and worst <= 0.01


@pytest.mark.parametrize("height,width", [(378, 504), (504, 378), (196, 140)])
def test_da3_dynamic_export_is_its_torch_net_at_sizes_other_than_its_sample(
    da3_small_dynamic,  # noqa: F811
    fresh_runtime,
    height,
    width,
):
    """Exported at 280x504: a size traced as a constant fails at another size, or resamples the
    position table wrongly (scales from sizes instead of DINOv2's +0.1 offsets: 0.26 % of the range
    at 378x504, inside the pipeline bounds above, 500 times this test's)."""
    import torch

    net = _builds().REFERENCES["da3-small-dynamic"].build().eval()
    image = torch.rand(1, 3, height, width, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = [t.numpy() for t in net(image)]
    with fresh_runtime.operation("da3") as op:
        handle = op.session(da3_small_dynamic, "cpu")
        out = op.run(handle, {"image": image.numpy()}, last=True, output_names=["depth", "depth_conf"])
    for name, theirs in zip(("depth", "depth_conf"), expected, strict=True):
        assert out[name].shape == theirs.shape == (1, 1, height, width)
        worst, _ = _range_diff(out[name], theirs)
        assert worst <= 5e-5, f"{name}: {worst:.2e} of the range"


def test_da3_on_a_fixed_16_9_export_stretches_4_3_as_the_closer_of_the_two_fits(
    da3_small,  # noqa: F811
    da3_upstream,
    fresh_runtime,  # noqa: F811
):
    picture = _photo("chelsea", (320, 240))
    theirs = da3_upstream(picture)
    assert theirs.shape == (378, 504)  # upstream keeps the aspect; the export cannot
    theirs = resize(theirs.astype(np.float32), picture.shape[:2], kernel="linear")
    stretched = da3.run(picture, da3_small, options=opts(fresh_runtime))
    boxed = da3.run(picture, da3_small, options=opts(fresh_runtime), fixed_fit="letterbox")
    figures = {fit: _range_diff(r.depth, theirs) for fit, r in (("stretch", stretched), ("letterbox", boxed))}
    print(f"DA3 4:3 on the 280x504 export: {figures}")
    assert figures["stretch"][1] < figures["letterbox"][1]  # the default is the closer
    assert any("stretched" in w for w in stretched.warnings)


@pytest.fixture(scope="module")
def moge2_upstream(moge2_vits):  # noqa: F811
    import torch

    model = _builds()._moge2_vits().eval()
    model.onnx_compatible_mode = False  # MoGe's own mode: its encoder antialiases

    def infer(picture, num_tokens):
        tensor = torch.from_numpy(picture.copy()).permute(2, 0, 1).float() / 255
        with torch.no_grad():
            run = model.infer(tensor, num_tokens=num_tokens, fov_x=FOV_X, use_fp16=False)
            out = {k: v.numpy() for k, v in run.items()}
            # infer()'s mask before its positive-depth cut: forward()'s
            forward = model(tensor[None], torch.tensor(num_tokens))
            out["forward_mask"] = forward["mask"][0].numpy() > 0.5
            out["forward_z"] = forward["points"][0, :, :, 2].numpy()  # affine z, before any shift
            out["metric_scale"] = float(forward["metric_scale"][0])
            # MoGe's forward() with the export's one in-graph difference: its ViT's position
            # embedding resized to the grid's size (ONNX mode), not by a scale with DINOv2's 0.1
            # offset (moge/model/dinov2/models/vision_transformer.py interpolate_pos_encoding)
            model.encoder.backbone.onnx_compatible_mode = True
            try:
                as_exported = model(tensor[None], torch.tensor(num_tokens))
            finally:
                model.encoder.backbone.onnx_compatible_mode = False
            out["exported_mask"] = as_exported["mask"][0].numpy() > 0.5
            out["exported_normal"] = as_exported["normal"][0].numpy()
        return out

    return infer


# coffee and chelsea are smaller than MoGe-2's top token grid (the export enlarges them as MoGe
# does); coffee at 1600x900 with 1200 tokens is shrunk 2.5x to its 364x644 grid, through the
# least-norm preimage the adapter feeds (resampling.antialiased_preimage)
MOGE2_CASES = [("coffee", (640, 360), None), ("chelsea", (320, 240), None), ("coffee", (1600, 900), 1200)]


@pytest.mark.parametrize("name,size,tokens", MOGE2_CASES)
def test_moge2_mask_and_normals_are_upstreams_with_a_given_camera(
    moge2_vits,  # noqa: F811
    moge2_upstream,
    fresh_runtime,
    name,
    size,
    tokens,
):
    picture = _photo(name, size)
    focal_width = 0.5 / math.tan(math.radians(FOV_X) / 2)
    ours = moge2.run(picture, moge2_vits, options=opts(fresh_runtime), focal_width=focal_width, num_tokens=tokens)
    theirs = moge2_upstream(picture, ours.num_tokens)
    width, height = size
    expected = theirs["intrinsics"][:2, :2] * np.array([[width], [height]])
    np.testing.assert_allclose(ours.intrinsics[:2, :2], expected, rtol=1e-5)
    # the positive-depth cut follows each side's shift (the robust solver stays, docs/models.md):
    # upstream's mask is compared under our cut
    iou, angles = _mask_iou_and_normal_angles(ours, theirs["forward_mask"], theirs["normal"])
    # what the adapter's pipeline controls (feed, resizes, activations): against MoGe's forward()
    # with the export's position embedding, float noise; the rest of the gap above is the export's
    exact_iou, exact_angles = _mask_iou_and_normal_angles(ours, theirs["exported_mask"], theirs["exported_normal"])
    # depth: each side's shift for the given focal (our robust solver's, MoGe's least squares from
    # 0) on a seeded map no pinhole camera explains; far apart, and the affine z cannot be read
    # back from a depth that far off (float32), so only printed
    both = ours.mask & theirs["forward_mask"]
    theirs_shift = np.median(theirs["depth"][both] / theirs["metric_scale"] - theirs["forward_z"][both])
    print(
        f"MoGe-2 {name} {width}x{height}: mask IoU {iou:.4f}, normals {angles.mean():.3f} degrees mean "
        f"({angles.max():.2f} max); with the export's position embedding: mask IoU {exact_iou:.5f}, "
        f"normals {exact_angles.mean():.4f} degrees mean ({exact_angles.max():.3f} max); metric scale "
        f"{ours.metric_scale / theirs['metric_scale'] - 1:+.1e}; shift {ours.shift:.4g} (MoGe's "
        f"{theirs_shift:.4g}, affine z {theirs['forward_z'][both].min():.3g}..{theirs['forward_z'][both].max():.3g})"
    )
    assert iou >= 0.98
    # fed at the picture's size, the export resizes the raw normals before normalising them, as
    # MoGe does (0.09 / 0.18 degrees mean measured on the first two; at the heads' size 3.1 / 1.6)
    assert angles.mean() <= 1.0
    assert exact_iou >= 0.999 and exact_angles.mean() <= 0.05


def _mask_iou_and_normal_angles(ours, mask, normal):
    """Mask IoU (theirs under our positive-depth cut) and the normals' angles where both masks hold."""
    theirs_mask = mask & (ours.depth > 0)
    iou = (ours.mask & theirs_mask).sum() / max((ours.mask | theirs_mask).sum(), 1)
    both = ours.mask & theirs_mask
    return iou, np.degrees(np.arccos(np.clip((ours.normal[both] * normal[both]).sum(-1), -1, 1)))


@pytest.mark.parametrize("name,size", PHOTOS)
def test_ben2_matte_is_upstreams(ben2_base, fresh_runtime, name, size):  # noqa: F811
    from lean_image_ai.models.adapters import ben2
    from PIL import Image

    model = _ben2_net()
    import ben2_model  # tools/ is on the path once _builds() ran

    picture = _photo(name, size)
    mask, _ = ben2_model.inference(model, Image.fromarray(picture))
    theirs = np.asarray(mask).astype(np.float32) / 255.0
    ours = ben2.run(picture, ben2_base, options=opts(fresh_runtime)).matte
    difference = np.abs(ours - theirs)
    print(f"BEN2 {name}: matte {difference.max():.2%} max, {difference.mean():.3%} mean")
    assert difference.mean() <= 0.01  # upstream truncates to uint8: half a level on average
    # ours truncated as upstream's is the same bytes but for the exports' float noise
    assert np.abs(np.floor(ours * 255.0) - np.asarray(mask)).max() <= 1


_BEN2 = {}


def _ben2_net():
    if "net" not in _BEN2:
        _BEN2["net"] = _builds()._ben2_base().eval()
    return _BEN2["net"]
