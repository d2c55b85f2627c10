"""What DA3's code needs to export with a dynamic height and width (a dev tool, used by
tools/reference_models.py for `da3-small-dynamic`).

The TorchScript exporter traces at one size. Under tracing, tensor shapes are traced values, but
DA3 turns several of them into Python numbers, which the trace records as constants of the sample
size (a graph that then fails, or silently misbehaves, at any other size):
- RoPE (`dinov2/layers/rope.py`): `int(positions.max()) + 1` sizes the sin/cos table;
- the DINOv2 position embedding (`vision_transformer.interpolate_pos_encoding`): the bicubic
  scale factors `float(w0 + 0.1) / M` of the 37x37 table;
- DualDPT (`dualdpt.py`): `int(ph * patch_size / down_ratio)` for the last upsample, and
  `create_uv_grid`'s linspace over the head's own width and height.
`DynamicSizes` keeps each of them a traced value while the export runs, computing what upstream
computes (the same table values, the same bicubic resize with the same scales, the same linspace
formula), and restores DA3's code afterwards. Checked by running the export at other sizes than
its sample against the torch net (tests/test_upstream_pipelines.py).

One case where the trace differs from upstream: at exactly 518x518 (37x37 patches, the table's
own size) upstream skips the interpolation, the graph still resamples by 37.1/37.
"""

from __future__ import annotations

import builtins
import importlib

_INT_USERS = (
    "depth_anything_3.model.dinov2.layers.rope",
    "depth_anything_3.model.dualdpt",
    "depth_anything_3.model.utils.head_utils",
)


def _traced_int(value):
    """`int()` that keeps a traced tensor a tensor (floored to int64, as int() truncates a
    non-negative size); anything else goes to the builtin."""
    import torch

    if isinstance(value, torch.Tensor):
        return torch.floor(value).to(torch.int64) if value.is_floating_point() else value.to(torch.int64)
    return builtins.int(value)


def _as_tensor(value):
    import torch

    return value if isinstance(value, torch.Tensor) else torch.tensor(value)


def _bicubic_with_scales():
    """F.interpolate(bicubic, scale_factor) whose scales are graph values in the ONNX export:
    ONNX Resize takes `scales` as an input, so the graph computes them from the input's size, and
    maps coordinates by them as PyTorch does when given a scale factor."""
    import torch
    import torch.nn.functional as F

    class BicubicWithScales(torch.autograd.Function):
        @staticmethod
        def forward(ctx, table, scale_y, scale_x):
            return F.interpolate(
                table, scale_factor=(float(scale_y), float(scale_x)), mode="bicubic", align_corners=False
            )

        @staticmethod
        def symbolic(g, table, scale_y, scale_x):
            ones = g.op("Constant", value_t=torch.ones(2, dtype=torch.float32))
            as_1d = [g.op("Reshape", s, g.op("Constant", value_t=torch.tensor([1]))) for s in (scale_y, scale_x)]
            scales = g.op("Concat", ones, *[g.op("Cast", s, to_i=1) for s in as_1d], axis_i=0)  # 1: FLOAT
            empty_roi = g.op("Constant", value_t=torch.tensor([], dtype=torch.float32))
            return g.op(
                "Resize",
                table,
                empty_roi,
                scales,
                mode_s="cubic",
                cubic_coeff_a_f=-0.75,
                coordinate_transformation_mode_s="half_pixel",
                nearest_mode_s="floor",
            )

    return BicubicWithScales.apply


def _interpolate_pos_encoding(bicubic):
    import torch

    def interpolate_pos_encoding(self, x, w, h):
        """upstream's (`vision_transformer.py`), with its scale factors kept as graph values."""
        previous_dtype = x.dtype
        pos_embed = self.pos_embed.float()
        count = pos_embed.shape[1] - 1
        side = builtins.int(count**0.5)
        dim = x.shape[-1]
        table = pos_embed[:, 1:].reshape(1, side, side, dim).permute(0, 3, 1, 2)
        # upstream names the token grid (w0, h0) from a tensor laid out (..., w, h) = (..., H, W)
        rows, cols = _as_tensor(w) // self.patch_size, _as_tensor(h) // self.patch_size
        offset = self.interpolate_offset
        assert offset, "DA3's configs interpolate by scale factors (interpolate_offset 0.1)"
        scale_y = (rows.to(torch.float64) + offset) / side
        scale_x = (cols.to(torch.float64) + offset) / side
        patch_pos_embed = bicubic(table, scale_y, scale_x)
        patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).reshape(1, -1, dim)
        return torch.cat((pos_embed[:, :1], patch_pos_embed), dim=1).to(previous_dtype)

    return interpolate_pos_encoding


def _create_uv_grid(width, height, aspect_ratio=None, dtype=None, device=None):
    """upstream's (`head_utils.create_uv_grid`) with torch.linspace's own formula written out
    (the first half counted from the start, the rest back from the end), so the steps can be
    traced values."""
    import torch

    width, height = _as_tensor(width), _as_tensor(height)
    if aspect_ratio is None:
        aspect_ratio = width.to(torch.float32) / height.to(torch.float32)
    diag_factor = (aspect_ratio**2 + 1.0) ** 0.5
    span_x, span_y = aspect_ratio / diag_factor, 1.0 / diag_factor

    def linspace(span, steps):
        start, end = -span * (steps - 1) / steps, span * (steps - 1) / steps
        index = torch.arange(steps, dtype=dtype, device=device)
        step = (end - start) / (steps - 1)
        from_end = end - (steps - 1 - index) * step
        return torch.where(index < steps // 2, start + index * step, from_end).to(dtype)

    uu, vv = torch.meshgrid(linspace(span_x, width), linspace(span_y, height), indexing="xy")
    return torch.stack((uu, vv), dim=-1)


class DynamicSizes:
    """While it is entered, DA3's size arithmetic stays traced (see the module's docstring)."""

    def __enter__(self):
        vit = importlib.import_module("depth_anything_3.model.dinov2.vision_transformer")
        dualdpt = importlib.import_module("depth_anything_3.model.dualdpt")
        self._modules = [importlib.import_module(name) for name in _INT_USERS]
        for module in self._modules:
            module.int = _traced_int  # a module global shadows the builtin for that module's code
        self._vit_class = vit.DinoVisionTransformer
        self._saved_interpolate = self._vit_class.interpolate_pos_encoding
        self._vit_class.interpolate_pos_encoding = _interpolate_pos_encoding(_bicubic_with_scales())
        self._dualdpt, self._saved_uv = dualdpt, dualdpt.create_uv_grid
        dualdpt.create_uv_grid = _create_uv_grid
        return self

    def __exit__(self, *exc):
        for module in self._modules:
            del module.int
        self._vit_class.interpolate_pos_encoding = self._saved_interpolate
        self._dualdpt.create_uv_grid = self._saved_uv
