"""BEN2's network (BEN_Base: a Swin-B backbone and MCLM/MCRM decoder), vendored for the reference
export only (a dev tool: tools/ is not in the add-on's zip; nothing here runs in the product).

From https://github.com/PramaLLC/BEN2, file BEN2.py at commit
41efc6966a6fcaf77dfd90ecd4cf06a1edcd1745 (2025-04-08), MIT licence (notice below). No package
ships BEN2, and the file itself imports timm, einops, torchvision, cv2 and PIL at the top, so the
classes the network needs are copied here with only these changes:

- timm's `to_2tuple`, `DropPath` and `trunc_normal_` are their torch equivalents (timm needs
  torchvision, which does not load beside the CPU torch wheel here; DropPath is the identity in
  eval mode, and the export runs in eval mode);
- each einops `rearrange` is the reshape/permute it stands for (the 2x2 patch grid is fixed);
- MCLM and MCRM pool with `avg_pool2d` instead of `adaptive_avg_pool2d` to `round(side / ratio)`:
  under tracing `round()` of a traced size and the adaptive pool both fail; where the sides divide
  evenly (all of them at 1024², asserted) the two are the same average (`pool_to`);
- `np.ceil` is `math.ceil`; the second, identical `PositionEmbeddingSine` is dropped;
- BEN_Base.forward loses its `@torch.inference_mode` and `@torch.autocast("cuda", float16)`
  decorators (the export runs fp32 under `torch.no_grad`); `segment_video`, the video writers
  and the checkpoint loader are left out (they need cv2, ffmpeg, torchvision);
- `inference` (its non-refining branch, on the CPU), `rgb_loader_refiner` and `postprocess_image`
  are kept at the end as functions, for the tests that compare the add-on with them; Pillow is
  imported inside them, and torchvision's ToTensor + Normalize are written as their torch ops.

MIT License

Copyright (c) 2025 Prama LLC

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.init import trunc_normal_


def to_2tuple(x):
    return tuple(x) if isinstance(x, tuple | list) else (x, x)


class DropPath(nn.Identity):
    """timm's stochastic depth: the identity outside training (the only mode exported)."""

    def __init__(self, drop_prob=0.0):
        super().__init__()
        self.drop_prob = drop_prob


# ---- einops' patterns, as reshapes (hg = wg = 2) ------------------------------------------------


