"""LlamaGen VQ-GAN image tokenizer (architecture and official checkpoint loading).

The module tree reproduces the parameter names of the official LlamaGen tokenizer
(``tokenizer/tokenizer_image/vq_model.py``, checkpoints such as ``vq_ds16_c2i.pt``)::

    encoder.conv_in, encoder.conv_blocks.{i}.res.{j}.{norm1,conv1,norm2,conv2,nin_shortcut},
    encoder.conv_blocks.{last}.attn.{j}.{norm,q,k,v,proj_out}, encoder.conv_blocks.{i}.downsample.conv,
    encoder.mid.{0,1,2}, encoder.norm_out, encoder.conv_out, quant_conv, quantize.embedding.weight,
    post_quant_conv, decoder.conv_in, decoder.mid.{0,1,2}, decoder.conv_blocks.{i}.res.{j},
    decoder.conv_blocks.0.attn.{j}, decoder.conv_blocks.{i}.upsample.conv, decoder.norm_out, decoder.conv_out

Images are float tensors (B, 3, H, W) in [-1, 1]; codes are flattened row-major (B, h*w) with
h = H / 2**(levels-1). The quantiser matches LlamaGen: optional L2 normalisation of latents and
codebook, nearest entry by squared distance, straight-through gradients, codebook + beta*commitment loss.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .checkpoint import build_from_state_dict, load_pretrained, read_state_dict, save_pretrained
from .conv_blocks import AttnBlock, Downsample, ResBlock, Upsample, group_norm, swish

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["VQConfig", "VQModel"]


@dataclass
class VQConfig:
    """Tokenizer hyper-parameters; names follow LlamaGen's ``ModelArgs`` (+ ch, num_res_blocks, norm_groups)."""

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    commit_loss_beta: float = 0.25
    encoder_ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    decoder_ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    z_channels: int = 256
    dropout_p: float = 0.0
    ch: int = 128
    num_res_blocks: int = 2
    norm_groups: int = 32

    def __post_init__(self) -> None:
        self.encoder_ch_mult = [int(m) for m in self.encoder_ch_mult]
        self.decoder_ch_mult = [int(m) for m in self.decoder_ch_mult]
        for name in ("codebook_size", "codebook_embed_dim", "z_channels", "ch", "num_res_blocks", "norm_groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"VQConfig.{name} must be a positive int, got {value!r}")
        for name in ("encoder_ch_mult", "decoder_ch_mult"):
            mult = getattr(self, name)
            if not mult or any(m < 1 for m in mult):
                raise ValueError(f"VQConfig.{name} must be a non-empty list of positive ints, got {mult!r}")
            for m in mult:
                if (self.ch * m) % self.norm_groups:
                    raise ValueError(
                        f"VQConfig.norm_groups={self.norm_groups} must divide every channel count (ch*{name})"
                    )
        if len(self.encoder_ch_mult) != len(self.decoder_ch_mult):
            raise ValueError("VQConfig.decoder_ch_mult must have as many levels as encoder_ch_mult")
        if not 0.0 <= self.dropout_p < 1.0:
            raise ValueError(f"VQConfig.dropout_p must be in [0, 1), got {self.dropout_p!r}")
        if self.commit_loss_beta < 0:
            raise ValueError(f"VQConfig.commit_loss_beta must be >= 0, got {self.commit_loss_beta!r}")

    @property
    def downsample(self) -> int:
        """Pixels per token side."""
        return 2 ** (len(self.encoder_ch_mult) - 1)


class _Level(nn.Module):
    """One resolution level: ``res`` blocks, optional ``attn`` blocks, optional resampler."""

    def __init__(self, res: list[nn.Module], attn: list[nn.Module]) -> None:
        super().__init__()
        self.res = nn.ModuleList(res)
        self.attn = nn.ModuleList(attn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.res):
            x = block(x)
            if len(self.attn):
                x = self.attn[i](x)
        for name in ("downsample", "upsample"):
            if hasattr(self, name):
                x = getattr(self, name)(x)
        return x


def _mid(channels: int, groups: int, dropout: float) -> nn.ModuleList:
    return nn.ModuleList(
        [ResBlock(channels, channels, groups, dropout), AttnBlock(channels, groups),
         ResBlock(channels, channels, groups, dropout)]
    )


class _Encoder(nn.Module):
    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        ch, g, p, mult = cfg.ch, cfg.norm_groups, cfg.dropout_p, cfg.encoder_ch_mult
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        c_in = ch
        for i, m in enumerate(mult):
            last = i == len(mult) - 1
            res, attn = [], []
            for _ in range(cfg.num_res_blocks):
                res.append(ResBlock(c_in, ch * m, g, p))
                c_in = ch * m
                if last:
                    attn.append(AttnBlock(c_in, g))
            level = _Level(res, attn)
            if not last:
                level.downsample = Downsample(c_in)
            self.conv_blocks.append(level)
        self.mid = _mid(c_in, g, p)
        self.norm_out = group_norm(c_in, g)
        self.conv_out = nn.Conv2d(c_in, cfg.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.conv_blocks:
            h = level(h)
        for block in self.mid:
            h = block(h)
        return self.conv_out(swish(self.norm_out(h)))


class _Decoder(nn.Module):
    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        ch, g, p, mult = cfg.ch, cfg.norm_groups, cfg.dropout_p, cfg.decoder_ch_mult
        c_in = ch * mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, c_in, 3, padding=1)
        self.mid = _mid(c_in, g, p)
        self.conv_blocks = nn.ModuleList()
        for i in reversed(range(len(mult))):
            res, attn = [], []
            for _ in range(cfg.num_res_blocks + 1):
                res.append(ResBlock(c_in, ch * mult[i], g, p))
                c_in = ch * mult[i]
                if i == len(mult) - 1:
                    attn.append(AttnBlock(c_in, g))
            level = _Level(res, attn)
            if i != 0:
                level.upsample = Upsample(c_in)
            self.conv_blocks.append(level)
        self.norm_out = group_norm(c_in, g)
        self.conv_out = nn.Conv2d(c_in, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for level in self.conv_blocks:
            h = level(h)
        return self.conv_out(swish(self.norm_out(h)))


class Quantizer(nn.Module):
    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        self.l2_norm = cfg.codebook_l2_norm
        self.beta = cfg.commit_loss_beta
        self.embedding = nn.Embedding(cfg.codebook_size, cfg.codebook_embed_dim)
        with torch.no_grad():
            nn.init.uniform_(self.embedding.weight, -1.0 / cfg.codebook_size, 1.0 / cfg.codebook_size)
            if self.l2_norm and not self.embedding.weight.is_meta:  # (meta: built to be loaded, models.loading)
                self.embedding.weight.copy_(F.normalize(self.embedding.weight, dim=-1))

    def codebook(self) -> torch.Tensor:
        w = self.embedding.weight
        return F.normalize(w, dim=-1) if self.l2_norm else w

    def prepare(self, z: torch.Tensor) -> torch.Tensor:
        """(B, d, h, w) latents -> (B, h, w, d), normalised if the codebook is."""
        z = z.permute(0, 2, 3, 1)
        return F.normalize(z, dim=-1) if self.l2_norm else z

    def lookup(self, z: torch.Tensor) -> torch.Tensor:
        """Nearest codebook index for each vector of z (..., d)."""
        flat = z.reshape(-1, z.shape[-1])
        e = self.codebook()
        dist = flat.pow(2).sum(1, keepdim=True) + e.pow(2).sum(1) - 2.0 * flat @ e.t()
        return dist.argmin(1).view(z.shape[:-1])

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        zp = self.prepare(z)
        codes = self.lookup(zp.detach())
        zq = self.codebook()[codes]
        losses = {
            "codebook": F.mse_loss(zq, zp.detach()),
            "commit": self.beta * F.mse_loss(zp, zq.detach()),
        }
        zq = zp + (zq - zp).detach()  # straight-through estimator
        return zq.permute(0, 3, 1, 2), codes.flatten(1), losses


# --------------------------------------------------------------------------- model


class VQModel(nn.Module):
    """LlamaGen-architecture VQ tokenizer: images in [-1, 1] <-> (B, h*w) code ids."""

    def __init__(self, config: VQConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else VQConfig()
        cfg = self.config
        self.encoder = _Encoder(cfg)
        self.decoder = _Decoder(cfg)
        self.quantize = Quantizer(cfg)
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(cfg.codebook_embed_dim, cfg.z_channels, 1)

    # ---- properties
    @property
    def codebook(self) -> torch.Tensor:
        """(V, d) codebook as the quantiser uses it (L2-normalised rows if codebook_l2_norm); detached."""
        return self.quantize.codebook().detach()

    @property
    def downsample(self) -> int:
        return self.config.downsample

    # ---- encode / decode
    def _check_images(self, images: torch.Tensor) -> None:
        if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[1] != 3:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"images must be a float tensor (B, 3, H, W), got {shape}")
        if not images.is_floating_point():
            raise ValueError(f"images must be a float tensor in [-1, 1], got dtype {images.dtype}")
        f = self.downsample
        if images.shape[2] % f or images.shape[3] % f:
            raise ValueError(f"images height and width must be multiples of {f}, got {tuple(images.shape[2:])}")

    def encode_latents(self, images: torch.Tensor, normalized: bool = False) -> torch.Tensor:
        """Pre-quantisation latents (B, d, h, w); ``normalized`` applies the quantiser's L2 norm."""
        self._check_images(images)
        z = self.quant_conv(self.encoder(images))
        if normalized and self.config.codebook_l2_norm:
            z = F.normalize(z, dim=1)
        return z

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [-1, 1] -> LongTensor codes (B, h*w), row-major (no autograd)."""
        z = self.quantize.prepare(self.encode_latents(images))
        return self.quantize.lookup(z).flatten(1)

    def decode_latents(self, z: torch.Tensor) -> torch.Tensor:
        """Latents (B, d, h, w) in codebook space -> images (B, 3, H, W) clamped to [-1, 1]."""
        if z.dim() != 4 or z.shape[1] != self.config.codebook_embed_dim:
            raise ValueError(f"z must be (B, {self.config.codebook_embed_dim}, h, w), got {tuple(z.shape)}")
        return self.decoder(self.post_quant_conv(z)).clamp(-1.0, 1.0)

    @torch.no_grad()
    def decode_continuous(self, tokens: torch.Tensor) -> torch.Tensor:
        """Continuous tokens (B, h*w, d) of a square grid (``ContinuousAR`` outputs trained on
        ``tokenize --latents``) -> images (B, 3, H, W): each token is L2-normalised onto the codebook
        sphere (when the codebook is), then decoded like codebook latents."""
        d = self.config.codebook_embed_dim
        B, n = tokens.shape[:2]
        side = math.isqrt(n)
        if tokens.dim() != 3 or side * side != n or tokens.shape[2] != d:
            raise ValueError(f"continuous tokens must be (B, square, {d}), got {tuple(tokens.shape)}")
        z = tokens.float().transpose(1, 2).reshape(B, d, side, side)
        if self.config.codebook_l2_norm:
            z = F.normalize(z, dim=1)
        return self.decode_latents(z.to(self.post_quant_conv.weight.dtype))

    def codes_to_latents(self, codes: torch.Tensor, size: tuple[int, int] | None = None) -> torch.Tensor:
        """Codes (B, h*w) -> codebook latents (B, d, h, w); square grid unless ``size`` is given."""
        if codes.dim() != 2 or codes.dtype not in (torch.int16, torch.int32, torch.int64, torch.uint8):
            raise ValueError(f"codes must be an integer tensor (B, h*w), got {codes.dtype} {tuple(codes.shape)}")
        n = codes.shape[1]
        if size is None:
            side = math.isqrt(n)
            if side * side != n:
                raise ValueError(f"codes length {n} is not a square; pass size=(h, w)")
            size = (side, side)
        h, w = size
        if h * w != n:
            raise ValueError(f"size {size} does not match codes length {n}")
        codes = codes.long()
        if n and (int(codes.min()) < 0 or int(codes.max()) >= self.config.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.config.codebook_size})")
        return self.quantize.codebook()[codes].view(codes.shape[0], h, w, -1).permute(0, 3, 1, 2)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, size: tuple[int, int] | None = None) -> torch.Tensor:
        """Codes (B, h*w) -> images (B, 3, H, W) in [-1, 1] (no autograd; use decode_latents for gradients)."""
        return self.decode_latents(self.codes_to_latents(codes, size))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Training pass: (unclamped reconstruction, {"codebook": tensor, "commit": beta-weighted tensor})."""
        zq, _, losses = self.quantize(self.encode_latents(images))
        return self.decoder(self.post_quant_conv(zq)), losses

    # ---- persistence
    def save_pretrained(self, directory: str | os.PathLike, dtype: torch.dtype | None = None) -> None:
        """Write ``config.json`` and ``model.safetensors`` into ``directory`` (atomically per file)."""
        save_pretrained(self, asdict(self.config), directory, dtype)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, *, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> "VQModel":
        """Load a directory written by :meth:`save_pretrained` (streamed into ``dtype`` on ``device``)."""
        def build(raw: dict) -> "VQModel":
            unknown = sorted(set(raw) - {f.name for f in fields(VQConfig)})
            if unknown:
                raise ValueError(f"{directory}: unknown VQ config field {unknown[0]!r}")
            return cls(VQConfig(**raw))

        return load_pretrained(build, directory, dtype=dtype, device=device)

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, *, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32, **overrides: Any) -> "VQModel":
        """Load an official LlamaGen tokenizer file (``{"model"|"ema": state_dict}`` or a raw state_dict).

        Sizes are inferred from tensor shapes; ``overrides`` set VQConfig fields that shapes cannot
        tell (``codebook_l2_norm``, ``norm_groups``, ``commit_loss_beta``) or force any other field.
        """
        sd = read_state_dict(path, prefer=("model", "ema", "state_dict"), ignore=("codebook_used",))
        known = {f.name for f in fields(VQConfig)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ValueError(f"unknown VQConfig field {bad[0]!r}")
        cfg_kwargs = _infer_config(sd, str(path))
        cfg_kwargs.update(overrides)
        config = VQConfig(**cfg_kwargs)
        return build_from_state_dict(lambda: cls(config), sd, str(path), dtype=dtype, device=device)


# --------------------------------------------------------------------------- helpers


def _indices(sd: dict[str, torch.Tensor], pattern: str) -> list[int]:
    rx = re.compile(pattern)
    return sorted({int(m.group(1)) for k in sd for m in [rx.match(k)] if m})


def _infer_config(sd: dict[str, torch.Tensor], where: str) -> dict[str, Any]:
    try:
        emb = sd["quantize.embedding.weight"]
        ch = sd["encoder.conv_in.weight"].shape[0]
        z_channels = sd["encoder.conv_out.weight"].shape[0]
        levels = _indices(sd, r"encoder\.conv_blocks\.(\d+)\.res\.0\.conv1\.weight$")
        n_res = len(_indices(sd, r"encoder\.conv_blocks\.0\.res\.(\d+)\.conv1\.weight$"))
        dec_levels = _indices(sd, r"decoder\.conv_blocks\.(\d+)\.res\.0\.conv1\.weight$")
        enc_out = [sd[f"encoder.conv_blocks.{i}.res.0.conv2.weight"].shape[0] for i in levels]
        dec_out = [sd[f"decoder.conv_blocks.{i}.res.0.conv2.weight"].shape[0] for i in dec_levels]
    except KeyError as exc:
        raise ValueError(f"{where}: not a LlamaGen VQ checkpoint (missing {exc.args[0]})") from None
    if emb.dim() != 2 or not levels or levels != list(range(len(levels))) or not n_res:
        raise ValueError(f"{where}: unexpected VQ checkpoint layout")
    if any(c % ch for c in enc_out + dec_out):
        raise ValueError(f"{where}: block channels are not multiples of encoder.conv_in channels ({ch})")
    return {
        "codebook_size": int(emb.shape[0]),
        "codebook_embed_dim": int(emb.shape[1]),
        "z_channels": int(z_channels),
        "ch": int(ch),
        "num_res_blocks": n_res,
        "encoder_ch_mult": [c // ch for c in enc_out],
        "decoder_ch_mult": [c // ch for c in reversed(dec_out)],  # decoder blocks run from the deepest level
    }
