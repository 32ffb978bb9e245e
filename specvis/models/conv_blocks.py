"""The convolutional autoencoder blocks of taming-transformers' VQGAN, which LDM's AutoencoderKL,
LlamaGen's VQ tokenizer and Chameleon's VQGAN all use, under their parameter names: GroupNorm (eps
1e-6) and swish, residual blocks, single-head spatial attention, the resamplers, and the taming
``Level`` / ``Mid`` containers. Each family's encoder and decoder (``vq.py``, ``chameleon_vq.py``,
``kl_vae.py``) stacks these by its own config.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def group_norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, channels, eps=1e-6, affine=True)


class ResBlock(nn.Module):
    """norm1 -> swish -> conv1 -> norm2 -> swish -> dropout -> conv2, plus the input (through a 1x1
    ``nin_shortcut`` when the channel count changes)."""

    def __init__(self, c_in: int, c_out: int, groups: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1 = group_norm(c_in, groups)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm2 = group_norm(c_out, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(self.dropout(swish(self.norm2(h))))
        skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return skip + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with a residual connection."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.norm = group_norm(channels, groups)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (m(y).flatten(2).transpose(1, 2) for m in (self.q, self.k, self.v))  # (B, hw, C)
        out = F.scaled_dot_product_attention(q, k, v)  # softmax(q k^T / sqrt(C)) v
        out = out.transpose(1, 2).reshape(b, c, h, w)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    """Pad (0, 1, 0, 1), then a stride-2 3x3 convolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # asymmetric pad: right/bottom only


class Upsample(nn.Module):
    """Nearest-neighbour x2, then a 3x3 convolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Level(nn.Module):
    """One resolution level under taming's names: ``block`` residual blocks, each followed by
    ``attn[i]`` when the level has attention; its ``downsample`` / ``upsample`` is applied by the caller."""

    def __init__(self, blocks: list[nn.Module], attns: list[nn.Module]) -> None:
        super().__init__()
        self.block = nn.ModuleList(blocks)
        self.attn = nn.ModuleList(attns)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.block):
            x = block(x)
            if len(self.attn):
                x = self.attn[i](x)
        return x


class Mid(nn.Module):
    """taming's middle: ``block_1``, ``attn_1`` (an identity without attention), ``block_2``."""

    def __init__(self, channels: int, groups: int, dropout: float = 0.0, attention: bool = True) -> None:
        super().__init__()
        self.block_1 = ResBlock(channels, channels, groups, dropout)
        self.attn_1 = AttnBlock(channels, groups) if attention else nn.Identity()
        self.block_2 = ResBlock(channels, channels, groups, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class Encoder(nn.Module):
    """taming's encoder: ``conv_in``; per level i (``down[i]``) ``num_res_blocks`` ResBlocks to
    ch * ch_mult[i] channels, attention after each where the level's resolution is in
    ``attn_resolutions``, a Downsample on every level but the last; ``mid``; ``norm_out``, swish and
    ``conv_out`` to ``out_channels`` (LDM's double_z: twice the latent channels)."""

    def __init__(self, *, in_channels: int, ch: int, ch_mult: list[int], num_res_blocks: int, resolution: int,
                 attn_resolutions: list[int], out_channels: int, groups: int, dropout: float = 0.0,
                 mid_attention: bool = True) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, ch, 3, padding=1)
        self.down = nn.ModuleList()
        c, res = ch, resolution
        for i, m in enumerate(ch_mult):
            blocks, attns = [], []
            for _ in range(num_res_blocks):
                blocks.append(ResBlock(c, ch * m, groups, dropout))
                c = ch * m
                if res in attn_resolutions:
                    attns.append(AttnBlock(c, groups))
            level = Level(blocks, attns)
            if i != len(ch_mult) - 1:
                level.downsample = Downsample(c)
                res //= 2
            self.down.append(level)
        self.mid = Mid(c, groups, dropout, mid_attention)
        self.norm_out = group_norm(c, groups)
        self.conv_out = nn.Conv2d(c, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        return self.conv_out(swish(self.norm_out(self.mid(h))))


class Decoder(nn.Module):
    """taming's decoder: ``conv_in`` from ``in_channels`` latents, ``mid``; per level i from the
    deepest (stored as ``up[i]``) ``num_res_blocks + 1`` ResBlocks to ch * ch_mult[i] channels,
    attention where the resolution is in ``attn_resolutions``, an Upsample on every level but the
    first; ``norm_out``, swish, ``conv_out`` to ``out_channels``, then tanh if ``tanh_out``."""

    def __init__(self, *, in_channels: int, ch: int, ch_mult: list[int], num_res_blocks: int, resolution: int,
                 attn_resolutions: list[int], out_channels: int, groups: int, dropout: float = 0.0,
                 mid_attention: bool = True, tanh_out: bool = False) -> None:
        super().__init__()
        c = ch * ch_mult[-1]
        res = resolution // 2 ** (len(ch_mult) - 1)
        self.tanh_out = tanh_out
        self.conv_in = nn.Conv2d(in_channels, c, 3, padding=1)
        self.mid = Mid(c, groups, dropout, mid_attention)
        levels: list[nn.Module] = [nn.Identity()] * len(ch_mult)
        for i in reversed(range(len(ch_mult))):
            blocks, attns = [], []
            for _ in range(num_res_blocks + 1):
                blocks.append(ResBlock(c, ch * ch_mult[i], groups, dropout))
                c = ch * ch_mult[i]
                if res in attn_resolutions:
                    attns.append(AttnBlock(c, groups))
            level = Level(blocks, attns)
            if i != 0:
                level.upsample = Upsample(c)
                res *= 2
            levels[i] = level
        self.up = nn.ModuleList(levels)
        self.norm_out = group_norm(c, groups)
        self.conv_out = nn.Conv2d(c, out_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            h = level(h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        h = self.conv_out(swish(self.norm_out(h)))
        return torch.tanh(h) if self.tanh_out else h