def image2patches(x):
    """b c (hg h) (wg w) -> (hg wg b) c h w"""
    b, c, H, W = x.shape
    x = x.reshape(b, c, 2, H // 2, 2, W // 2).permute(2, 4, 0, 1, 3, 5)
    return x.reshape(4 * b, c, H // 2, W // 2)


def patches2image(x):
    """(hg wg b) c h w -> b c (hg h) (wg w)"""
    n, c, h, w = x.shape
    x = x.reshape(2, 2, n // 4, c, h, w).permute(2, 3, 0, 4, 1, 5)
    return x.reshape(n // 4, c, 2 * h, 2 * w)


def to_tokens(x):
    """b c h w -> (h w) b c"""
    b, c, h, w = x.shape
    return x.flatten(2).permute(2, 0, 1)


def from_tokens(x, h, w):
    """(h w) b c -> b c h w"""
    _, b, c = x.shape
    return x.permute(1, 2, 0).reshape(b, c, h, w)


def pool_to(x, side: int, ratio: int):
    """adaptive_avg_pool2d(x, round(side / ratio)) (both sides), where `ratio` divides `side` and
    the target divides x's sides: then it is avg_pool2d with kernel = stride = x's side / target."""
    assert side % ratio == 0, f"pool ratio {ratio} does not divide {side}"
    target = side // ratio
    h, w = int(x.shape[-2]), int(x.shape[-1])
    assert h % target == 0 and w % target == 0 and h == w, f"{h}x{w} does not pool evenly to {target}"
    kernel = h // target
    return F.avg_pool2d(x, kernel, kernel) if kernel > 1 else x


# ---- Swin-B backbone (BEN2.py as is, less timm) -------------------------------------------------


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU, drop=0.0):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


def window_partition(x, window_size):
    B, H, W, C = x.shape
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C)


def window_reverse(windows, window_size, H, W):
    B = int(windows.shape[0] / (H * W / window_size / window_size))
    x = windows.view(B, H // window_size, W // window_size, window_size, window_size, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


class WindowAttention(nn.Module):
    def __init__(
        self, dim, window_size, num_heads, qkv_bias=True, qk_scale=None, attn_drop=0.0, proj_drop=0.0
    ):
        super().__init__()
        self.dim = dim
        self.window_size = window_size
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = qk_scale or head_dim**-0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads)
        )
        coords = torch.stack(
            torch.meshgrid([torch.arange(window_size[0]), torch.arange(window_size[1])], indexing="ij")
        )
        coords_flatten = torch.flatten(coords, 1)
        relative_coords = (
            (coords_flatten[:, :, None] - coords_flatten[:, None, :]).permute(1, 2, 0).contiguous()
        )
        relative_coords[:, :, 0] += self.window_size[0] - 1
        relative_coords[:, :, 1] += self.window_size[1] - 1
        relative_coords[:, :, 0] *= 2 * self.window_size[1] - 1
        self.register_buffer("relative_position_index", relative_coords.sum(-1))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1)
        area = self.window_size[0] * self.window_size[1]
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(area, area, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
        attn = self.attn_drop(self.softmax(attn))
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj_drop(self.proj(x))


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim, num_heads, window_size=7, shift_size=0, mlp_ratio=4.0, qkv_bias=True, qk_scale=None,
                 drop=0.0, attn_drop=0.0, drop_path=0.0, act_layer=nn.GELU, norm_layer=nn.LayerNorm):  # fmt: skip
        super().__init__()
        self.dim, self.num_heads, self.window_size, self.shift_size = dim, num_heads, window_size, shift_size
        self.mlp_ratio = mlp_ratio
        assert 0 <= self.shift_size < self.window_size, "shift_size must in 0-window_size"
        self.norm1 = norm_layer(dim)
        self.attn = WindowAttention(dim, window_size=to_2tuple(self.window_size), num_heads=num_heads,
                                    qkv_bias=qkv_bias, qk_scale=qk_scale, attn_drop=attn_drop, proj_drop=drop)  # fmt: skip
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer, drop=drop)
        self.H = None
        self.W = None

    def forward(self, x, mask_matrix):
        B, L, C = x.shape
        H, W = self.H, self.W
        assert L == H * W, "input feature has wrong size"
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        pad_r = (self.window_size - W % self.window_size) % self.window_size
        pad_b = (self.window_size - H % self.window_size) % self.window_size
        x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
        _, Hp, Wp, _ = x.shape
        if self.shift_size > 0:
            shifted_x = torch.roll(x, shifts=(-self.shift_size, -self.shift_size), dims=(1, 2))
            attn_mask = mask_matrix
        else:
            shifted_x = x
            attn_mask = None
        x_windows = window_partition(shifted_x, self.window_size).view(
            -1, self.window_size * self.window_size, C
        )
        attn_windows = self.attn(x_windows, mask=attn_mask).view(-1, self.window_size, self.window_size, C)
        shifted_x = window_reverse(attn_windows, self.window_size, Hp, Wp)
        if self.shift_size > 0:
            x = torch.roll(shifted_x, shifts=(self.shift_size, self.shift_size), dims=(1, 2))
        else:
            x = shifted_x
        if pad_r > 0 or pad_b > 0:
            x = x[:, :H, :W, :].contiguous()
        x = shortcut + self.drop_path(x.view(B, H * W, C))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchMerging(nn.Module):
    def __init__(self, dim, norm_layer=nn.LayerNorm):
        super().__init__()
        self.dim = dim
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = norm_layer(4 * dim)

    def forward(self, x, H, W):
        B, L, C = x.shape
        assert L == H * W, "input feature has wrong size"
        x = x.view(B, H, W, C)
        if (H % 2 == 1) or (W % 2 == 1):
            x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
        x0, x1 = x[:, 0::2, 0::2, :], x[:, 1::2, 0::2, :]
        x2, x3 = x[:, 0::2, 1::2, :], x[:, 1::2, 1::2, :]
        x = torch.cat([x0, x1, x2, x3], -1).view(B, -1, 4 * C)
        return self.reduction(self.norm(x))


