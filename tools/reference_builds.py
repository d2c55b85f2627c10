"""The reference models' definitions: which upstream class, which config, which seeded weights,
which sample input and I/O names (tools/reference_models.py exports them and keeps the manifest).

Initialisation (PyTorch's default makes a 32-conv net's signal die out: every layer shrinks its
variance by ~3x, so an impulse probe measures radius 0 and tiles "agree" trivially):
- convolutions: Kaiming-normal (fan-in, the gain of the net's own activation: PReLU 0.25 for the
  compact net, LeakyReLU 0.2 for RRDBNet), biases zero, so each layer keeps its input's variance;
- RRDBNet: the convolutions inside each residual dense block scaled by 0.1 (as ESRGAN's own
  training init does) on top of the blocks' fixed 0.2 residual scaling;
- the last conv rescaled on a seeded random image so the output looks like an image: RRDBNet's
  output std 0.25 around 0.5 (its trunk still grows ~85x over 23 blocks, and an output far
  outside [0, 1] would be clipped, hiding every tiling difference), the compact net's residual
  over the nearest-upscaled input std 0.1;
- MoGe-2: DINOv2's own init for the backbone (trunc-normal 0.02, LayerScale 1e-5), Kaiming for
  the neck and heads, the heads' last convs rescaled (points' z before its exp would overflow);
- DA3-SMALL: the package's default init (its outputs come out finite and non-constant);
- BEN2: Swin's own init for the Swin-B backbone (trunc-normal 0.02 linears, zero biases, LayerNorm
  1/0: the residual stream carries the signal through 24 blocks, and each stage's output norm
  rescales it); the decoder keeps PyTorch's conv init (every conv but the last is followed by an
  InstanceNorm, which sets its output's scale whatever the weights); the last conv rescaled so the
  matte's logits have std 2 and mean 0 on a seeded random image (a sigmoid spread over both sides
  of 0.5; PyTorch's default gives a matte within a few hundredths of 0.5). Calibrated at 512²: the
  last conv reads GELU(InstanceNorm(...)), whose scale does not depend on the image size.
Every seed is fixed (torch.manual_seed per model): a re-export gives byte-identical files.
What such weights do not give: a trained net's long-range influence. Random RRDBNet's identity
paths dominate, so a one-pixel change reaches ~6 px above 1e-6 (13 px with unscaled dense
blocks), though its graph reaches 349: tiling errors measured on it are far below a trained net's.

spandrel is loaded without its registry: `import spandrel` imports every architecture it knows,
two of which import torchvision, and PyPI's torchvision build does not load beside the CPU torch
wheel these machines use. Only the two architecture modules needed here are imported.
"""

from __future__ import annotations

import importlib
import importlib.resources
import importlib.util
import sys
import types
from dataclasses import dataclass

# ---- upstream modules ----------------------------------------------------------------------------


def _spandrel_arch(module: str):
    """An architecture module of spandrel without running `spandrel/__init__` (see the docstring)."""
    if "spandrel" not in sys.modules:
        spec = importlib.util.find_spec("spandrel")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("spandrel is not installed: pip install -e '.[reference]'")
        package = types.ModuleType("spandrel")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["spandrel"] = package
    return importlib.import_module(f"spandrel.architectures.{module}")


# ---- initialisation ------------------------------------------------------------------------------


def _calibrate(run, targets) -> None:
    """Rescale output convs (bias set too) so each one's output has the given std (and, when one is
    given, per-channel mean) on a seeded input: a deep net's activations otherwise drift (RRDBNet's
    trunk grows ~85x over 23 blocks, MoGe-2's point head overflows its exp), and an output far
    outside an image's range would be clipped, hiding every tiling difference.

    `run()`: one forward pass of the net on its seeded sample; `targets`: (conv, std, mean or None).
    Each conv's output must reach no other target conv (true for a net's last conv, and for heads
    that are side by side), so one pass measures them all."""
    import torch

    seen = {}
    hooks = [
        conv.register_forward_hook(lambda _m, _i, out, key=index: seen.__setitem__(key, out.detach()))
        for index, (conv, _, _) in enumerate(targets)
    ]
    try:
        for conv, _, _ in targets:
            torch.nn.init.zeros_(conv.bias)
        with torch.no_grad():
            run()
            for index, (conv, std, mean) in enumerate(targets):
                out = seen[index]
                factor = std / float(out.std())
                conv.weight.mul_(factor)
                if mean is not None:
                    conv.bias.copy_(mean - out.mean(dim=(0, 2, 3)) * factor)
    finally:
        for hook in hooks:
            hook.remove()


