"""DDPM math for continuous-token diffusion heads (Ho et al. 2020; Nichol & Dhariwal 2021, "iDDPM"),
in the form MAR's DiffLoss uses it, plus the pieces CSpD needs on top.

- Noise schedules: cosine (iDDPM Eq. 17) and linear (DDPM); ``space_timesteps`` picks the kept
  training steps by the official rule (a step count, per-section counts "a,b,c" or "ddimN") and
  ``respace`` recomputes the betas from the kept alphas_cumprod (iDDPM Sec. 4).
- ``GaussianDiffusion.p_mean_logvar``: epsilon prediction -> posterior mean (DDPM Eq. 7/11); the
  variance is either fixed (beta_tilde) or learned as an interpolation v in log space between beta_t
  and beta_tilde_t (iDDPM Eq. 15), v mapped to f = (v + 1) / 2 with no clamp (LTH14/mar
  ``diffusion/gaussian_diffusion.py`` lines 285-292: an output |v| > 1 extrapolates past beta_t or
  beta_tilde_t); optionally the predicted x_0 is clipped to [-clip_x0, clip_x0] (iDDPM/ADM
  ``clip_denoised``: at the noisiest step x0_hat is eps's error times sqrt(1/abar_T) ~ 1e4, which a
  not fully trained net turns into huge means).
- ``GaussianDiffusion.training_loss``: MSE on epsilon (DDPM Eq. 14) + the VLB term for the learned
  variance with a frozen mean (iDDPM L_hybrid, Sec. 3.1).
- ``gaussian_log_density``: log N(x; mu, diag(exp(logvar))) for the transitions p(x_{t-1} | x_t)
  (CSpD Eq. 2/13) whose products give the trajectory densities of CSpD Eq. 1/12.
- ``residual_sample``: acceptance-rejection sampling of normalise(max(0, p - q)) with proposals from
  p and acceptance alpha_s = max(0, p - q) / p (CSpD Eq. 7-11, M = 1/Z), with a bounded number of tries.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .sampling import uniform

LOG_2PI = math.log(2 * math.pi)


def cosine_betas(num_steps: int, s: float = 0.008, max_beta: float = 0.999) -> torch.Tensor:
    """beta_t = 1 - abar(t+1) / abar(t), abar(t) = cos^2(((t/T) + s) / (1 + s) * pi/2) (iDDPM Eq. 17)."""
    t = torch.arange(num_steps + 1, dtype=torch.float64) / num_steps
    abar = torch.cos((t + s) / (1 + s) * math.pi / 2) ** 2
    return (1 - abar[1:] / abar[:-1]).clamp(max=max_beta)


def linear_betas(num_steps: int) -> torch.Tensor:
    """DDPM's linear schedule 1e-4 .. 0.02, scaled to ``num_steps``."""
    scale = 1000 / num_steps
    return torch.linspace(scale * 1e-4, scale * 0.02, num_steps, dtype=torch.float64)


def make_betas(schedule: str, num_steps: int) -> torch.Tensor:
    if schedule == "cosine":
        return cosine_betas(num_steps)
    if schedule == "linear":
        return linear_betas(num_steps)
    raise ValueError(f"noise_schedule must be 'cosine' or 'linear', got {schedule!r}")


StepSpec = int | str