class BasicLayer(nn.Module):
    def __init__(self, dim, depth, num_heads, window_size=7, mlp_ratio=4.0, qkv_bias=True, qk_scale=None, drop=0.0,
                 attn_drop=0.0, drop_path=0.0, norm_layer=nn.LayerNorm, downsample=None):  # fmt: skip
        super().__init__()
        self.window_size = window_size
        self.shift_size = window_size // 2
        self.depth = depth
        self.blocks = nn.ModuleList([
            SwinTransformerBlock(
                dim=dim, num_heads=num_heads, window_size=window_size,
                shift_size=0 if (i % 2 == 0) else window_size // 2, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                qk_scale=qk_scale, drop=drop, attn_drop=attn_drop,
                drop_path=drop_path[i] if isinstance(drop_path, list) else drop_path, norm_layer=norm_layer)
            for i in range(depth)
        ])  # fmt: skip
        self.downsample = downsample(dim=dim, norm_layer=norm_layer) if downsample is not None else None

    def forward(self, x, H, W):
        Hp = int(math.ceil(H / self.window_size)) * self.window_size
        Wp = int(math.ceil(W / self.window_size)) * self.window_size
        img_mask = torch.zeros((1, Hp, Wp, 1), device=x.device)
        slices = (
            slice(0, -self.window_size),
            slice(-self.window_size, -self.shift_size),
            slice(-self.shift_size, None),
        )
        cnt = 0
        for h in slices:
            for w in slices:
                img_mask[:, h, w, :] = cnt
                cnt += 1
        mask_windows = window_partition(img_mask, self.window_size).view(
            -1, self.window_size * self.window_size
        )
        attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
        attn_mask = attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask == 0, 0.0)
        for blk in self.blocks:
            blk.H, blk.W = H, W
            x = blk(x, attn_mask)
        if self.downsample is not None:
            return x, H, W, self.downsample(x, H, W), (H + 1) // 2, (W + 1) // 2
        return x, H, W, x, H, W


class PatchEmbed(nn.Module):
    def __init__(self, patch_size=4, in_chans=3, embed_dim=96, norm_layer=None):
        super().__init__()
        self.patch_size = to_2tuple(patch_size)
        self.in_chans, self.embed_dim = in_chans, embed_dim
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)
        self.norm = norm_layer(embed_dim) if norm_layer is not None else None

    def forward(self, x):
        _, _, H, W = x.size()
        if W % self.patch_size[1] != 0:
            x = F.pad(x, (0, self.patch_size[1] - W % self.patch_size[1]))
        if H % self.patch_size[0] != 0:
            x = F.pad(x, (0, 0, 0, self.patch_size[0] - H % self.patch_size[0]))
        x = self.proj(x)
        if self.norm is not None:
            Wh, Ww = x.size(2), x.size(3)
            x = self.norm(x.flatten(2).transpose(1, 2)).transpose(1, 2).view(-1, self.embed_dim, Wh, Ww)
        return x


class SwinTransformer(nn.Module):
    """Swin backbone as BEN2 builds it (no absolute position embedding, patch norm, four outputs)."""

    def __init__(self, patch_size=4, in_chans=3, embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24),
                 window_size=7, mlp_ratio=4.0, qkv_bias=True, qk_scale=None, drop_rate=0.0, attn_drop_rate=0.0,
                 drop_path_rate=0.2, norm_layer=nn.LayerNorm, out_indices=(0, 1, 2, 3)):  # fmt: skip
        super().__init__()
        self.num_layers = len(depths)
        self.embed_dim = embed_dim
        self.out_indices = out_indices
        self.patch_embed = PatchEmbed(
            patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim, norm_layer=norm_layer
        )
        self.pos_drop = nn.Dropout(p=drop_rate)
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, sum(depths))]
        self.layers = nn.ModuleList([
            BasicLayer(
                dim=int(embed_dim * 2**i), depth=depths[i], num_heads=num_heads[i], window_size=window_size,
                mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop_rate, attn_drop=attn_drop_rate,
                drop_path=dpr[sum(depths[:i]) : sum(depths[: i + 1])], norm_layer=norm_layer,
                downsample=PatchMerging if (i < self.num_layers - 1) else None)
            for i in range(self.num_layers)
        ])  # fmt: skip
        self.num_features = [int(embed_dim * 2**i) for i in range(self.num_layers)]
        for i in out_indices:
            self.add_module(f"norm{i}", norm_layer(self.num_features[i]))

    def forward(self, x):
        x = self.patch_embed(x)
        Wh, Ww = x.size(2), x.size(3)
        outs = [x.contiguous()]
        x = self.pos_drop(x.flatten(2).transpose(1, 2))
        for i in range(self.num_layers):
            x_out, H, W, x, Wh, Ww = self.layers[i](x, Wh, Ww)
            if i in self.out_indices:
                x_out = getattr(self, f"norm{i}")(x_out)
                outs.append(x_out.view(-1, H, W, self.num_features[i]).permute(0, 3, 1, 2).contiguous())
        return tuple(outs)


