"""Continuous-token autoregressive image models: a causal transformer whose output z at each position
conditions a small diffusion MLP head that samples the next continuous token (MAR's DiffLoss, Li et al.
2024, on a raster-order causal backbone).

Transformer: LlamaGen's ``TransformerBlock`` stack, 2D RoPE and static ``KVCache``, so the cached
protocol of ``models/base.py`` is the same (``setup_cache``, ``prefill``, ``forward_tokens``,
``set_committed``, ``keep_block``). Image tokens are vectors (B, n, C) projected by a linear layer
instead of an embedding; the condition is a class embedding whose extra row is the null class (CFG).
Where a discrete model returns logits, ``prefill``/``forward_tokens`` return z (rows, [n,] D): the
head's condition for the token *after* each fed position (z == hidden, returned twice to keep the
protocol's (logits, hidden) shape). Non-square grids take their 2D RoPE angles from a square table.

Head (``DiffusionHead``): residual MLP blocks with adaLN modulated by (timestep embedding + linear(z)),
DDPM with a cosine schedule over ``num_train_steps``, epsilon prediction, optional learned variance
(output 2C: eps and v interpolating log beta_t .. log beta_tilde_t, iDDPM Eq. 15), sampling respaced
to ``num_sampling_steps``. One token: x_K ~ N(0, I), then K steps x_{k-1} = mu + sigma * temperature
* eps_k (the temperature scales the step noise, not x_K, as in MAR). CFG acts on epsilon:
eps = eps_u + s (eps_c - eps_u), both halves in one batch, the variance from the conditional half
(as MAR). Two deliberate departures from MAR's sampler: (1) the last step adds noise too (its variance
is tiny, between beta_tilde_1 and beta_1), so that x_0 has a Gaussian density given x_1, which CSpD's
ratio (Eq. 5) and the exact trajectory ratio need; (2) temperature 0 is greedy: x_K = 0 and no step
noise, a deterministic map, as docs/design/api.md requires of temperature 0.

Adapting a bidirectional, masked MAR later: keep this protocol and the head, and change what a
"forward" means. ``prefill`` encodes the class/buffer tokens; ``forward_tokens(tokens, positions)``
adds the fed tokens to the known set and returns z for the *next* positions of the generation order
(MAR's decoder output at those mask tokens plus its diffusion position embedding); with bidirectional
attention every committed key changes when a token is added, so the "cache" becomes the committed
token set and the forward re-encodes it (``set_committed`` truncates the set). CSpD only consumes z per
drafted position and the head, so it carries over once the order (random in MAR) is fixed per sample:
the positions it feeds are taken from that order instead of raster order (CSpD paper, Appendix C:
with bidirectional attention each verified token "can be regarded as the last").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from ..diffusion import GaussianDiffusion, make_betas, respace, transition_log_density
from .base import CacheGeometry, KVCache, Layout
from .checkpoint import load_pretrained, save_pretrained
from .decoder import Float32Rope
from .llamagen import LabelEmbedder, LlamaGenConfig, RMSNorm, TransformerBlock, TransformerConfig, rope_2d_table


@dataclass
class ContinuousARConfig(TransformerConfig):
    """The LlamaGen transformer fields (``TransformerConfig``) plus: ``token_dim`` is C, the grid is
    ``height x width``; ``head_*`` shape the diffusion MLP; ``num_train_steps`` -> ``num_sampling_steps``
    is the respacing; ``clip_denoised`` clips the sampler's predicted x_0 to +-this (None: no clip, MAR)."""

    dim: int = 512
    n_layer: int = 8
    n_head: int = 8
    token_dim: int = 16
    height: int = 16
    width: int = 16
    head_width: int = 256
    head_depth: int = 3
    num_train_steps: int = 1000
    num_sampling_steps: int = 100
    noise_schedule: str = "cosine"
    learn_sigma: bool = True
    clip_denoised: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("token_dim", "height", "width", "head_width", "head_depth", "num_train_steps", "num_sampling_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ContinuousARConfig.{name} must be an integer >= 1, got {value!r}")
        if self.num_sampling_steps > self.num_train_steps:
            raise ValueError(f"ContinuousARConfig.num_sampling_steps must be <= num_train_steps "
                             f"({self.num_train_steps}), got {self.num_sampling_steps}")
        if self.noise_schedule not in ("cosine", "linear"):
            raise ValueError(f"ContinuousARConfig.noise_schedule must be 'cosine' or 'linear', got {self.noise_schedule!r}")
        if self.clip_denoised is not None and not self.clip_denoised > 0:
            raise ValueError(f"ContinuousARConfig.clip_denoised must be > 0 or None, got {self.clip_denoised!r}")

    @property
    def side(self) -> int:
        return max(self.height, self.width)

    def block_config(self) -> LlamaGenConfig:
        """The LlamaGen config that shapes the shared transformer blocks."""
        shared = {f.name: getattr(self, f.name) for f in fields(TransformerConfig)}
        return LlamaGenConfig(vocab_size=1, block_size=self.side ** 2, **shared)