def space_timesteps(num_train_steps: int, spec: StepSpec, field: str = "num_sampling_steps") -> list[int]:
    """The training steps (ascending) that a sampler respaced by ``spec`` keeps out of T = ``num_train_steps``.

    The rule of the official ``space_timesteps`` (iDDPM, as LTH14/mar ``diffusion/respace.py`` lines
    12-63 has it), so that a checkpoint's ``num_sampling_steps`` keeps the same steps here:

    - ``K`` (int or digit string) is the one-section list ``[K]``.
    - ``"c_1,c_2,...,c_n"``: T is cut into n consecutive sections, the first T mod n of them one step
      longer (sizes T // n or T // n + 1); section i of S steps keeps c_i <= S of them: its start plus
      round(x_j), x_0 = 0 and x_{j+1} = x_j + (S - 1) / (c_i - 1) accumulated in float64 (stride 1 when
      c_i <= 1), ``round`` rounding halves to even. Accumulating the stride is not linspace: for 282 of
      the 1,000 counts at T = 1000 (K = 21, 23, 27, ...) a kept step differs by one.
    - ``"ddimN"``: range(0, T, s) for the smallest integer stride s in 1 .. T - 1 giving exactly N steps
      (DDIM's striding); no such s is an error.

    Errors are one-line ValueErrors naming ``field`` and the allowed forms.
    """
    forms = (f"a step count in 1..{num_train_steps} (num_train_steps), comma-separated per-section counts "
             "like '10,15,20', or 'ddimN'")
    if isinstance(spec, bool) or not isinstance(spec, (int, str)):
        raise ValueError(f"{field} must be {forms}, got {spec!r}")
    text = str(spec).strip()
    if text.startswith("ddim"):
        if not re.fullmatch(r"[0-9]+", text[4:]):
            raise ValueError(f"{field} must be {forms}, got {spec!r}")
        for stride in range(1, num_train_steps):
            if len(range(0, num_train_steps, stride)) == int(text[4:]):
                return list(range(0, num_train_steps, stride))
        raise ValueError(f"{field} {spec!r}: no integer stride gives exactly {int(text[4:])} of {num_train_steps} "
                         "steps (DDIM striding: range(0, T, s))")
    parts = [p.strip() for p in text.split(",")]
    if not all(re.fullmatch(r"[0-9]+", p) for p in parts):
        raise ValueError(f"{field} must be {forms}, got {spec!r}")
    counts = [int(p) for p in parts]
    if len(counts) == 1 and not 1 <= counts[0] <= num_train_steps:
        raise ValueError(f"{field} must be {forms}, got {spec!r}")
    base, longer = divmod(num_train_steps, len(counts))
    kept, start = [], 0
    for i, count in enumerate(counts):
        size = base + (1 if i < longer else 0)
        if count > size:
            raise ValueError(f"{field} {spec!r}: section {i} has {size} of the {num_train_steps} training steps, "
                             f"cannot keep {count}")
        stride = (size - 1) / (count - 1) if count > 1 else 1.0
        x = 0.0
        for _ in range(count):
            kept.append(start + round(x))
            x += stride
        start += size
    if not kept:
        raise ValueError(f"{field} {spec!r} keeps no step: it must be {forms}")
    return sorted(set(kept))