# ---- BEN2's decoder -----------------------------------------------------------------------------


def make_cbr(in_dim, out_dim):
    return nn.Sequential(
        nn.Conv2d(in_dim, out_dim, kernel_size=3, padding=1), nn.InstanceNorm2d(out_dim), nn.GELU()
    )


make_cbg = make_cbr  # upstream's two definitions are the same


def rescale_to(x, scale_factor: float = 2, interpolation="nearest"):
    return F.interpolate(x, scale_factor=scale_factor, mode=interpolation)


def resize_as(x, y, interpolation="bilinear"):
    return F.interpolate(x, size=y.shape[-2:], mode=interpolation)


class PositionEmbeddingSine:
    def __init__(self, num_pos_feats=64, temperature=10000, normalize=False, scale=None):
        self.num_pos_feats = num_pos_feats
        self.temperature = temperature
        self.normalize = normalize
        if scale is not None and normalize is False:
            raise ValueError("normalize should be True if scale is passed")
        self.scale = 2 * math.pi if scale is None else scale
        self.dim_t = torch.arange(0, self.num_pos_feats, dtype=torch.float32)

    def __call__(self, b, h, w):
        device = self.dim_t.device
        not_mask = ~torch.zeros([b, h, w], dtype=torch.bool, device=device)
        y_embed = not_mask.cumsum(dim=1, dtype=torch.float32)
        x_embed = not_mask.cumsum(dim=2, dtype=torch.float32)
        if self.normalize:
            eps = 1e-6
            y_embed = (y_embed - 0.5) / (y_embed[:, -1:, :] + eps) * self.scale
            x_embed = (x_embed - 0.5) / (x_embed[:, :, -1:] + eps) * self.scale
        dim_t = self.temperature ** (2 * (self.dim_t.to(device) // 2) / self.num_pos_feats)
        pos_x = x_embed[:, :, :, None] / dim_t
        pos_y = y_embed[:, :, :, None] / dim_t
        pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).flatten(3)
        pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).flatten(3)
        return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


def _ffn(module, x, first, second):
    return x + module.dropout2(second(module.dropout(module.activation(first(x)).clone())))