# ---------------------------------------------------------------- diffusion head

class TimestepEmbedder(nn.Module):
    """Sinusoidal features of the (original) diffusion step, then a 2-layer MLP."""

    def __init__(self, width: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        args = t.float()[:, None] * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(self.mlp[0].weight.dtype))


class AdaLNBlock(nn.Module):
    """x + gate * MLP(LN(x) * (1 + scale) + shift), (shift, scale, gate) = Linear(SiLU(c))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.modulation(c).chunk(3, dim=-1)
        return x + gate * self.mlp(self.norm(x) * (1 + scale) + shift)


class DiffusionMLP(nn.Module):
    """MAR-style denoiser: (x_t (N, C), t (N,), z (N, D)) -> eps (N, C), or eps and v (N, 2C)."""

    def __init__(self, token_dim: int, cond_dim: int, width: int, depth: int, learn_sigma: bool) -> None:
        super().__init__()
        self.input_proj = nn.Linear(token_dim, width)
        self.time_embed = TimestepEmbedder(width)
        self.cond_embed = nn.Linear(cond_dim, width)
        self.blocks = nn.ModuleList(AdaLNBlock(width) for _ in range(depth))
        self.final_norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.final_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))
        self.output = nn.Linear(width, token_dim * (2 if learn_sigma else 1))

    def init_weights(self, zero_init: bool = True) -> None:
        """Xavier linears; with ``zero_init`` (MAR) the modulations and the output start at zero."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        for m in self.time_embed.mlp:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        if zero_init:
            for lin in [b.modulation[1] for b in self.blocks] + [self.final_modulation[1], self.output]:
                nn.init.zeros_(lin.weight)
                nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        c = self.time_embed(t) + self.cond_embed(z)
        h = self.input_proj(x)
        for block in self.blocks:
            h = block(h, c)
        shift, scale = self.final_modulation(c).chunk(2, dim=-1)
        return self.output(self.final_norm(h) * (1 + scale) + shift)


@dataclass
class Trajectory:
    """One reverse-diffusion run per row. ``states[:, 0]`` is x_K (pure noise), ``states[:, K]`` the
    token x_0; step k maps states[:, k] to states[:, k+1] = means[:, k] + exp(logvars[:, k] / 2) *
    temperature * noise[:, k]."""

    states: torch.Tensor  # (N, K+1, C)
    means: torch.Tensor  # (N, K, C)
    logvars: torch.Tensor  # (N, K, C), before the temperature
    noise: torch.Tensor  # (N, K, C) standard normal draws

    @property
    def x0(self) -> torch.Tensor:
        return self.states[:, -1]

    def step_log_densities(self, temperature: float) -> torch.Tensor:
        """(N, K): log p(x_{t-1} | x_t) of every step of the run (CSpD Eq. 2)."""
        return transition_log_density(self.states[:, 1:], self.means, self.logvars, temperature)


