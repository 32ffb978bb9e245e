"""MAR (Li et al. 2024, "Autoregressive Image Generation without Vector Quantization"): a bidirectional
masked encoder-decoder ViT over patchified KL-VAE latents whose output z at every masked position
conditions a per-token diffusion MLP (DiffLoss), sampled in a random order with a cosine mask schedule.

Parameter names are the official ones (``models/mar.py`` of LTH14/mar), so the ``model`` / ``model_ema``
state dicts of an official ``checkpoint-last.pth`` load strictly::

    class_emb, fake_latent, z_proj, z_proj_ln, encoder_pos_embed_learned, encoder_blocks.{i}.*,
    encoder_norm, decoder_embed, mask_token, decoder_pos_embed_learned, decoder_blocks.{i}.*,
    decoder_norm, diffusion_pos_embed_learned, diffloss.net.*

(ViT blocks in timm's layout: norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2.) The diffusion head
is specvis's ``DiffusionHead`` (``models/continuous.py``), whose ``DiffusionMLP`` computes exactly
SimpleMLPAdaLN; only its block names differ, and a state-dict hook pair maps them to the official
``diffloss.net.res_blocks.{i}.{in_ln,mlp,adaLN_modulation}`` / ``final_layer.{adaLN_modulation,linear}``
(``to_official_key`` / ``from_official_key``), so ``state_dict()`` and ``load_state_dict()`` speak the
official names.

Model (official ``forward_mae_encoder`` / ``forward_mae_decoder``): tokens (B, L, C) -> ``z_proj``; the
``buffer_size`` buffer positions all hold the class embedding (``fake_latent`` for the null class);
+ learned positions, LayerNorm, masked tokens dropped, encoder blocks, norm; ``decoder_embed``, mask
tokens put back at the masked positions, + positions, decoder blocks, norm, buffer dropped,
+ ``diffusion_pos_embed_learned`` -> z (B, L, D_dec).

Training (``forward_train``, official ``forward``): a random order per sample, one mask ratio per batch
from a truncated normal on [mask_ratio_min, 1] (mean 1, std 0.25), ceil(L * ratio) tokens masked (the
first of the order), class replaced by ``fake_latent`` with probability ``label_drop_prob``, the
diffusion loss on the masked tokens only, each repeated ``diffusion_batch_mul`` times. The per-token
loss is ``GaussianDiffusion.training_loss`` (MSE on epsilon + the learned-variance VLB term); one
departure from the official ADM code: at t = 0 the VLB term is a continuous Gaussian NLL, not the
8-bit discretised pixel likelihood (which does not fit latents; see ``specvis/diffusion.py``).

Sampling (``sample``, official ``sample_tokens``): a random order per sample; after step s the first
m_s = max(1, min(remaining - 1, floor(L cos(pi/2 (s+1)/num_iter)))) tokens of the order stay masked,
the last step reveals all that remain; each step runs the transformer on the current tokens and draws
the newly revealed tokens with the DiffLoss sampler (respaced to ``num_sampling_steps``, temperature on
the step noise, no noise on the last step as in the official ``p_sample``). CFG (``cfg`` != 1): both
halves in one batch (null class = ``fake_latent``), epsilon guided, variance from the conditional
half, the same noise for both halves; ``cfg_schedule`` "linear": scale 1 + (cfg - 1) (L - m_s) / L at
step s, "constant": cfg. Randomness comes from one ``torch.Generator`` per sample (``seed``), drawn in
a fixed per-sample sequence (order, then per step x_T and the step noises of its revealed tokens), so a
sample depends only on its own seed and label: batch B equals B batch-1 runs (up to float rounding).
The official code draws from numpy / the global CUDA RNG, so bitwise equality with it is not a goal.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import one_line
from ..diffusion import StepSpec, space_timesteps
from .continuous import DiffusionHead

__all__ = ["MARConfig", "MAR", "MARSample", "mask_schedule", "cfg_scales", "load_mar_checkpoint",
           "to_official_key", "from_official_key", "PRESETS"]

PRESETS: dict[str, dict[str, int]] = {  # models/mar.py mar_base/large/huge + README's diffloss_d/w
    "mar_base": dict(encoder_embed_dim=768, encoder_depth=12, encoder_num_heads=12, decoder_embed_dim=768,
                     decoder_depth=12, decoder_num_heads=12, diffloss_d=6, diffloss_w=1024),
    "mar_large": dict(encoder_embed_dim=1024, encoder_depth=16, encoder_num_heads=16, decoder_embed_dim=1024,
                      decoder_depth=16, decoder_num_heads=16, diffloss_d=8, diffloss_w=1280),
    "mar_huge": dict(encoder_embed_dim=1280, encoder_depth=20, encoder_num_heads=16, decoder_embed_dim=1280,
                     decoder_depth=20, decoder_num_heads=16, diffloss_d=12, diffloss_w=1536),
}
CHECKPOINT_NAME = "checkpoint-last.pth"  # the official file name of a MAR run (pretrained_models/mar/mar_base/)
DEFAULT_CFG = {"mar_base": 2.9, "mar_large": 3.0, "mar_huge": 3.2}  # README evaluation commands


@dataclass
class MARConfig:
    """The official ``MAR.__init__`` arguments (defaults as there, except ``norm_eps`` 1e-6 of the
    presets' ``partial(nn.LayerNorm, eps=1e-6)``), plus ``num_train_steps`` (DiffLoss's 1000)."""

    img_size: int = 256
    vae_stride: int = 16
    patch_size: int = 1
    encoder_embed_dim: int = 1024
    encoder_depth: int = 16
    encoder_num_heads: int = 16
    decoder_embed_dim: int = 1024
    decoder_depth: int = 16
    decoder_num_heads: int = 16
    mlp_ratio: float = 4.0
    vae_embed_dim: int = 16
    mask_ratio_min: float = 0.7
    label_drop_prob: float = 0.1
    class_num: int = 1000
    attn_dropout: float = 0.1
    proj_dropout: float = 0.1
    buffer_size: int = 64
    diffloss_d: int = 3
    diffloss_w: int = 1024
    num_sampling_steps: int | str = 100
    diffusion_batch_mul: int = 4
    num_train_steps: int = 1000
    norm_eps: float = 1e-6
    clip_denoised: float | None = None  # specvis: clip the predicted x_0 when sampling (None: official, no clip)
    model: str = field(default="", compare=False)  # preset name, informational

    def __post_init__(self) -> None:
        self.num_sampling_steps = _steps(self.num_sampling_steps)  # checked against num_train_steps below
        for name in ("img_size", "vae_stride", "patch_size", "encoder_embed_dim", "encoder_depth",
                     "encoder_num_heads", "decoder_embed_dim", "decoder_depth", "decoder_num_heads",
                     "vae_embed_dim", "class_num", "diffloss_d", "diffloss_w", "diffusion_batch_mul",
                     "num_train_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"MARConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.buffer_size, int) or self.buffer_size < 0:
            raise ValueError(f"MARConfig.buffer_size must be an int >= 0, got {self.buffer_size!r}")
        if self.img_size % (self.vae_stride * self.patch_size):
            raise ValueError(f"MARConfig.img_size ({self.img_size}) must be a multiple of vae_stride * patch_size")
        for dim, heads in (("encoder_embed_dim", "encoder_num_heads"), ("decoder_embed_dim", "decoder_num_heads")):
            if getattr(self, dim) % getattr(self, heads):
                raise ValueError(f"MARConfig.{heads} must divide {dim}")
        if not 0 < self.mask_ratio_min <= 1:
            raise ValueError(f"MARConfig.mask_ratio_min must be in (0, 1], got {self.mask_ratio_min!r}")
        if not 0 <= self.label_drop_prob < 1:
            raise ValueError(f"MARConfig.label_drop_prob must be in [0, 1), got {self.label_drop_prob!r}")
        space_timesteps(self.num_train_steps, self.num_sampling_steps, "MARConfig.num_sampling_steps")

    @classmethod
    def preset(cls, name: str, **overrides) -> "MARConfig":
        """``mar_base``, ``mar_large`` or ``mar_huge`` (with the README's diffloss depth/width)."""
        if name not in PRESETS:
            raise ValueError(f"unknown MAR preset {name!r}; choose from {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], "model": name, **overrides})

    @property
    def seq_h(self) -> int:
        return self.img_size // self.vae_stride // self.patch_size

    @property
    def seq_len(self) -> int:
        return self.seq_h ** 2

    @property
    def token_embed_dim(self) -> int:
        return self.vae_embed_dim * self.patch_size ** 2


def _steps(value) -> StepSpec:
    """``num_sampling_steps`` as the official code takes it (``main_mar.py --num_sampling_steps``, a string):
    a count ("100" or 100) becomes an int, a section list ("10,15,20") or "ddimN" stays a string; the
    form is checked by ``space_timesteps`` against num_train_steps."""
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*", value):
        return int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"MARConfig.num_sampling_steps must be a step count like 100 or '100', per-section counts "
                         f"like '10,15,20', or 'ddimN', got {value!r}")
    return value


# ---------------------------------------------------------------- ViT blocks (timm's layout)

class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, attn_drop: float, proj_drop: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, D // self.num_heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, D)))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, drop: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm ViT block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, eps: float, attn_drop: float, proj_drop: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, num_heads, attn_drop, proj_drop)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


# ---------------------------------------------------------------- official <-> our head names

_HEAD = "diffloss.net."
_RENAMES = [  # (ours, official) inside diffloss.net.
    (r"blocks\.(\d+)\.norm\.", r"res_blocks.\1.in_ln."),
    (r"blocks\.(\d+)\.mlp\.", r"res_blocks.\1.mlp."),
    (r"blocks\.(\d+)\.modulation\.1\.", r"res_blocks.\1.adaLN_modulation.1."),
    (r"final_modulation\.1\.", r"final_layer.adaLN_modulation.1."),
    (r"output\.", r"final_layer.linear."),
]
_BACK = [  # (official, ours)
    (r"res_blocks\.(\d+)\.in_ln\.", r"blocks.\1.norm."),
    (r"res_blocks\.(\d+)\.mlp\.", r"blocks.\1.mlp."),
    (r"res_blocks\.(\d+)\.adaLN_modulation\.1\.", r"blocks.\1.modulation.1."),
    (r"final_layer\.adaLN_modulation\.1\.", r"final_modulation.1."),
    (r"final_layer\.linear\.", r"output."),
]
_TO = [(re.compile("^" + a), b) for a, b in _RENAMES]
_FROM = [(re.compile("^" + a), b) for a, b in _BACK]


def _rename(key: str, prefix: str, table) -> str:
    head = prefix + _HEAD
    if not key.startswith(head):
        return key
    rest = key[len(head):]
    for pattern, repl in table:
        if pattern.match(rest):
            return head + pattern.sub(repl, rest, count=1)
    return key


def to_official_key(key: str, prefix: str = "") -> str:
    """Our ``diffloss.net.blocks.0.norm.weight`` -> the official ``diffloss.net.res_blocks.0.in_ln.weight``."""
    return _rename(key, prefix, _TO)


def from_official_key(key: str, prefix: str = "") -> str:
    return _rename(key, prefix, _FROM)


def _rename_in_place(state_dict: dict, prefix: str, fn) -> None:
    items = list(state_dict.items())
    state_dict.clear()
    for k, v in items:
        state_dict[fn(k, prefix)] = v


# ---------------------------------------------------------------- schedules

def mask_schedule(seq_len: int, num_iter: int) -> tuple[list[int], list[int]]:
    """(mask_len, reveals) per step of the official sampler: ``mask_len[s]`` = max(1, min(remaining - 1,
    floor(seq_len * cos(pi/2 (s+1)/num_iter)))), the tokens left masked after step s (and the value the
    linear CFG schedule uses, also at the last step), and ``reveals[s]``, the tokens drawn at step s (the
    last step draws all that remain; a step may draw none when num_iter > seq_len)."""
    if not isinstance(num_iter, int) or num_iter < 1:
        raise ValueError(f"num_iter must be an int >= 1, got {num_iter!r}")
    remaining, lens, reveals = seq_len, [], []
    for step in range(num_iter):
        ratio = math.cos(math.pi / 2.0 * (step + 1) / num_iter)
        m = max(1, min(remaining - 1, math.floor(seq_len * ratio)))
        lens.append(m)
        if step == num_iter - 1:
            reveals.append(remaining)
            remaining = 0
        else:
            reveals.append(remaining - m)
            remaining = m
    return lens, reveals


def cfg_scales(cfg: float, cfg_schedule: str, seq_len: int, mask_lens: list[int]) -> list[float]:
    """The guidance scale of every step: "linear" 1 + (cfg - 1) (L - mask_len) / L (Muse), "constant" cfg."""
    if cfg_schedule == "linear":
        return [1 + (cfg - 1) * (seq_len - m) / seq_len for m in mask_lens]
    if cfg_schedule == "constant":
        return [float(cfg)] * len(mask_lens)
    raise ValueError(f"cfg_schedule must be 'linear' or 'constant', got {cfg_schedule!r}")


def _generators(B: int, seed, generator, device) -> list:
    """One generator per sample: a list given as is, one generator shared (drawn sample after sample),
    ``seed`` int -> sample i uses seed + i, a list of seeds -> one each, nothing -> the global RNG."""
    if generator is not None:
        gens = list(generator) if isinstance(generator, (list, tuple)) else [generator] * B
    elif seed is None:
        gens = [None] * B
    else:
        seeds = [int(seed) + i for i in range(B)] if isinstance(seed, int) else [int(s) for s in seed]
        gens = [torch.Generator(device=device).manual_seed(s) for s in seeds]
    if len(gens) != B:
        raise ValueError(f"need one seed/generator per sample ({B}), got {len(gens)}")
    return gens


@dataclass
class MARSample:
    """What ``MAR.sample`` drew. ``tokens`` (B, L, C) patchified latents (MAR's scale); ``order`` (B, L)
    the official generation order (tokens are revealed from its end: after step s the first
    mask_lens[s] stay masked); ``steps[s]`` (B, reveals[s]) the positions drawn at step s, in the order
    their noise was drawn; ``cfg_scales[s]`` the guidance scale used at step s."""

    tokens: torch.Tensor
    order: torch.Tensor
    steps: list[torch.Tensor]
    reveals: list[int]
    mask_lens: list[int]
    cfg_scales: list[float]

    @property
    def step_of(self) -> torch.Tensor:
        """(B, L): the step at which each position was drawn."""
        out = torch.full(self.order.shape, -1, dtype=torch.long, device=self.order.device)
        for s, idx in enumerate(self.steps):
            out.scatter_(1, idx, s)
        return out


# ---------------------------------------------------------------- the model

class MAR(nn.Module):
    def __init__(self, config: MARConfig | None = None) -> None:
        super().__init__()
        self.config = cfg = config or MARConfig()
        self.seq_h = self.seq_w = cfg.seq_h
        self.seq_len = cfg.seq_len
        self.token_embed_dim = C = cfg.token_embed_dim
        self.buffer_size = cfg.buffer_size
        self.num_classes = cfg.class_num
        self.num_conditions = cfg.class_num  # class-conditional (``TokenModel.num_conditions``)
        E, Dd = cfg.encoder_embed_dim, cfg.decoder_embed_dim
        L = self.seq_len + cfg.buffer_size

        self.class_emb = nn.Embedding(cfg.class_num, E)
        self.fake_latent = nn.Parameter(torch.zeros(1, E))
        self.z_proj = nn.Linear(C, E, bias=True)
        self.z_proj_ln = nn.LayerNorm(E, eps=1e-6)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, L, E))
        self.encoder_blocks = nn.ModuleList(
            Block(E, cfg.encoder_num_heads, cfg.mlp_ratio, cfg.norm_eps, cfg.attn_dropout, cfg.proj_dropout)
            for _ in range(cfg.encoder_depth))
        self.encoder_norm = nn.LayerNorm(E, eps=cfg.norm_eps)
        self.decoder_embed = nn.Linear(E, Dd, bias=True)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, Dd))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, L, Dd))
        self.decoder_blocks = nn.ModuleList(
            Block(Dd, cfg.decoder_num_heads, cfg.mlp_ratio, cfg.norm_eps, cfg.attn_dropout, cfg.proj_dropout)
            for _ in range(cfg.decoder_depth))
        self.decoder_norm = nn.LayerNorm(Dd, eps=cfg.norm_eps)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, self.seq_len, Dd))
        self.initialize_weights()
        # DiffLoss: SimpleMLPAdaLN (its own init, zero-initialised modulations and output), cosine
        # schedule of num_train_steps, learned sigma, sampling respaced to num_sampling_steps, no clipping
        self.diffloss = DiffusionHead(C, Dd, cfg.diffloss_w, cfg.diffloss_d, cfg.num_train_steps,
                                      cfg.num_sampling_steps, "cosine", learn_sigma=True,
                                      clip_denoised=cfg.clip_denoised)
        self.register_state_dict_post_hook(_state_dict_hook)
        self.register_load_state_dict_pre_hook(_load_hook)

    def initialize_weights(self) -> None:
        for p in (self.class_emb.weight, self.fake_latent, self.mask_token, self.encoder_pos_embed_learned,
                  self.decoder_pos_embed_learned, self.diffusion_pos_embed_learned):
            nn.init.normal_(p, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm) and m.weight is not None:
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    # ---- layout ----
    @property
    def layout(self):
        """The token grid (``models.base.Layout``: seq_h x seq_w, no codebook: continuous tokens)."""
        from .base import Layout

        return Layout(self.seq_h, self.seq_w, 0)

    def patchify(self, latents: torch.Tensor) -> torch.Tensor:
        """(B, c, h, w) VAE latents -> (B, h/p * w/p, c p^2), channels-then-patch order as official."""
        B, c, h, w = latents.shape
        p = self.config.patch_size
        x = latents.reshape(B, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(B, (h // p) * (w // p), c * p * p)

    def unpatchify(self, tokens: torch.Tensor) -> torch.Tensor:
        B = tokens.shape[0]
        p, c, h = self.config.patch_size, self.config.vae_embed_dim, self.seq_h
        x = tokens.reshape(B, h, h, c, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(B, c, h * p, h * p)

    # ---- transformer ----
    def _keep(self, mask: torch.Tensor) -> torch.Tensor:
        buf = torch.zeros(mask.shape[0], self.buffer_size, dtype=torch.bool, device=mask.device)
        return ~torch.cat([buf, mask.bool()], dim=1)

    def forward_mae_encoder(self, tokens: torch.Tensor, mask: torch.Tensor, class_embedding: torch.Tensor) -> torch.Tensor:
        """tokens (B, L, C), mask (B, L) True = masked (every row the same count), class_embedding (B, E)
        -> encoder output (B, buffer + known, E)."""
        x = self.z_proj(tokens.to(self.z_proj.weight.dtype))
        B, _, E = x.shape
        buf = class_embedding.to(x.dtype)[:, None].expand(B, self.buffer_size, E)
        x = self.z_proj_ln(torch.cat([buf, x], dim=1) + self.encoder_pos_embed_learned)
        x = x[self._keep(mask)].reshape(B, -1, E)
        for block in self.encoder_blocks:
            x = block(x)
        return self.encoder_norm(x)

    def forward_mae_decoder(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Encoder output -> z (B, L, D_dec) for every position (+ diffusion position embedding)."""
        x = self.decoder_embed(x)
        B, _, D = x.shape
        keep = self._keep(mask)
        full = self.mask_token.to(x.dtype).expand(B, keep.shape[1], D).masked_scatter(keep[..., None], x)
        x = full + self.decoder_pos_embed_learned
        for block in self.decoder_blocks:
            x = block(x)
        x = self.decoder_norm(x)[:, self.buffer_size:]
        return x + self.diffusion_pos_embed_learned

    def class_embedding(self, labels: torch.Tensor | None, batch: int) -> torch.Tensor:
        """(B, E): ``class_emb(labels)``, or ``fake_latent`` (the null class) where labels is None or < 0."""
        fake = self.fake_latent.expand(batch, -1)
        if labels is None:
            return fake
        labels = torch.as_tensor(labels, device=self.fake_latent.device).long()
        emb = self.class_emb(labels.clamp(min=0))
        return torch.where((labels < 0)[:, None], fake, emb)

    def features(self, tokens: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        """z (B, L, D_dec) of the diffusion head at every position, for known tokens and a mask."""
        cls = self.class_embedding(labels, tokens.shape[0])
        return self.forward_mae_decoder(self.forward_mae_encoder(tokens, mask, cls), mask)

    def guided_class_embedding(self, labels: torch.Tensor | None, batch: int, guided: bool) -> torch.Tensor:
        """(B, E), or (2B, E) with the null class (``fake_latent``) rows appended when ``guided``."""
        cls = self.class_embedding(labels, batch)
        return torch.cat([cls, self.fake_latent.expand(batch, -1)]) if guided else cls

    def z_at(self, tokens: torch.Tensor, mask: torch.Tensor, class_embedding: torch.Tensor,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One MAR forward under bidirectional attention: the known tokens (``mask`` False) of ``tokens``
        (B, L, C) are encoded, every masked position gets the mask token, and z (B, n, D_dec) is read at
        ``positions`` (B, n) (masked ones: the positions to draw next). ``class_embedding`` has B rows,
        or 2B (``guided_class_embedding``): then both CFG halves run as one batch and the second z (the
        null-class half) is returned too, else None. Every row must have the same number of known tokens."""
        B = tokens.shape[0]
        guided = class_embedding.shape[0] == 2 * B
        x_in, m_in = (torch.cat([tokens, tokens]), torch.cat([mask, mask])) if guided else (tokens, mask)
        z = self.forward_mae_decoder(self.forward_mae_encoder(x_in, m_in, class_embedding), m_in)
        at = torch.cat([positions, positions]) if guided else positions
        z = z.gather(1, at[..., None].expand(-1, -1, z.shape[-1]))
        return (z[:B], z[B:]) if guided else (z, None)

    # ---- training ----
    def sample_orders(self, batch: int, generators: list) -> torch.Tensor:
        dev = self.fake_latent.device
        return torch.stack([torch.randperm(self.seq_len, generator=g, device=dev) for g in generators])

    def sample_mask_ratio(self, generator: torch.Generator | None = None) -> float:
        """One draw of the truncated normal on [mask_ratio_min, 1], loc 1, scale 0.25 (inverse CDF)."""
        a = torch.tensor((self.config.mask_ratio_min - 1.0) / 0.25, dtype=torch.float64)
        lo, hi = torch.special.ndtr(a), torch.special.ndtr(torch.zeros((), dtype=torch.float64))
        u = torch.rand((), dtype=torch.float64, generator=generator)
        return float(1.0 + 0.25 * torch.special.ndtri(lo + u * (hi - lo)))

    def forward_train(self, x: torch.Tensor, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The official training loss (scalar): ``x`` is patchified tokens (B, L, C) or VAE latents
        (B, c, h, w) at MAR's scale. ``generator`` (on the model's device) drives order, mask ratio,
        label drop and the diffusion steps/noise; dropout uses the global RNG."""
        if x.ndim == 4:
            x = self.patchify(x)
        B, L, C = x.shape
        if (L, C) != (self.seq_len, self.token_embed_dim):
            raise ValueError(f"MAR expects tokens (B, {self.seq_len}, {self.token_embed_dim}), got {tuple(x.shape)}")
        dev = x.device
        orders = self.sample_orders(B, [generator] * B)
        n_masked = math.ceil(L * self.sample_mask_ratio(generator))
        mask = torch.zeros(B, L, dtype=torch.bool, device=dev).scatter(1, orders[:, :n_masked], True)
        labels = torch.as_tensor(labels, device=dev).long()
        if self.training and self.config.label_drop_prob > 0:
            drop = torch.rand(B, device=dev, generator=generator) < self.config.label_drop_prob
            labels = torch.where(drop, torch.full_like(labels, -1), labels)
        z = self.features(x, mask, labels)
        mul = self.config.diffusion_batch_mul
        z = z.reshape(B * L, -1).repeat(mul, 1)
        target = x.reshape(B * L, C).repeat(mul, 1)
        m = mask.reshape(B * L).repeat(mul).to(z.dtype)
        loss = self.diffloss.loss(z, target.to(z.dtype), generator)
        return (loss * m).sum() / m.sum()

    forward = forward_train

    # ---- sampling ----
    @torch.no_grad()
    def sample(self, labels: torch.Tensor | None, num_iter: int = 64, cfg: float = 1.0, cfg_schedule: str = "linear",
               temperature: float = 1.0, seed: int | list[int] | None = None,
               generator: torch.Generator | list[torch.Generator] | None = None, batch: int | None = None,
               guidance: bool | None = None, reveals: list[int] | None = None, scales: list[float] | None = None,
               last_step_noise: bool = False, order: torch.Tensor | None = None) -> MARSample:
        """MAR's own sampler (see the module docstring). ``labels`` (B,) class ids (None or -1: the null
        class; then ``batch`` gives B); ``seed``: int (sample i uses seed + i) or one per sample;
        ``generator``: one or one per sample (on the model's device). ``guidance``: run the CFG branch
        (None: iff cfg != 1, as official; True with cfg 1 gives the unguided law).

        Beyond the official sampler (used by CSpD on MAR to state and test the law it samples):
        ``reveals`` (tokens drawn per step, summing to L) replaces the cosine schedule and ``scales``
        (one CFG scale per step) the CFG schedule; ``last_step_noise`` adds the step noise on the last
        denoising step too (the official ``p_sample`` adds none there); ``order`` (B, L) replaces the
        random order (the generators then draw no order)."""
        if labels is not None:
            labels = torch.as_tensor(labels, device=self.fake_latent.device).long().reshape(-1)
            B = labels.shape[0]
        elif batch is None:
            raise ValueError("give labels or batch")
        else:
            B = batch
        if labels is not None and bool((labels >= self.num_classes).any()):
            raise ValueError(f"class ids must be < {self.num_classes}, got {labels.tolist()}")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        L, C, K = self.seq_len, self.token_embed_dim, self.diffloss.num_steps
        dev = self.fake_latent.device
        if reveals is None:
            mask_lens, reveals = mask_schedule(L, num_iter)
        else:
            reveals = [int(n) for n in reveals]
            if sum(reveals) != L or min(reveals) < 0:
                raise ValueError(f"reveals must be counts >= 0 summing to {L}, got {reveals}")
            num_iter = len(reveals)
            mask_lens = [L - sum(reveals[:s + 1]) for s in range(num_iter)]
        if scales is None:
            scales = cfg_scales(cfg, cfg_schedule, L, mask_lens)
        elif len(scales) != num_iter:
            raise ValueError(f"need one CFG scale per step ({num_iter}), got {len(scales)}")
        guided = (cfg != 1.0) if guidance is None else bool(guidance)
        gens = _generators(B, seed, generator, dev)

        order = self.sample_orders(B, gens) if order is None else order.to(dev)
        tokens = torch.zeros(B, L, C, device=dev)
        mask = torch.ones(B, L, dtype=torch.bool, device=dev)
        cls = self.guided_class_embedding(labels, B, guided)
        steps, end = [], L
        for s in range(num_iter):
            n = reveals[s]
            idx = order[:, end - n:end]
            steps.append(idx)
            end -= n
            if n == 0:
                continue
            zc, zu = self.z_at(tokens, mask, cls, idx)
            zc = zc.reshape(B * n, -1)
            zu = zu.reshape(B * n, -1) if zu is not None else None
            x_T, noise = [], []
            for g in gens:
                x_T.append(torch.randn(n, C, device=dev, generator=g))
                noise.append(torch.randn(n, K, C, device=dev, generator=g))
            noise = torch.cat(noise)
            if not last_step_noise:
                noise[:, -1] = 0  # the official p_sample adds no noise at t == 0
            traj = self.diffloss.sample_trajectory(zc, zu, scales[s], temperature, x_T=torch.cat(x_T), noise=noise)
            x0 = traj.x0.reshape(B, n, C).to(tokens.dtype)
            tokens = tokens.scatter(1, idx[..., None].expand(-1, -1, C), x0)
            mask = mask.scatter(1, idx, False)
        return MARSample(tokens, order, steps, reveals, mask_lens, scales)

    # ---- files ----
    def config_dict(self) -> dict:
        return asdict(self.config)

    def save_checkpoint(self, path: str | os.PathLike, ema_state_dict: dict | None = None, args=None) -> None:
        """The official ``checkpoint-last.pth`` layout: ``{"model", "model_ema", "epoch", "args"}``
        (``model_ema`` defaults to the model's own weights)."""
        sd = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        ema = sd if ema_state_dict is None else ema_state_dict
        if args is None:
            args = argparse.Namespace(model=self.config.model or "custom", **{
                f.name: getattr(self.config, f.name) for f in fields(MARConfig) if f.name != "model"})
        torch.save({"model": sd, "model_ema": ema, "epoch": 0, "args": args}, str(path))


def _state_dict_hook(module, state_dict, prefix, local_metadata) -> None:
    _rename_in_place(state_dict, prefix, to_official_key)


def _load_hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs) -> None:
    _rename_in_place(state_dict, prefix, from_official_key)


# ---------------------------------------------------------------- loading official checkpoints

def _read(path: str | os.PathLike):
    """The checkpoint object, its tensors memory-mapped (``models.loading.read_torch_file``)."""
    from .loading import read_torch_file

    try:
        return read_torch_file(path, allowed=[argparse.Namespace])
    except FileNotFoundError:
        raise ValueError(f"MAR checkpoint not found: {path}") from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ValueError(f"unreadable MAR checkpoint {path}: {type(exc).__name__}: {one_line(exc)}"[:300]) from None


def infer_config(sd: dict[str, torch.Tensor], args=None, where: str = "") -> MARConfig:
    """A ``MARConfig`` from an official state dict's shapes and, where present, the checkpoint's ``args``
    (model name -> head counts, patch_size, vae_embed_dim, img_size, num_sampling_steps)."""
    a = vars(args) if isinstance(args, argparse.Namespace) else (args if isinstance(args, dict) else {})
    try:
        class_num, E = sd["class_emb.weight"].shape
        Dd = sd["decoder_embed.weight"].shape[0]
        seq_len = sd["diffusion_pos_embed_learned"].shape[1]
        buffer = sd["encoder_pos_embed_learned"].shape[1] - seq_len
        C = sd["z_proj.weight"].shape[1]
        w = sd["diffloss.net.input_proj.weight"].shape[0]
        hidden = sd["encoder_blocks.0.mlp.fc1.weight"].shape[0]
    except KeyError as e:
        raise ValueError(f"{where}: not a MAR state dict (lacks {e.args[0]!r})") from None
    count = lambda p: len({int(m.group(1)) for k in sd if (m := re.match(p, k))})  # noqa: E731
    preset = PRESETS.get(a.get("model", ""), {})
    by_width = {p["encoder_embed_dim"]: p for p in PRESETS.values()}  # official args name the preset only
    enc_heads = a.get("encoder_num_heads") or preset.get("encoder_num_heads") or by_width.get(E, {}).get("encoder_num_heads")
    dec_heads = a.get("decoder_num_heads") or preset.get("decoder_num_heads") or by_width.get(Dd, {}).get("decoder_num_heads")
    if not enc_heads or not dec_heads:
        raise ValueError(f"{where}: cannot tell the head count of a {E}-wide MAR: pass config=MARConfig(...)")
    patch = int(a.get("patch_size", 1))
    vae_dim = int(a.get("vae_embed_dim", C // patch ** 2))
    stride = int(a.get("vae_stride", 16))
    side = math.isqrt(seq_len)
    return MARConfig(img_size=int(a.get("img_size", side * stride * patch)), vae_stride=stride, patch_size=patch,
                     encoder_embed_dim=E, encoder_depth=count(r"encoder_blocks\.(\d+)\."), encoder_num_heads=enc_heads,
                     decoder_embed_dim=Dd, decoder_depth=count(r"decoder_blocks\.(\d+)\."), decoder_num_heads=dec_heads,
                     mlp_ratio=hidden / E, vae_embed_dim=vae_dim, class_num=class_num, buffer_size=buffer,
                     diffloss_d=count(r"diffloss\.net\.res_blocks\.(\d+)\."), diffloss_w=w,
                     num_sampling_steps=a.get("num_sampling_steps", 100),
                     mask_ratio_min=float(a.get("mask_ratio_min", 0.7)),
                     label_drop_prob=float(a.get("label_drop_prob", 0.1)),
                     diffusion_batch_mul=int(a.get("diffusion_batch_mul", 4)),
                     num_train_steps=int(a.get("num_train_steps", 1000)), norm_eps=float(a.get("norm_eps", 1e-6)),
                     clip_denoised=None if a.get("clip_denoised") is None else float(a["clip_denoised"]),
                     attn_dropout=float(a.get("attn_dropout", 0.1)), proj_dropout=float(a.get("proj_dropout", 0.1)),
                     model=str(a.get("model", "")))


def load_mar_checkpoint(path: str | os.PathLike, ema: bool = True, config: MARConfig | None = None,
                        num_sampling_steps: StepSpec | None = None, *, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> MAR:
    """An official ``checkpoint-last.pth`` (dict with ``model`` and ``model_ema`` state dicts, ``args``)
    -> ``MAR`` in eval mode with the EMA weights (``ema=False``: ``model``; a file without
    ``model_ema`` falls back to ``model``), loaded strictly. The config is inferred unless given;
    ``num_sampling_steps`` overrides the DiffLoss respacing. The file is memory-mapped and only the
    chosen weights are read, streamed into ``dtype`` on ``device`` (``models.loading``). Errors are
    one-line ValueErrors naming the missing / unexpected / mis-shaped key."""
    obj = _read(path)
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected the official MAR checkpoint dict (model, model_ema), got {type(obj).__name__}")
    names = ("model_ema", "model") if ema else ("model",)
    sd = next((obj[n] for n in names if isinstance(obj.get(n), dict)), None)
    if sd is None and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        sd = obj  # a bare state dict
    if sd is None:
        raise ValueError(f"{path}: no {' or '.join(repr(n) for n in names)} state dict in the checkpoint")
    sd = {(k[len("module."):] if k.startswith("module.") else k): v for k, v in sd.items()}
    if config is None:
        config = infer_config(sd, obj.get("args"), str(path))
    if num_sampling_steps is not None:
        config = MARConfig(**{**asdict(config), "num_sampling_steps": num_sampling_steps})
    from .checkpoint import build_from_state_dict

    return build_from_state_dict(lambda: MAR(config), sd, str(path), dtype=dtype, device=device,
                                 rename=from_official_key, display=to_official_key)