class MCLM(nn.Module):
    def __init__(self, d_model, num_heads, pool_ratios=(1, 4, 8)):
        super().__init__()
        self.attention = nn.ModuleList(
            [nn.MultiheadAttention(d_model, num_heads, dropout=0.1) for _ in range(5)]
        )
        self.linear1 = nn.Linear(d_model, d_model * 2)
        self.linear2 = nn.Linear(d_model * 2, d_model)
        self.linear3 = nn.Linear(d_model, d_model * 2)
        self.linear4 = nn.Linear(d_model * 2, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(0.1)
        self.dropout1 = nn.Dropout(0.1)
        self.dropout2 = nn.Dropout(0.1)
        self.activation = F.gelu
        self.pool_ratios = pool_ratios
        self.positional_encoding = PositionEmbeddingSine(num_pos_feats=d_model // 2, normalize=True)

    def forward(self, l, g):  # noqa: E741 (upstream's name)
        """l: 4,c,h,w (the patches), g: 1,c,h,w (the whole image at half size)."""
        _, _, h, w = l.size()
        concated_locs = patches2image(l)
        pools, p_poses = [], []
        for pool_ratio in self.pool_ratios:
            pool = pool_to(concated_locs, h, pool_ratio)
            pools.append(to_tokens(pool))
            p_poses.append(to_tokens(self.positional_encoding(pool.shape[0], pool.shape[2], pool.shape[3])))
        pools = torch.cat(pools, 0)
        p_poses = torch.cat(p_poses, dim=0).to(pools.device)
        g_pos = to_tokens(self.positional_encoding(g.shape[0], g.shape[2], g.shape[3])).to(pools.device)
        g_hw_b_c = to_tokens(g)
        g_hw_b_c = g_hw_b_c + self.dropout1(self.attention[0](g_hw_b_c + g_pos, pools + p_poses, pools)[0])
        g_hw_b_c = self.norm2(_ffn(self, self.norm1(g_hw_b_c), self.linear1, self.linear2))
        # attention between each patch (q) and its quarter of the refreshed whole (k, v)
        l_hw_b_c = to_tokens(l)
        c = g_hw_b_c.shape[-1]
        # (h w) b c -> h w b c -> (ng h) (nw w) -> (h w) (ng nw b) c with ng = nw = 2
        _g = (
            g_hw_b_c.reshape(2, h // 2, 2, w // 2, -1, c)
            .permute(1, 3, 0, 2, 4, 5)
            .reshape(h // 2 * w // 2, -1, c)
        )
        outputs_re = [self.attention[i + 1](_l, _gi, _gi)[0] for i, (_l, _gi) in
                      enumerate(zip(l_hw_b_c.chunk(4, dim=1), _g.chunk(4, dim=1), strict=True))]  # fmt: skip
        l_hw_b_c = self.norm1(l_hw_b_c + self.dropout1(torch.cat(outputs_re, 1)))
        l_hw_b_c = self.norm2(_ffn(self, l_hw_b_c, self.linear3, self.linear4))
        return from_tokens(torch.cat((l_hw_b_c, g_hw_b_c), 1), h, w)


class MCRM(nn.Module):
    def __init__(self, d_model, num_heads, pool_ratios=(4, 8, 16)):
        super().__init__()
        self.attention = nn.ModuleList(
            [nn.MultiheadAttention(d_model, num_heads, dropout=0.1) for _ in range(4)]
        )
        self.linear3 = nn.Linear(d_model, d_model * 2)
        self.linear4 = nn.Linear(d_model * 2, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(0.1)
        self.dropout1 = nn.Dropout(0.1)
        self.dropout2 = nn.Dropout(0.1)
        self.sigmoid = nn.Sigmoid()
        self.activation = F.gelu
        self.sal_conv = nn.Conv2d(d_model, 1, 1)
        self.pool_ratios = pool_ratios

    def forward(self, x):
        _, c, h, w = x.size()
        loc, glb = x.split([4, 1], dim=0)
        patched_glb = image2patches(glb)
        token_attention_map = self.sigmoid(self.sal_conv(glb))
        token_attention_map = F.interpolate(
            token_attention_map, size=patches2image(loc).shape[-2:], mode="nearest"
        )
        loc = loc * image2patches(token_attention_map)
        # nl c h w -> nl c (h w), joined over the ratios -> nl (h w) 1 c
        pools = torch.cat([pool_to(patched_glb, h, r).flatten(2) for r in self.pool_ratios], 2)
        pools = pools.permute(0, 2, 1).unsqueeze(2)
        loc_ = loc.flatten(2).permute(0, 2, 1).unsqueeze(2)
        outputs = [self.attention[i](q, pools[i], pools[i])[0] for i, q in enumerate(loc_.unbind(dim=0))]
        src = loc.view(4, c, -1).permute(2, 0, 1) + self.dropout1(torch.cat(outputs, 1))
        src = self.norm2(_ffn(self, self.norm1(src), self.linear3, self.linear4))
        src = src.permute(1, 2, 0).reshape(4, c, h, w)
        glb = glb + F.interpolate(patches2image(src), size=glb.shape[-2:], mode="nearest")
        return torch.cat((src, glb), 0), token_attention_map


class BEN_Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = SwinTransformer(
            embed_dim=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32], window_size=12
        )
        emb_dim = 128
        for i in range(1, 6):  # unused by forward; kept so the parameter count is upstream's
            self.add_module(f"sideout{i}", nn.Sequential(nn.Conv2d(emb_dim, 1, kernel_size=3, padding=1)))
        self.output5 = make_cbr(1024, emb_dim)
        self.output4 = make_cbr(512, emb_dim)
        self.output3 = make_cbr(256, emb_dim)
        self.output2 = make_cbr(128, emb_dim)
        self.output1 = make_cbr(128, emb_dim)
        self.multifieldcrossatt = MCLM(emb_dim, 1, [1, 4, 8])
        self.conv1 = make_cbr(emb_dim, emb_dim)
        self.conv2 = make_cbr(emb_dim, emb_dim)
        self.conv3 = make_cbr(emb_dim, emb_dim)
        self.conv4 = make_cbr(emb_dim, emb_dim)
        self.dec_blk1 = MCRM(emb_dim, 1, [2, 4, 8])
        self.dec_blk2 = MCRM(emb_dim, 1, [2, 4, 8])
        self.dec_blk3 = MCRM(emb_dim, 1, [2, 4, 8])
        self.dec_blk4 = MCRM(emb_dim, 1, [2, 4, 8])
        self.insmask_head = nn.Sequential(
            nn.Conv2d(emb_dim, 384, kernel_size=3, padding=1), nn.InstanceNorm2d(384), nn.GELU(),
            nn.Conv2d(384, 384, kernel_size=3, padding=1), nn.InstanceNorm2d(384), nn.GELU(),
            nn.Conv2d(384, emb_dim, kernel_size=3, padding=1),
        )  # fmt: skip
        self.shallow = nn.Sequential(nn.Conv2d(3, emb_dim, kernel_size=3, padding=1))
        self.upsample1 = make_cbg(emb_dim, emb_dim)
        self.upsample2 = make_cbg(emb_dim, emb_dim)
        self.output = nn.Sequential(nn.Conv2d(emb_dim, 1, kernel_size=3, padding=1))

    def forward(self, x):
        real_batch = x.size(0)
        shallow_batch = self.shallow(x)
        glb_batch = rescale_to(x, scale_factor=0.5, interpolation="bilinear")
        final_input = torch.cat(
            [
                torch.cat((image2patches(x[i : i + 1]), glb_batch[i : i + 1]), dim=0)
                for i in range(real_batch)
            ],
            dim=0,
        )
        features = self.backbone(final_input)
        outputs = []
        for i in range(real_batch):
            f4, f3, f2, f1, f0 = (features[k][i * 5 : (i + 1) * 5] for k in (4, 3, 2, 1, 0))
            e5, e4, e3 = self.output5(f4), self.output4(f3), self.output3(f2)
            e2, e1 = self.output2(f1), self.output1(f0)
            loc_e5, glb_e5 = e5.split([4, 1], dim=0)
            e5 = self.multifieldcrossatt(loc_e5, glb_e5)
            e4 = self.conv4(self.dec_blk4(e4 + resize_as(e5, e4))[0])
            e3 = self.conv3(self.dec_blk3(e3 + resize_as(e4, e3))[0])
            e2 = self.conv2(self.dec_blk2(e2 + resize_as(e3, e2))[0])
            e1 = self.conv1(self.dec_blk1(e1 + resize_as(e2, e1))[0])
            loc_e1, glb_e1 = e1.split([4, 1], dim=0)
            output1_cat = patches2image(loc_e1)
            output1_cat = output1_cat + resize_as(glb_e1, output1_cat)
            final_output = self.insmask_head(output1_cat)
            shallow = shallow_batch[i : i + 1]
            final_output = final_output + resize_as(shallow, final_output)
            final_output = self.upsample1(rescale_to(final_output))
            final_output = rescale_to(final_output + resize_as(shallow, final_output))
            final_output = self.output(self.upsample2(final_output))
            outputs.append(final_output.sigmoid())
        return torch.cat(outputs, dim=0)


# ---- BEN2.py's single-image inference (its non-refining branch, on the CPU: img_transform32) ----
# Kept for tests/test_upstream_pipelines.py, which compares the add-on's matte with this. Pillow is
# imported here only (the export needs none); torchvision's ToTensor + Normalize are the two torch
# operations they stand for (torchvision does not load beside the CPU torch wheel here).


def rgb_loader_refiner(original_image):
    from PIL import Image

    h, w = original_image.size
    image = original_image
    if image.mode != "RGB":
        image = image.convert("RGB")
    image = image.resize((1024, 1024), resample=Image.LANCZOS)
    return image.convert("RGB"), h, w, original_image


def img_transform32(image):
    import numpy as np

    tensor = (
        torch.from_numpy(np.array(image, copy=True)).permute(2, 0, 1).contiguous().to(torch.float32).div(255)
    )
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    return tensor.sub(mean).div(std)


def postprocess_image(result, im_size):
    import numpy as np

    result = torch.squeeze(F.interpolate(result, size=im_size, mode="bilinear"), 0)
    ma = torch.max(result)
    mi = torch.min(result)
    result = (result - mi) / (ma - mi)
    im_array = (result * 255).permute(1, 2, 0).cpu().data.numpy().astype(np.uint8)
    return np.squeeze(im_array)


def inference(model, image):
    """BEN_Base.inference(image, refine_foreground=False): (mask, image with the mask as alpha)."""
    from PIL import Image

    image, h, w, original_image = rgb_loader_refiner(image)
    img_tensor = img_transform32(image).unsqueeze(0).to(next(model.parameters()).device)
    with torch.no_grad():
        res = model.forward(img_tensor)
    alpha = postprocess_image(res, im_size=[w, h])
    pred_pil = Image.fromarray(alpha)  # transforms.ToPILImage() of an HxW uint8 array: mode "L"
    mask = pred_pil.resize(original_image.size)
    original_image.putalpha(mask)
    return mask, original_image