def _seeded(*shape):
    import torch

    return torch.rand(*shape, generator=torch.Generator().manual_seed(1))


def _kaiming_convs(module, negative_slope: float, scale: float = 1.0) -> None:
    import torch.nn as nn

    for layer in module.modules():
        if isinstance(layer, nn.Conv2d | nn.ConvTranspose2d):
            nn.init.kaiming_normal_(layer.weight, a=negative_slope, mode="fan_in", nonlinearity="leaky_relu")
            layer.weight.data.mul_(scale)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

# ---- the models ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    name: str
    family: str
    public_file: str  # which public file this architecture is
    package: str  # the upstream distribution the code comes from
    init: str  # how the weights were initialised (goes into the manifest)
    config: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic_axes: dict
    recipe: int  # bump when its build, init or export settings change: a cached file is re-made
    # not in the `reference` extra (DA3's package pins numpy<2 and asks for xformers, open3d...:
    # `pip install omegaconf addict && pip install --no-deps depth-anything-3`): exported when installed
    optional: bool = False
    # code copied into tools/ (no package ships it): the upstream repository and commit, which the
    # manifest records in place of a package version
    vendored_from: str | None = None
    # DA3 turns traced sizes into Python numbers: exported inside `DynamicSizes` they stay traced
    # (tools/da3_dynamic_export.py), so the graph takes any height and width
    traced_sizes: bool = False

    def build(self):
        return _BUILDERS[self.name]()

    def sample(self):
        return _SAMPLES[self.name]()


def _compact():
    import torch

    srvgg = _spandrel_arch("Compact.__arch.SRVGG")
    torch.manual_seed(20)
    model = srvgg.SRVGGNetCompact(num_in_ch=3, num_out_ch=3, num_feat=64, num_conv=32, upscale=4, act_type="prelu")
    _kaiming_convs(model, negative_slope=0.25)
    # the body's last conv makes the residual over the nearest-upscaled input: keep it small
    _calibrate(lambda: model(_seeded(1, 3, 48, 48)), [(model.body[-1], 0.1, None)])
    return model


def _rrdb():
    import torch

    rrdb = _spandrel_arch("ESRGAN.__arch.RRDB")
    block = _spandrel_arch("__arch_helpers.block")
    torch.manual_seed(23)
    model = rrdb.RRDBNet(in_nc=3, out_nc=3, num_filters=64, num_blocks=23, scale=4)
    _kaiming_convs(model, negative_slope=0.2)
    for layer in model.modules():
        if isinstance(layer, block.ResidualDenseBlock_5C):
            _kaiming_convs(layer, negative_slope=0.2, scale=0.1)
    _calibrate(lambda: model(_seeded(1, 3, 48, 48)), [(model.model[-1], 0.25, 0.5)])
    return model


# MoGe-2's public checkpoints keep their exact config only inside model.pt; this is the repository's
# configs/train/v2.json (written for ViT-L) with the ViT-S backbone and its 12 blocks' quarter
# points as intermediate layers, and the scale head fed ViT-S's 384-wide class token.
_MOGE2_VITS = {
    "encoder": {"backbone": "dinov2_vits14", "intermediate_layers": [2, 5, 8, 11], "dim_out": 1024},
    "neck": {
        "dim_in": [1026, 2, 2, 2, 2], "dim_out": None, "dim_res_blocks": [1024, 256, 128, 64, 32],
        "num_res_blocks": [0, 2, 2, 2, 0], "res_block_in_norm": "none", "res_block_hidden_norm": "none",
        "resamplers": ["conv_transpose", "conv_transpose", "conv_transpose", "bilinear"],
    },
    **{
        head: {
            "dim_in": [1024, 256, 128, 64, 32], "dim_out": [None, None, None, None, channels],
            "dim_res_blocks": [1024, 256, 128, 64, 32], "num_res_blocks": [0, 1, 1, 1, 0],
            "res_block_in_norm": "none", "res_block_hidden_norm": "none",
            "resamplers": ["conv_transpose", "conv_transpose", "conv_transpose", "bilinear"],
        }
        for head, channels in (("points_head", 3), ("normal_head", 3), ("mask_head", 1))
    },
    "scale_head": {"dims": [384, 1024, 1024, 1]},
    "remap_output": "exp",
    "num_tokens_range": [1200, 3600],
}  # fmt: skip