def respace(betas: torch.Tensor, num_steps: StepSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the steps ``space_timesteps(T, num_steps)`` of the T in ``betas``.

    Returns (new betas (K,), kept original step indices (K,)): alphas_cumprod of the respaced process
    equals the original one at the kept steps (iDDPM Sec. 4), so a network trained on T steps is
    queried at the original step index of each kept step.
    """
    kept = torch.tensor(space_timesteps(betas.shape[0], num_steps), dtype=torch.long)
    abar = torch.cumprod(1 - betas, 0)[kept]
    prev = torch.cat([abar.new_ones(1), abar[:-1]])
    return 1 - abar / prev, kept


def gaussian_log_density(x: torch.Tensor, mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, diag(exp(logvar))) summed over the last dimension (CSpD Eq. 2/14)."""
    return -0.5 * (LOG_2PI + logvar + (x - mean) ** 2 * torch.exp(-logvar)).sum(-1)


def transition_log_density(x: torch.Tensor, mean: torch.Tensor, logvar: torch.Tensor, temperature: float) -> torch.Tensor:
    """log N(x; mean, exp(logvar) * temperature^2): a reverse step whose noise is scaled by the temperature (MAR)."""
    return gaussian_log_density(x, mean, logvar + 2 * math.log(temperature))


def normal_kl(mean1: torch.Tensor, logvar1: torch.Tensor, mean2: torch.Tensor, logvar2: torch.Tensor) -> torch.Tensor:
    """KL(N(mean1, e^logvar1) || N(mean2, e^logvar2)) elementwise (nats)."""
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


class GaussianDiffusion(nn.Module):
    """The reverse process of one (possibly respaced) schedule; tensors are buffers so ``.to`` moves them.

    Step index i runs 0..K-1 (i = 0 is the last denoising step, producing x_0); ``timesteps[i]`` is the
    original training step the network is queried at.
    """

    def __init__(self, betas: torch.Tensor, timesteps: torch.Tensor | None = None, learn_sigma: bool = True,
                 clip_x0: float | None = None) -> None:
        super().__init__()
        self.clip_x0 = clip_x0
        betas = betas.double()
        K = betas.shape[0]
        self.num_steps = K
        self.learn_sigma = learn_sigma
        abar = torch.cumprod(1 - betas, 0)
        abar_prev = torch.cat([abar.new_ones(1), abar[:-1]])
        post_var = betas * (1 - abar_prev) / (1 - abar)
        # beta_tilde_0 = 0: clip the log with beta_tilde_1 (iDDPM); a one-step process falls back to beta_0
        post_log = torch.log(torch.cat([post_var[1:2], post_var[1:]]) if K > 1 else betas)
        table = {
            "betas": betas,
            "alphas_cumprod": abar,
            "sqrt_alphas_cumprod": abar.sqrt(),
            "sqrt_one_minus_alphas_cumprod": (1 - abar).sqrt(),
            "sqrt_recip_alphas_cumprod": (1 / abar).sqrt(),
            "sqrt_recipm1_alphas_cumprod": (1 / abar - 1).sqrt(),
            "log_betas": torch.log(betas),
            "posterior_log_variance": post_log,
            "posterior_mean_coef1": betas * abar_prev.sqrt() / (1 - abar),
            "posterior_mean_coef2": (1 - abar_prev) * (1 - betas).sqrt() / (1 - abar),
        }
        self._schedule = table  # float64 masters: the buffers stay float32 when the model is cast
        for name, value in table.items():
            self.register_buffer(name, value.float(), persistent=False)
        ts = torch.arange(K) if timesteps is None else timesteps.long()
        self.register_buffer("timesteps", ts, persistent=False)

    def _apply(self, fn, recurse: bool = True):
        """Follow device moves, but keep the schedule in float32 under ``.half()``/``.to(bfloat16)``."""
        super()._apply(fn, recurse)
        for name, value in self._schedule.items():
            setattr(self, name, value.to(device=self.timesteps.device, dtype=torch.float32))
        return self

    @staticmethod
    def _at(table: torch.Tensor, i: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return table[i].reshape(-1, *([1] * (like.ndim - 1))).to(like.dtype)

    def q_sample(self, x0: torch.Tensor, i: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps (DDPM Eq. 4)."""
        return self._at(self.sqrt_alphas_cumprod, i, x0) * x0 + self._at(self.sqrt_one_minus_alphas_cumprod, i, x0) * noise

    def q_posterior(self, x0: torch.Tensor, x_t: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log variance of q(x_{t-1} | x_t, x_0) (DDPM Eq. 6-7)."""
        mean = self._at(self.posterior_mean_coef1, i, x_t) * x0 + self._at(self.posterior_mean_coef2, i, x_t) * x_t
        return mean, self._at(self.posterior_log_variance, i, x_t).expand_as(x_t)

    def p_mean_logvar(self, out: torch.Tensor, x_t: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Network output (N, C or 2C) at step i (N,) -> mean and log variance of p(x_{t-1} | x_t).

        eps -> x0_hat = sqrt(1/abar) x_t - sqrt(1/abar - 1) eps -> posterior mean (DDPM Eq. 11);
        learned variance: log var = f log beta_t + (1 - f) log beta_tilde_t, f = (v + 1) / 2 (iDDPM Eq. 15),
        v unclamped as in the official code (|v| > 1 extrapolates).
        """
        C = x_t.shape[-1]
        eps = out[..., :C]
        if self.learn_sigma:
            frac = (out[..., C:] + 1) / 2  # no clamp: official LEARNED_RANGE
            logvar = frac * self._at(self.log_betas, i, x_t) + (1 - frac) * self._at(self.posterior_log_variance, i, x_t)
        else:
            logvar = self._at(self.posterior_log_variance, i, x_t).expand_as(x_t)
        x0 = self._at(self.sqrt_recip_alphas_cumprod, i, x_t) * x_t - self._at(self.sqrt_recipm1_alphas_cumprod, i, x_t) * eps
        if self.clip_x0 is not None:
            x0 = x0.clamp(-self.clip_x0, self.clip_x0)
        mean = self._at(self.posterior_mean_coef1, i, x_t) * x0 + self._at(self.posterior_mean_coef2, i, x_t) * x_t
        return mean, logvar

    def training_loss(self, net: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x0: torch.Tensor,
                      generator: torch.Generator | None = None) -> torch.Tensor:
        """Per-sample loss (N,): MSE on epsilon at a uniform random step (DDPM Eq. 14), plus, for a
        learned variance, the VLB term in bits with the mean frozen (iDDPM L_hybrid): KL(q || p) for
        t > 0 and -log p(x_0 | x_1) (continuous Gaussian; MAR's pixel-bin likelihood does not fit latents)."""
        N, C = x0.shape
        i = torch.randint(0, self.num_steps, (N,), device=x0.device, generator=generator)
        noise = torch.randn(x0.shape, device=x0.device, dtype=x0.dtype, generator=generator)
        x_t = self.q_sample(x0, i, noise)
        out = net(x_t, self.timesteps[i])
        loss = ((out[:, :C] - noise) ** 2).mean(-1)
        if self.learn_sigma:
            frozen = torch.cat([out[:, :C].detach(), out[:, C:]], dim=-1)
            mean, logvar = self.p_mean_logvar(frozen, x_t, i)
            true_mean, true_logvar = self.q_posterior(x0, x_t, i)
            kl = normal_kl(true_mean, true_logvar, mean, logvar).mean(-1)
            nll = -gaussian_log_density(x0, mean, logvar) / C
            loss = loss + torch.where(i == 0, nll, kl) / math.log(2.0)
        return loss


@dataclass
class ResidualDraw:
    """Result of ``residual_sample``: the samples (N, ...), tries used per row (N,) and the rows that
    fell back to their last proposal (N,) bool."""

    samples: torch.Tensor
    tries: torch.Tensor
    fallback: torch.Tensor


def residual_sample(propose: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                    log_q: Callable[[torch.Tensor], torch.Tensor], pending: torch.Tensor, max_tries: int,
                    generator: torch.Generator | None = None) -> ResidualDraw:
    """Draw from p'(x) = max(0, p(x) - q(x)) / Z (CSpD Eq. 6) by acceptance-rejection (Eq. 7-11).

    ``propose()`` returns a fresh x ~ p for every row, with log p(x) (N,); ``log_q(x)`` gives log q(x).
    With M = 1/Z (Eq. 9) the acceptance probability is alpha_s = max(0, p - q) / p = max(0, 1 - q/p)
    (Eq. 10), computed in log space; Z never appears. A try succeeds with probability Z = TV(p, q), so
    tries are geometric with mean 1/Z. Rows with ``pending`` False keep their first proposal (a plain
    draw from p: the bonus token of a fully accepted chain). The loop stops when every pending row
    accepted (one host sync per try).

    Fallback: a row still pending after ``max_tries`` takes its last proposal, a draw from p. Its law
    is then (1 - (1 - Z)^K) p' + (1 - Z)^K p; weighted by the probability Z of reaching the residual at
    all, the token's law is off by at most Z (1 - Z)^K <= 1 / (K + 1) in total variation (about
    1 / (e (K + 1)) for large K). ``ResidualDraw.fallback`` marks these rows.
    """
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    done = ~pending
    tries = torch.zeros_like(pending, dtype=torch.long)
    out = last = None
    for _ in range(max_tries):
        x, log_p = propose()
        alpha = (-torch.expm1(log_q(x) - log_p)).clamp(0.0, 1.0)
        u = uniform(alpha.shape, alpha, generator)  # float64: no acceptance floor (sampling.uniform)
        take = ~done & (u < alpha)
        if out is None:
            out = x.clone()
        keep = take.reshape(-1, *([1] * (x.ndim - 1)))
        out = torch.where(keep, x, out)
        tries += (~done).long()
        done = done | take
        last = x
        if bool(done.all()):
            break
    fallback = ~done
    out = torch.where(fallback.reshape(-1, *([1] * (out.ndim - 1))), last, out)
    return ResidualDraw(out, tries, fallback)
