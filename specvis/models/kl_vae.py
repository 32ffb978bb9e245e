"""LDM's KL-regularised autoencoder (AutoencoderKL) as MAR uses it: the KL-16 tokenizer of continuous latents.

The module tree reproduces the parameter names of MAR's ``models/vae.py`` (itself LDM's
``ldm/modules/diffusionmodules/model.py``), so the official ``pretrained_models/vae/kl16.ckpt`` loads
strictly::

    encoder.conv_in, encoder.down.{i}.block.{j}.{norm1,conv1,norm2,conv2,nin_shortcut},
    encoder.down.{i}.attn.{j}.{norm,q,k,v,proj_out}, encoder.down.{i}.downsample.conv,
    encoder.mid.{block_1,attn_1,block_2}, encoder.norm_out, encoder.conv_out, quant_conv,
    post_quant_conv, decoder.conv_in, decoder.mid.*, decoder.up.{i}.block.{j} (num_res_blocks + 1 per
    level), decoder.up.{i}.attn.{j}, decoder.up.{i}.upsample.conv, decoder.norm_out, decoder.conv_out

KL-16 (MAR ``main_mar.py``: ``AutoencoderKL(embed_dim=16, ch_mult=(1, 1, 2, 2, 4))``): ch 128, two res
blocks per level, attention at resolution 16 in the encoder only, a 2*16-channel moments output
(mean, log variance clamped to [-30, 20]), 256 x 256 images -> 16 x 16 x 16 latents.

MAR trains and samples on ``latent * 0.2325`` (``engine_mar.py``: ``posterior.sample().mul_(0.2325)``
and ``vae.decode(sampled_tokens / 0.2325)``). Here ``encode``/``decode`` work on MAR's scaled latents
(``scale_factor``); ``encode_moments``/``decode_raw`` are the unscaled official ``encode``/``decode``.
Images are (B, 3, H, W) in [-1, 1].
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from .checkpoint import build_from_state_dict, read_state_dict
from .conv_blocks import Decoder, Encoder

__all__ = ["KLVAEConfig", "KLVAE", "MAR_LATENT_SCALE"]

MAR_LATENT_SCALE = 0.2325


@dataclass
class KLVAEConfig:
    """Field names follow LDM's ddconfig (``ch``, ``ch_mult``, ``num_res_blocks``, ``resolution``, ...);
    ``embed_dim`` is AutoencoderKL's. ``norm_groups`` (32 in LDM) lets tests build tiny models."""

    embed_dim: int = 16
    ch: int = 128
    ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    num_res_blocks: int = 2
    resolution: int = 256
    in_channels: int = 3
    out_ch: int = 3
    encoder_attn_resolutions: list[int] = field(default_factory=lambda: [16])
    decoder_attn_resolutions: list[int] = field(default_factory=list)
    use_variational: bool = True
    norm_groups: int = 32
    scale_factor: float = MAR_LATENT_SCALE

    def __post_init__(self) -> None:
        self.ch_mult = [int(m) for m in self.ch_mult]
        self.encoder_attn_resolutions = [int(r) for r in self.encoder_attn_resolutions]
        self.decoder_attn_resolutions = [int(r) for r in self.decoder_attn_resolutions]
        for name in ("embed_dim", "ch", "num_res_blocks", "resolution", "in_channels", "out_ch", "norm_groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"KLVAEConfig.{name} must be a positive int, got {value!r}")
        if not self.ch_mult or any(m < 1 for m in self.ch_mult):
            raise ValueError(f"KLVAEConfig.ch_mult must be a non-empty list of positive ints, got {self.ch_mult!r}")
        if any((self.ch * m) % self.norm_groups for m in self.ch_mult):
            raise ValueError(f"KLVAEConfig.norm_groups ({self.norm_groups}) must divide every ch * ch_mult")
        if not self.scale_factor > 0:
            raise ValueError(f"KLVAEConfig.scale_factor must be > 0, got {self.scale_factor!r}")

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


class KLVAE(nn.Module):
    """AutoencoderKL with MAR's latent scaling (see the module docstring)."""

    def __init__(self, config: KLVAEConfig | None = None) -> None:
        super().__init__()
        self.config = cfg = config or KLVAEConfig()
        self.embed_dim = cfg.embed_dim
        shape = dict(ch=cfg.ch, ch_mult=cfg.ch_mult, num_res_blocks=cfg.num_res_blocks, resolution=cfg.resolution,
                     groups=cfg.norm_groups)
        self.encoder = Encoder(in_channels=cfg.in_channels, attn_resolutions=cfg.encoder_attn_resolutions,
                               out_channels=2 * cfg.embed_dim, **shape)  # double_z: mean and log variance
        self.decoder = Decoder(in_channels=cfg.embed_dim, attn_resolutions=cfg.decoder_attn_resolutions,
                               out_channels=cfg.out_ch, **shape)
        mult = 2 if cfg.use_variational else 1
        self.quant_conv = nn.Conv2d(2 * cfg.embed_dim, mult * cfg.embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.embed_dim, 1)

    @property
    def downsample(self) -> int:
        return self.config.downsample

    # ---- official (unscaled) ----
    def encode_moments(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and log variance (B, E, h, w) (log variance clamped to [-30, 20]; a
        non-variational model has log variance 0, as LDM's ones-padding)."""
        moments = self.quant_conv(self.encoder(images))
        if not self.config.use_variational:
            return moments, torch.zeros_like(moments)
        mean, logvar = moments.chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)

    def decode_raw(self, z: torch.Tensor) -> torch.Tensor:
        """Unscaled latents (B, E, h, w) -> images (B, 3, H, W), nominally in [-1, 1] (not clamped)."""
        return self.decoder(self.post_quant_conv(z))

    # ---- MAR's scaled latents ----
    def encode(self, images: torch.Tensor, sample: bool = False,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """MAR latents ``z * scale_factor`` (B, E, h, w): the posterior mean, or a posterior sample
        (``sample=True``, what MAR trains on)."""
        mean, logvar = self.encode_moments(images)
        z = mean
        if sample:
            z = mean + torch.exp(0.5 * logvar) * torch.randn(mean.shape, device=mean.device, dtype=mean.dtype,
                                                             generator=generator)
        return z * self.config.scale_factor

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """MAR latents (B, E, h, w) -> images (B, 3, H, W) clamped to [-1, 1]: divides by the scale factor first."""
        return self.decode_raw(latents / self.config.scale_factor).clamp(-1.0, 1.0)

    # ---- files ----
    def config_dict(self) -> dict:
        return asdict(self.config)

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, config: KLVAEConfig | None = None, *,
                        device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> "KLVAE":
        """The official file (``kl16.ckpt``: the state dict under ``model``; LDM's ``state_dict`` or a bare
        state dict also work; LDM's training-loss tensors ``loss.*`` are dropped). The config is
        inferred from the tensors unless given; ``resolution`` 256 places the attention levels. The
        file is memory-mapped and streamed into ``dtype`` on ``device``. Any unreadable or mismatched
        file raises a one-line ValueError."""
        sd = read_state_dict(path, prefer=("model", "state_dict"))
        sd = {k: v for k, v in sd.items() if not k.startswith("loss.")}
        if config is None:
            config = infer_config(sd, str(path))
        return build_from_state_dict(lambda: cls(config), sd, str(path), dtype=dtype, device=device)

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """The official layout: ``{"model": state_dict}``."""
        torch.save({"model": self.state_dict()}, str(path))


def _levels(sd: dict[str, torch.Tensor], pattern: str) -> list[int]:
    found = {int(m.group(1)) for k in sd if (m := re.match(pattern, k))}
    return sorted(found)


def infer_config(sd: dict[str, torch.Tensor], where: str, resolution: int = 256) -> KLVAEConfig:
    """A ``KLVAEConfig`` from an AutoencoderKL state dict's shapes (one-line ValueError if it is not one)."""
    try:
        embed_dim = sd["post_quant_conv.weight"].shape[0]
        ch = sd["encoder.conv_in.weight"].shape[0]
        levels = _levels(sd, r"encoder\.down\.(\d+)\.")
        ch_mult = [sd[f"encoder.down.{i}.block.0.conv1.weight"].shape[0] // ch for i in levels]
        num_res_blocks = len(_levels(sd, r"encoder\.down\.0\.block\.(\d+)\."))
        enc_attn = [resolution >> i for i in levels if f"encoder.down.{i}.attn.0.q.weight" in sd]
        dec_attn = [resolution >> i for i in levels if f"decoder.up.{i}.attn.0.q.weight" in sd]
        variational = sd["quant_conv.weight"].shape[0] == 2 * embed_dim
        groups = 32 if ch % 32 == 0 else ch
        return KLVAEConfig(embed_dim=embed_dim, ch=ch, ch_mult=ch_mult, num_res_blocks=num_res_blocks,
                           resolution=resolution, in_channels=sd["encoder.conv_in.weight"].shape[1],
                           out_ch=sd["decoder.conv_out.weight"].shape[0], encoder_attn_resolutions=enc_attn,
                           decoder_attn_resolutions=dec_attn, use_variational=variational, norm_groups=groups)
    except KeyError as e:
        raise ValueError(f"{where}: not an AutoencoderKL checkpoint (lacks {e.args[0]!r})") from None