def _moge2_vits():
    import torch
    from moge.model.v2 import MoGeModel

    torch.manual_seed(2)
    model = MoGeModel(**_MOGE2_VITS)
    for name in ("neck", "points_head", "normal_head", "mask_head"):
        _kaiming_convs(getattr(model, name), negative_slope=0.0)
    model.onnx_compatible_mode = True
    # the heads' last 1x1 convs: points (before the exp of z) and normals std 0.5, the mask's
    # logits std 2 (a sigmoid on both sides of 0.5)
    heads = [(model.points_head, 0.5), (model.normal_head, 0.5), (model.mask_head, 2.0)]
    sample = (_seeded(1, 3, 84, 112), torch.tensor(1200, dtype=torch.int64))
    _calibrate(lambda: model(*sample), [(head.output_blocks[-1], std, None) for head, std in heads])
    return model


class _MoGe2Export:
    """MoGe-2's forward returns a dict; the export wants a tuple in the public file's output order."""

    @staticmethod
    def wrap(model):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, image, num_tokens):
                out = self.model(image, num_tokens)
                return out["points"], out["normal"], out["mask"], out["metric_scale"]

        return Wrapped()


def _da3_small(position_table: bool = False):
    """DA3-SMALL from the package's own config; one view. Its weights keep their default init
    (PyTorch's and DINOv2's): depth and confidence come out finite and non-constant.
    `position_table`: DINOv2's own init of the position embedding (trunc-normal 0.02), which DA3's
    copy of DINOv2 leaves at zeros: a table of zeros hides how an export resamples it to sizes
    other than its 37x37."""
    import torch
    from depth_anything_3.cfg import create_object, load_config

    torch.manual_seed(3)
    config = importlib.resources.files("depth_anything_3") / "configs" / "da3-small.yaml"
    net = create_object(load_config(str(config)))
    if position_table:
        torch.nn.init.trunc_normal_(net.backbone.pretrained.pos_embed, std=0.02)

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, image):  # 1x3xHxW -> DA3's views axis of one
            out = self.net(image[:, None])
            return out["depth"], out["depth_conf"]

    return Wrapped()


def _ben2_base():
    """BEN_Base from PramaLLC/BEN2's BEN2.py (vendored: tools/ben2_model.py; no package ships it)."""
    import torch
    import torch.nn as nn
    from ben2_model import BEN_Base

    torch.manual_seed(9)  # BEN2.py's own seed
    model = BEN_Base()
    for layer in model.backbone.modules():
        if isinstance(layer, nn.Linear):
            nn.init.trunc_normal_(layer.weight, std=0.02)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.LayerNorm):
            nn.init.ones_(layer.weight)
            nn.init.zeros_(layer.bias)
    model.eval()
    _calibrate(lambda: model(_seeded(1, 3, 512, 512)), [(model.output[0], 2.0, 0.0)])
    return model


class CartesianProdAsMeshgrid:
    """DA3's RoPE calls `torch.cartesian_prod`, which the exporter does not support; during the
    export it is an equivalent meshgrid."""

    def __enter__(self):
        import torch

        self._saved = torch.cartesian_prod
        torch.cartesian_prod = lambda a, b: torch.stack(torch.meshgrid(a, b, indexing="ij"), -1).reshape(-1, 2)

    def __exit__(self, *exc):
        import torch

        torch.cartesian_prod = self._saved


_BUILDERS = {
    "compact-x4": _compact,
    "rrdb-x4plus": _rrdb,
    "moge2-vits": lambda: _MoGe2Export.wrap(_moge2_vits()),
    "da3-small": _da3_small,
    "da3-small-dynamic": lambda: _da3_small(position_table=True),
    "ben2-base": _ben2_base,
}


def _image(h, w):
    import torch

    return torch.rand(1, 3, h, w, generator=torch.Generator().manual_seed(0))


_SAMPLES = {
    "compact-x4": lambda: (_image(64, 64),),
    "rrdb-x4plus": lambda: (_image(64, 64),),
    "moge2-vits": lambda: (_image(84, 112), __import__("torch").tensor(1200, dtype=__import__("torch").int64)),
    "da3-small": lambda: (_image(280, 504),),  # the community exports' fixed size
    "da3-small-dynamic": lambda: (_image(280, 504),),
    "ben2-base": lambda: (_image(1024, 1024),),  # the public exports' fixed size
}

_SR_AXES = {"input": {2: "height", 3: "width"}, "output": {2: "out_height", 3: "out_width"}}
_SR_INIT = (
    "Kaiming-normal convs (fan-in, PReLU gain a=0.25), zero biases; the last conv rescaled so the "
    "residual over the nearest-upscaled input has std 0.1 on a seeded random image; seed 20"
)

