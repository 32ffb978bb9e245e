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