class DiffusionHead(nn.Module):
    """The per-token diffusion model p(x | z): a ``DiffusionMLP`` with a training schedule of T steps
    and a sampling schedule respaced to K steps."""

    def __init__(self, token_dim: int, cond_dim: int, width: int, depth: int, num_train_steps: int,
                 num_sampling_steps: int | str, noise_schedule: str = "cosine", learn_sigma: bool = True,
                 clip_denoised: float | None = None) -> None:
        super().__init__()
        self.token_dim = token_dim
        self.net = DiffusionMLP(token_dim, cond_dim, width, depth, learn_sigma)
        self.net.init_weights(zero_init=True)
        betas = make_betas(noise_schedule, num_train_steps)
        self.train_diffusion = GaussianDiffusion(betas, learn_sigma=learn_sigma)
        self.sampler = GaussianDiffusion(*respace(betas, num_sampling_steps), learn_sigma=learn_sigma,
                                         clip_x0=clip_denoised)

    @property
    def num_steps(self) -> int:
        return self.sampler.num_steps

    def loss(self, z: torch.Tensor, x0: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Per-token training loss (N,) of ``GaussianDiffusion.training_loss`` for tokens x0 (N, C) given z (N, D)."""
        return self.train_diffusion.training_loss(lambda x, t: self.net(x, t, z), x0, generator)

    def predict(self, x: torch.Tensor, step: torch.Tensor, z: torch.Tensor, z_uncond: torch.Tensor | None = None,
                cfg_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log variance (N, C) of the reverse step ``step`` (N,) (index into the respaced
        schedule, 0 = last) at x (N, C); with ``z_uncond``, CFG on epsilon in one batched call."""
        C, dtype = self.token_dim, self.net.output.weight.dtype  # the net may be half precision,
        t = self.sampler.timesteps[step]                          # the DDPM math stays float32
        if z_uncond is None:
            out = self.net(x.to(dtype), t, z.to(dtype)).float()
        else:
            both = self.net(torch.cat([x, x]).to(dtype), torch.cat([t, t]), torch.cat([z, z_uncond]).to(dtype)).float()
            cond, uncond = both.chunk(2)
            eps = uncond[:, :C] + cfg_scale * (cond[:, :C] - uncond[:, :C])
            out = torch.cat([eps, cond[:, C:]], dim=-1)
        return self.sampler.p_mean_logvar(out, x.float(), step)

    def sample_trajectory(self, z: torch.Tensor, z_uncond: torch.Tensor | None = None, cfg_scale: float = 1.0,
                          temperature: float = 1.0, generator: torch.Generator | None = None,
                          x_T: torch.Tensor | None = None, noise: torch.Tensor | None = None) -> Trajectory:
        """Run the K reverse steps for every row of z (N, D). ``x_T`` (N, C) and ``noise`` (N, K, C)
        default to fresh standard normal draws (zeros when temperature == 0, greedy); passing them in
        is how CSpD aligns a target run with a draft run (same eps_k at every step, CSpD Eq. 3)."""
        N, C, K, dev = z.shape[0], self.token_dim, self.num_steps, z.device
        greedy = temperature == 0
        if x_T is None:
            x_T = torch.zeros(N, C, device=dev) if greedy else torch.randn(N, C, device=dev, generator=generator)
        if noise is None:
            noise = torch.zeros(N, K, C, device=dev) if greedy else torch.randn(N, K, C, device=dev, generator=generator)
        x = x_T
        states, means, logvars = [x], [], []
        for k in range(K):
            step = torch.full((N,), K - 1 - k, dtype=torch.long, device=z.device)
            mean, logvar = self.predict(x, step, z, z_uncond, cfg_scale)
            x = mean + torch.exp(0.5 * logvar) * temperature * noise[:, k]
            states.append(x)
            means.append(mean)
            logvars.append(logvar)
        return Trajectory(torch.stack(states, 1), torch.stack(means, 1), torch.stack(logvars, 1), noise)

    def evaluate(self, states: torch.Tensor, z: torch.Tensor, z_uncond: torch.Tensor | None = None,
                 cfg_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Means and log variances (N, K, C) of this head's K steps along given states (N, K+1, C),
        all steps in ONE batched call (the path is known, so nothing is sequential)."""
        N, K1, C = states.shape
        K = K1 - 1
        x = states[:, :K].reshape(N * K, C)
        step = (K - 1 - torch.arange(K, device=states.device)).repeat(N)
        zz = z.repeat_interleave(K, 0)
        zu = None if z_uncond is None else z_uncond.repeat_interleave(K, 0)
        mean, logvar = self.predict(x, step, zz, zu, cfg_scale)
        return mean.reshape(N, K, C), logvar.reshape(N, K, C)

    def sample(self, z: torch.Tensor, z_uncond: torch.Tensor | None = None, cfg_scale: float = 1.0,
               temperature: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """Tokens x_0 (N, C) drawn from p(x | z)."""
        return self.sample_trajectory(z, z_uncond, cfg_scale, temperature, generator).x0


# ---------------------------------------------------------------- the model

class ContinuousAR(Float32Rope, nn.Module):
    """Class-conditional continuous-token AR model implementing the cached protocol of ``models/base.py``
    with z in place of logits (see the module docstring)."""

    def __init__(self, config: ContinuousARConfig) -> None:
        super().__init__()
        self.config = cfg = config
        bcfg = cfg.block_config()
        self.layout = Layout(cfg.height, cfg.width, 0)
        self.token_dim = cfg.token_dim
        self.null_condition = cfg.num_classes
        self.num_conditions = cfg.num_classes
        self.prefix_len = self.max_prefix = 1
        self.cls_embedding = LabelEmbedder(cfg.num_classes, cfg.dim, cfg.class_dropout_prob)
        self.tok_proj = nn.Linear(cfg.token_dim, cfg.dim)
        self.tok_dropout = nn.Dropout(cfg.token_dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(bcfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = DiffusionHead(cfg.token_dim, cfg.dim, cfg.head_width, cfg.head_depth, cfg.num_train_steps,
                                  cfg.num_sampling_steps, cfg.noise_schedule, cfg.learn_sigma, cfg.clip_denoised)
        side = cfg.side
        table = rope_2d_table(side, bcfg.head_dim, cfg.rope_base, self.prefix_len)
        g = torch.arange(cfg.height * cfg.width)
        rows = torch.cat([torch.arange(self.prefix_len), self.prefix_len + (g // cfg.width) * side + g % cfg.width])
        self.register_buffer("rope", table[rows], persistent=False)
        self.cache: KVCache | None = None
        for module in (self.cls_embedding, self.tok_proj, self.layers):
            module.apply(self._init_weights)

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.config.initializer_range)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    @property
    def hidden_size(self) -> int:
        return self.config.dim

    # ---- teacher-forced (training, reference sampling) ----
    def _blocks(self, x: torch.Tensor, rope: torch.Tensor, mask: torch.Tensor | None, cache: KVCache | None = None,
                slots: torch.Tensor | None = None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, mask, cache, i, slots)
        return self.norm(x)

    def features(self, conditions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """z (B, t+1, D) after the condition and each of the t given tokens (B, t, C), causal, no cache."""
        x = torch.cat([self.cls_embedding(conditions)[:, None], self.tok_proj(tokens.to(self.tok_proj.weight.dtype))], dim=1)
        x = self.tok_dropout(x)
        rope = self.rope[: x.shape[1]][None].expand(x.shape[0], -1, -1, -1)
        return self._blocks(x, rope, None)

    def loss(self, conditions: torch.Tensor, tokens: torch.Tensor, batch_mul: int = 1,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean diffusion loss of whole grids tokens (B, L, C): z_i from [class, x_<i] teacher-forced,
        then the head's loss on x_i, each token repeated ``batch_mul`` times with its own step and noise
        (MAR's diffusion_batch_mul). In training mode the class is replaced by the null class with
        probability ``class_dropout_prob`` (CFG training)."""
        if self.training and self.config.class_dropout_prob > 0:
            drop = torch.rand(conditions.shape, device=conditions.device, generator=generator) < self.config.class_dropout_prob
            conditions = torch.where(drop, torch.full_like(conditions, self.null_condition), conditions)
        z = self.features(conditions, tokens[:, :-1])
        z = z.reshape(-1, z.shape[-1]).repeat(batch_mul, 1)
        x0 = tokens.reshape(-1, tokens.shape[-1]).repeat(batch_mul, 1)
        return self.head.loss(z, x0, generator).mean()

    # ---- cached decoding (CachedTokenModel, z in place of logits) ----
    def cache_geometry(self, rows: int, prefix: int, extra: int) -> CacheGeometry:
        """The cache ``setup_cache(rows, extra)`` allocates (the class prefix is fixed: ``prefix`` unused)."""
        cfg = self.config
        return CacheGeometry(cfg.n_layer, rows, cfg.n_kv_head, self.prefix_len + self.layout.num_tokens + extra,
                             cfg.dim // cfg.n_head)

    def setup_cache(self, rows: int, extra: int) -> None:
        p = next(self.parameters())
        self.cache = self.cache_geometry(rows, self.prefix_len, extra).allocate(p.dtype, p.device)

    def _run_cached(self, x: torch.Tensor, rope: torch.Tensor, tree_mask: torch.Tensor | None) -> torch.Tensor:
        cache = self.cache
        if cache is None:
            raise RuntimeError("call setup_cache(rows, extra) before cached decoding")
        n = x.shape[1]
        live = cache.live(n)  # attend over the live prefix of the cache only (models/base.py)
        return self._blocks(x, rope, cache.attention_mask(n, tree_mask, live), cache, cache.block_slots(n))

    @torch.no_grad()
    def prefill(self, conditions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the class token of every row; returns (z, z) (rows, D) for image token 0."""
        if self.cache is None:
            raise RuntimeError("call setup_cache(rows, extra) before cached decoding")
        self.cache.length.zero_()
        x = self.cls_embedding(conditions)[:, None]
        z = self._run_cached(x, self.rope[: self.prefix_len][None].expand(x.shape[0], -1, -1, -1), None)
        self.cache.length.fill_(self.prefix_len)
        return z[:, -1], z[:, -1]

    @torch.no_grad()
    def forward_tokens(self, tokens: torch.Tensor, positions: torch.Tensor,
                       tree_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed tokens (rows, n, C) at grid indices ``positions`` (rows, n); returns (z, z) (rows, n, D),
        z[:, j] conditioning the token after fed token j (see ``CachedTokenModel.forward_tokens``)."""
        pos = positions.clamp(0, self.layout.num_tokens - 1) + self.prefix_len
        z = self._run_cached(self.tok_proj(tokens.to(self.tok_proj.weight.dtype)), self.rope[pos], tree_mask)
        return z, z

    def set_committed(self, n_fed: torch.Tensor) -> None:
        self.cache.length.copy_(n_fed + self.prefix_len)  # in place (captured rounds)

    def keep_block(self, index: torch.Tensor, count: torch.Tensor) -> None:
        self.cache.keep_block(index, count)

    # ---- files ----
    def config_dict(self) -> dict:
        return asdict(self.config)

    @classmethod
    def from_config_dict(cls, d: dict) -> ContinuousAR:
        names = {f.name for f in fields(ContinuousARConfig)}
        return cls(ContinuousARConfig(**{k: v for k, v in d.items() if k in names}))

    def save_pretrained(self, directory: str | Path, dtype: torch.dtype | None = None) -> None:
        """``config.json`` + ``model.safetensors``."""
        save_pretrained(self, self.config_dict(), directory, dtype)

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> ContinuousAR:
        """A ``save_pretrained`` directory, streamed into ``dtype`` on ``device`` (``models.loading``)."""
        return load_pretrained(cls.from_config_dict, directory, dtype=dtype, device=device)