REFERENCES = {
    r.name: r
    for r in (
        Reference(
            "compact-x4", "upscale", "realesr-general-x4v3 (Real-ESRGAN, SRVGGNetCompact)", "spandrel",
            _SR_INIT, "SRVGGNetCompact num_feat=64 num_conv=32 upscale=4 act=prelu",
            ("input",), ("output",), _SR_AXES, recipe=2,
        ),
        Reference(
            "rrdb-x4plus", "upscale", "RealESRGAN_x4plus (ESRGAN RRDBNet)", "spandrel",
            "Kaiming-normal convs (fan-in, LeakyReLU gain a=0.2), zero biases, the convs inside every "
            "residual dense block scaled by 0.1 (ESRGAN's init) on top of the blocks' 0.2 residual scale; "
            "the last conv rescaled so the output has std 0.25 and mean 0.5 on a seeded random image; seed 23",
            "RRDBNet num_filters=64 num_blocks=23 scale=4 (upconv: nearest x2 + conv, twice)",
            ("input",), ("output",), _SR_AXES, recipe=2,
        ),
        Reference(
            "moge2-vits", "moge2", "Ruicheng/moge-2-vits-normal-onnx model.onnx (MoGe-2 ViT-S, normal)", "dlr-moge",
            "DINOv2's own init for the ViT-S backbone (trunc-normal std 0.02, LayerScale 1e-5); "
            "Kaiming-normal (ReLU gain) neck and heads, zero biases; the heads' last convs rescaled on a "
            "seeded random image to std 0.5 (points before exp, normals) and 2 (mask logits); seed 2",
            "configs/train/v2.json with backbone dinov2_vits14, intermediate_layers [2, 5, 8, 11], "
            "scale head [384, 1024, 1024, 1]; onnx_compatible_mode. Not the public file's exact "
            "config (that is only inside its model.pt): this graph is larger than the public ~141 MB",
            ("image", "num_tokens"), ("points", "normal", "mask", "metric_scale"),
            {"image": {2: "height", 3: "width"}, "points": {1: "height", 2: "width"},
             "normal": {1: "height", 2: "width"}, "mask": {1: "height", 2: "width"}},
            recipe=3,
        ),
        Reference(
            "da3-small", "da3", "DA3-SMALL (Depth Anything 3, any-view; Apache-2.0), fixed 1x3x280x504",
            "depth-anything-3", "the package's default init (PyTorch's, DINOv2's); seed 3",
            "configs/da3-small.yaml from the package; one view; outputs depth and depth_conf (no sky)",
            ("image",), ("depth", "depth_conf"), {}, recipe=1, optional=True,
        ),
        Reference(
            "da3-small-dynamic", "da3",
            "DA3-SMALL (Depth Anything 3, any-view; Apache-2.0), dynamic height and width (what a user "
            "exporting DA3 gets once its size arithmetic is kept traced)",
            "depth-anything-3",
            "the package's default init (PyTorch's, DINOv2's), then DINOv2's trunc-normal 0.02 for the "
            "position embedding (zeros in DA3's copy); seed 3",
            "configs/da3-small.yaml from the package; one view; outputs depth and depth_conf (no sky); "
            "exported at 280x504 inside tools/da3_dynamic_export.py's DynamicSizes",
            ("image",), ("depth", "depth_conf"),
            {name: {2: "height", 3: "width"} for name in ("image", "depth", "depth_conf")},
            recipe=2, optional=True, traced_sizes=True,
        ),
        Reference(
            "ben2-base", "ben2", "PramaLLC/BEN2 BEN2_Base (Swin-B + MCLM/MCRM decoder), fp32, fixed 1x3x1024x1024",
            "tools/ben2_model.py",
            "Swin's own init for the Swin-B backbone (trunc-normal std 0.02 linears, zero biases, LayerNorm "
            "1/0), PyTorch's default for the decoder (its convs feed InstanceNorms); the last conv rescaled "
            "so the matte's logits have std 2 and mean 0 on a seeded 512² random image; seed 9",
            "BEN_Base: Swin embed 128, depths [2, 2, 18, 2], heads [4, 8, 16, 32], window 12; batch 1; "
            "pooling as avg_pool2d (see tools/ben2_model.py)",
            ("input",), ("output",), {}, recipe=1,
            vendored_from="github.com/PramaLLC/BEN2 BEN2.py @ 41efc6966a6fcaf77dfd90ecd4cf06a1edcd1745",
        ),
    )
}  # fmt: skip
