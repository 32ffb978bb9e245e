"""Continuous speculative decoding, CSpD (Wang et al. 2024), for ``ContinuousAR`` models: batched,
with a committed length and a cache rollback per row.

One round (Algorithm 1): the draft samples gamma tokens autoregressively and records each token's
whole denoising run (x_K .. x_0, means, variances, noises); the target scores all of them in ONE
transformer forward (its z for every drafted position plus the bonus one) and runs its diffusion head
for all drafted positions at once; per token a log acceptance ratio; tokens are accepted left to right
while u_j < ratio_j and the row STOPS at its first rejection (the official code accepts tokens
independently and keeps tokens that were drawn after, and conditioned on, a rejected one: not here).
At the first rejection the token is resampled from the target by acceptance-rejection (Eq. 10-11,
``diffusion.residual_sample``); a fully accepted chain gets a bonus token from the target.

Ratios (``ratio``):
- ``"paper"`` (Eq. 5): with ``align`` the target re-runs its own denoising from the draft's x_K with
  the draft's noise eps_k at every step (Eq. 3) down to x_1^p, and
  ratio = Sigma * p(x_0 | x_1^p) / q(x_0 | x_1^q), log Sigma = sum_{t>=2} 1/2 log(|Sigma_q,t| / |Sigma_p,t|)
  (Eq. 4). Without ``align`` the target runs on its own noise and the factors of Eq. 1 are evaluated on
  each model's own path. Residual (Eq. 11): proposals x ~ p(. | x_1^p), alpha_s = max(0, 1 - q(x | x_1^q)
  / (Sigma p(x | x_1^p))). Not exact (``lossless`` False): conditionally on the shared noise the
  draft's token has density q(. | x_1^q) and the target's p(. | x_1^p), and speculative sampling
  between those two needs ratio p/q; the factor Sigma tilts it (Sigma -> infinity accepts every draft
  token; Sigma << 1 starves the residual sampler). Measured on a tiny model in tests/test_cspd.py.
- ``"coupled"`` (exact): Eq. 5 with Sigma := 1, i.e. the paper's alignment read as a coupling. Given
  the draft's x_K and step noises (and, without ``align``, the target's own), the draft token is a draw
  from q(. | x_1^q) and the target's token would be a draw from p(. | x_1^p); exact speculative sampling
  between these two last-step Gaussians gives a draw from p(. | x_1^p) for every value of the noise,
  and since the target's own sampler draws that noise from the same N(0, I), the token follows the
  target's law. Same cost as "paper"; with fixed (not learned) variances the two coincide.
- ``"trajectory"`` (exact): the sampled object is the whole run x_K..x_0, whose density under either
  model is N(x_K; 0, I) prod_k N(x_{k-1}; mu(x_k), sigma_k^2 tau^2) (Eq. 1/12). The ratio of the
  target's and the draft's densities along the draft's own run is an exact density ratio (x_K cancels;
  the target evaluates all K steps in one batched head call, since the path is known), and the residual
  is acceptance-rejection on target runs with alpha = max(0, 1 - q_traj / p_traj) (the draft scored
  along the target's run). This is speculative sampling on trajectory space: the run, hence its x_0,
  follows the target's law exactly, up to the residual fallback below. Alignment is built in (the
  target is scored on the draft's path), so ``align=False`` is refused. Its residual proposals are
  whole target runs (K sequential head calls per try), "coupled" needs only last-step draws.

Pre-fill: the first ceil(prefill * L) tokens, at least 1 (token 0 comes from the condition pass), are
sampled by the target alone; ``prefill=1`` is plain target-only AR decoding (no draft needed).
Greedy (temperature 0): every run is deterministic (x_K = 0, no step noise); a draft token is accepted
iff it equals the target's own output within ``GREEDY_ATOL`` (relative and absolute), the first
mismatch is replaced by the target's output: the result is the target's greedy output.
Residual fallback: a row still rejecting after ``max_resample_tries`` proposals takes the last target
proposal (total-variation error on that token <= 1 / (max_resample_tries + 1), see
``residual_sample``); counted in ``ctx.extra["resample_fallbacks"]``.

Outputs: the method sets ``ctx.latents`` (B, L, C) float, the continuous tokens (``ctx.tokens`` stays
zeros) and ``ctx.extra``: ``acceptance_rate`` (accepted / (accepted + rejected) draft tokens inside the
grid: the paper's alpha), ``resamples``, ``resample_tries`` (mean tries per resample),
``resample_fallbacks``, ``prefill_tokens``, ``draft_forwards``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..diffusion import ResidualDraw, gaussian_log_density, residual_sample, transition_log_density
from ..models.continuous import DiffusionHead, Trajectory
from ..sampling import Sampling, uniform
from .base import DecodeContext, GuidedModel

RATIOS = ("paper", "coupled", "trajectory")
GREEDY_ATOL = 1e-4


class GuidedContinuous:
    """The continuous counterpart of ``GuidedModel``: a ``ContinuousAR`` bound to B samples and a
    ``Sampling``. Both CFG halves run as one batch of 2B rows; forwards return z for the conditional
    and the unconditional rows (None without CFG); the head applies CFG on epsilon. Built on the
    discrete view so the cache set-up, the condition rows and the forward counter are shared."""

    def __init__(self, view: GuidedModel) -> None:
        head = getattr(view.model, "head", None)
        if not isinstance(head, DiffusionHead):
            raise ValueError("method cspd needs continuous-token models (specvis.models.ContinuousAR) as target and draft")
        s: Sampling = view.sampling
        self.view, self.model, self.head = view, view.model, head
        self.cfg, self.scale, self.temperature = view.cfg, s.cfg_scale, s.temperature

    @property
    def forwards(self) -> int:
        return self.view.forwards

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t]) if self.cfg else t

    def _split(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        z = z.float()
        if self.cfg:
            cond, uncond = z.chunk(2)
            return cond, uncond
        return z, None

    def prefill(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """z (B, D) for image token 0, conditional and unconditional."""
        t0 = time.perf_counter()
        z, _ = self.model.prefill(self.view.conditions)
        self.view.count(1)
        self.view.seconds += time.perf_counter() - t0
        return self._split(z)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """z (B, n, D) after each fed token (B, n, C) at grid indices ``positions`` (B, n)."""
        t0 = time.perf_counter()
        z, _ = self.model.forward_tokens(self._rows(tokens), self._rows(positions))
        self.view.count(tokens.shape[1])
        self.view.seconds += time.perf_counter() - t0
        return self._split(z)

    def set_committed(self, n_fed: torch.Tensor) -> None:
        self.view.set_committed(n_fed)

    def sample(self, z: torch.Tensor, z_uncond: torch.Tensor | None, generator: torch.Generator,
               x_T: torch.Tensor | None = None, noise: torch.Tensor | None = None) -> Trajectory:
        return self.head.sample_trajectory(z, z_uncond, self.scale, self.temperature, generator, x_T, noise)

    def path_log_density(self, states: torch.Tensor, z: torch.Tensor, z_uncond: torch.Tensor | None) -> torch.Tensor:
        """log prod_k p(x_{k-1} | x_k) (N,) of given runs (N, K+1, C) under this head (x_K factor excluded)."""
        means, logvars = self.head.evaluate(states, z, z_uncond, self.scale)
        return transition_log_density(states[:, 1:], means, logvars, self.temperature).sum(-1)


def _stack(runs: list[Trajectory]) -> Trajectory:
    """gamma runs of B rows -> one Trajectory of B * gamma rows, row-major (sample, position)."""
    def cat(name: str) -> torch.Tensor:
        t = torch.stack([getattr(r, name) for r in runs], 1)
        return t.reshape(-1, *t.shape[2:])
    return Trajectory(cat("states"), cat("means"), cat("logvars"), cat("noise"))


def _pick(t: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    """t (B, m, ...) -> t[b, index[b]] (B, ...)."""
    if t is None:
        return None
    idx = index.reshape(-1, 1, *([1] * (t.ndim - 2))).expand(-1, 1, *t.shape[2:])
    return t.gather(1, idx).squeeze(1)


def paper_residual(tau: float, at: dict, pending: torch.Tensor, max_tries: int,
                   gen: torch.Generator | None) -> ResidualDraw:
    """Eq. 11 per row: proposals x ~ p(. | x_1^p) (the target's last step, ``at["mean_p"]``,
    ``at["logvar_p"]``), accepted with max(0, 1 - q(x | x_1^q) / (Sigma p(x | x_1^p))); ``at`` holds
    (N, ...) rows of what ``CSpD._paper_log_ratio`` returns as aux. Rows with ``pending`` False keep
    their first proposal. Shared by CSpD on ContinuousAR and on MAR (``cspd_mar``)."""
    def propose() -> tuple[torch.Tensor, torch.Tensor]:
        x = at["mean_p"] + torch.exp(0.5 * at["logvar_p"]) * tau * torch.randn(
            at["mean_p"].shape, device=at["mean_p"].device, generator=gen)
        return x, at["log_sigma"] + transition_log_density(x, at["mean_p"], at["logvar_p"], tau)

    def log_q(x: torch.Tensor) -> torch.Tensor:
        return transition_log_density(x, at["mean_q"], at["logvar_q"], tau)

    return residual_sample(propose, log_q, pending, max_tries, gen)


def trajectory_residual(target, draft, z_p: torch.Tensor, zu_p: torch.Tensor | None, z_q: torch.Tensor,
                        zu_q: torch.Tensor | None, pending: torch.Tensor, max_tries: int,
                        gen: torch.Generator | None) -> ResidualDraw:
    """The residual on trajectory space per row: whole target runs (z_p) accepted with
    max(0, 1 - q_traj / p_traj), the draft (z_q) scored along them; returns the runs' states (N, K+1, C).
    ``target``/``draft`` are head views with ``sample``, ``path_log_density`` and ``temperature``."""
    def propose() -> tuple[torch.Tensor, torch.Tensor]:
        run = target.sample(z_p, zu_p, gen)
        return run.states, run.step_log_densities(target.temperature).sum(-1)

    def log_q(states: torch.Tensor) -> torch.Tensor:
        return draft.path_log_density(states, z_q, zu_q)

    return residual_sample(propose, log_q, pending, max_tries, gen)


def commit_latents(ctx: DecodeContext, latents: torch.Tensor, block: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``ctx.commit`` for continuous tokens: block (B, m, C) goes to the float buffer ``latents``
    (B, L + pad, C) at each row's committed length; ``ctx.tokens`` gets zeros. Returns the counts."""
    B, m, C = block.shape
    start = ctx.n.clone()
    done = ctx.commit(torch.zeros(B, m, dtype=torch.long, device=block.device), count)
    j = torch.arange(m, device=block.device)
    idx = (start[:, None] + j).clamp_max(latents.shape[1] - 1)[..., None].expand(-1, -1, C)
    write = (j[None, :] < done[:, None])[..., None]
    latents.scatter_(1, idx, torch.where(write, block, latents.gather(1, idx)))
    return done


@dataclass
class CSpDStats:
    """What a CSpD decode reports (``Stats.extra``): ``acceptance_rate`` (accepted / (accepted + rejected)
    draft tokens inside the grid: the paper's alpha), ``resamples``, ``resample_tries`` (mean tries per
    resample), ``resample_fallbacks`` and ``prefill_tokens``."""

    acceptance_rate: float
    resamples: float
    resample_tries: float
    resample_fallbacks: float
    prefill_tokens: float


@dataclass(frozen=True)
class CSpD:
    """Continuous speculative decoding: gamma draft tokens per target forward (see the module docstring)."""

    gamma: int = 8
    prefill: float = 0.05
    align: bool = True
    ratio: str = "paper"  # "paper" (Eq. 5), "coupled" (exact, Eq. 5 without Sigma), "trajectory" (exact)
    max_resample_tries: int = 100
    name = "cspd"
    acceptance = None

    def __post_init__(self) -> None:
        if not isinstance(self.gamma, int) or isinstance(self.gamma, bool) or self.gamma < 1:
            raise ValueError(f"CSpD.gamma must be an integer >= 1, got {self.gamma!r}")
        if isinstance(self.prefill, bool) or not isinstance(self.prefill, (int, float)) or not 0.0 <= self.prefill <= 1.0:
            raise ValueError(f"CSpD.prefill must be a fraction in [0, 1], got {self.prefill!r}")
        if not isinstance(self.align, bool):
            raise ValueError(f"CSpD.align must be True or False, got {self.align!r}")
        if self.ratio not in RATIOS:
            raise ValueError(f"CSpD.ratio must be one of {', '.join(RATIOS)}, got {self.ratio!r}")
        if self.ratio == "trajectory" and not self.align:
            raise ValueError("CSpD.align=False has no meaning with ratio='trajectory' (the target is always scored on the draft's own path)")
        if not isinstance(self.max_resample_tries, int) or isinstance(self.max_resample_tries, bool) or self.max_resample_tries < 1:
            raise ValueError(f"CSpD.max_resample_tries must be an integer >= 1, got {self.max_resample_tries!r}")

    @property
    def lossless(self) -> bool:
        return self.ratio != "paper"

    @property
    def pad(self) -> int:
        return self.gamma + 2

    def prefill_tokens(self, L: int) -> int:
        """Tokens sampled by the target alone: ceil(prefill * L), at least 1, at most L."""
        return min(L, max(1, math.ceil(self.prefill * L - 1e-9)))

    # ------------------------------------------------------------------ the loop
    def decode(self, ctx: DecodeContext) -> None:
        s = ctx.target.sampling
        if s.top_k is not None or s.top_p is not None:
            raise ValueError("method cspd samples continuous tokens: top_k and top_p do not apply (leave them None)")
        target = GuidedContinuous(ctx.target)
        gen, L, dev = ctx.generator, ctx.L, ctx.device
        B, C = ctx.n.shape[0], target.head.token_dim
        lat = torch.zeros(B, ctx.tokens.shape[1], C, device=dev)
        ones = torch.ones_like(ctx.n)
        n_pre = self.prefill_tokens(L)

        zc, zu = target.prefill()
        x = target.sample(zc, zu, gen).x0
        commit_latents(ctx, lat, x[:, None], ones)
        for _ in range(n_pre - 1):  # target-only tokens: every row advances by one, no sync
            zc, zu = target.forward(x[:, None], (ctx.n - 1)[:, None])
            target.set_committed(ctx.n)
            x = target.sample(zc[:, 0], None if zu is None else zu[:, 0], gen).x0
            commit_latents(ctx, lat, x[:, None], ones)

        tally = torch.zeros(4, dtype=torch.long, device=dev)  # accepted, rejected, tries, fallbacks
        if not ctx.done():
            if ctx.draft is None:
                raise ValueError("method cspd needs a draft model (draft=...) unless prefill=1")
            draft = GuidedContinuous(ctx.draft)
            if draft.head.token_dim != C:
                raise ValueError(f"draft token_dim {draft.head.token_dim} != target token_dim {C}")
            draft.prefill()
            first = True
            while not ctx.done():
                tally += self._round(ctx, target, draft, lat, n_pre if first else 2)
                first = False
        ctx.latents = lat[:, :L].clone()
        acc, rej, tries, fallbacks = tally.tolist()
        ctx.record(CSpDStats(acceptance_rate=acc / max(acc + rej, 1), resamples=float(rej),
                             resample_tries=tries / max(rej, 1), resample_fallbacks=float(fallbacks),
                             prefill_tokens=float(n_pre)))

    def _round(self, ctx: DecodeContext, target: GuidedContinuous, draft: GuidedContinuous, lat: torch.Tensor,
               back: int) -> torch.Tensor:
        """One draft/verify round for all rows; returns this round's (accepted, rejected, tries,
        fallbacks) counted over active rows and positions inside the grid."""
        g, gen, L = self.gamma, ctx.generator, ctx.L
        B, C = lat.shape[0], lat.shape[2]
        n = ctx.n.clone()
        # Draft: re-feed the last `back` committed tokens (its cache lacks the previous round's last one
        # or two; the whole pre-filled prefix on the first round), then gamma tokens autoregressively.
        draft.set_committed(n - back)
        pos = ctx.positions(n - back, back)
        feed = lat.gather(1, pos[..., None].expand(-1, -1, C))
        runs, zq, zqu = [], [], []
        for _ in range(g):
            qc, qu = draft.forward(feed, pos)
            qc, qu = qc[:, -1], None if qu is None else qu[:, -1]
            draft.set_committed(pos[:, -1] + 1)
            run = draft.sample(qc, qu, gen)
            runs.append(run)
            zq.append(qc)
            zqu.append(qu)
            feed, pos = run.x0[:, None], pos[:, -1:] + 1
        zq_all = torch.stack(zq, 1)
        zqu_all = None if zqu[0] is None else torch.stack(zqu, 1)
        q_runs = _stack(runs)
        drafts = q_runs.x0.reshape(B, g, C)

        # Target: one forward over [last committed, d_1 .. d_gamma] -> z for positions n .. n + gamma.
        last = lat.gather(1, (n - 1)[:, None, None].expand(-1, 1, C))
        pc, pu = target.forward(torch.cat([last, drafts], 1), ctx.positions(n - 1, g + 1))

        def flat(t: torch.Tensor | None) -> torch.Tensor | None:  # (B, g+1, D) -> drafted positions (B*g, D)
            return None if t is None else t[:, :g].reshape(B * g, -1)

        if target.temperature == 0:
            log_ratio, nxt, tries, fallback = self._greedy(target, drafts, flat(pc), flat(pu), pc, pu, gen)
            accepted = (log_ratio == 0).long().cumprod(1).sum(1)
            nxt = nxt(accepted)
        else:
            if self.ratio == "trajectory":
                log_ratio = self._trajectory_log_ratio(target, q_runs, flat(pc), flat(pu)).reshape(B, g)
            else:
                log_ratio, aux = self._paper_log_ratio(target, q_runs, flat(pc), flat(pu), gen)
                log_ratio = log_ratio.reshape(B, g)
            u = uniform((B, g), lat, gen)  # float64: log u = -inf (accept all) has probability 2^-53
            accepted = (torch.log(u) < log_ratio).long().cumprod(1).sum(1)
            if self.ratio == "trajectory":
                nxt, tries, fallback = self._trajectory_next(target, draft, accepted, pc, pu, zq_all, zqu_all, gen)
            else:
                nxt, tries, fallback = self._paper_next(target, accepted, aux, pc, pu, gen)

        block = torch.cat([drafts, nxt[:, None]], 1)
        block = block.scatter(1, accepted[:, None, None].expand(-1, 1, C), nxt[:, None])
        active, remaining = n < L, L - n
        commit_latents(ctx, lat, block, accepted + 1)
        target.set_committed(ctx.n - 1)
        rejected = active & (accepted < g) & (accepted < remaining)
        return torch.stack([
            torch.where(active, torch.minimum(accepted, remaining), 0).sum(),
            rejected.sum(),
            (tries * rejected).sum(),
            (fallback & rejected).sum(),
        ])

    # ------------------------------------------------------------------ ratios and next tokens
    def _trajectory_log_ratio(self, target: GuidedContinuous, q_runs: Trajectory, pz: torch.Tensor,
                              pzu: torch.Tensor | None) -> torch.Tensor:
        """log p_traj - log q_traj along the draft's runs (N,): exact, x_K cancels (Eq. 1/12)."""
        log_p = target.path_log_density(q_runs.states, pz, pzu)
        log_q = q_runs.step_log_densities(target.temperature).sum(-1)
        return log_p - log_q

    def _paper_log_ratio(self, target: GuidedContinuous, q_runs: Trajectory, pz: torch.Tensor,
                         pzu: torch.Tensor | None, gen: torch.Generator) -> tuple[torch.Tensor, dict]:
        """Eq. 5: log Sigma + log p(x_0 | x_1^p) - log q(x_0 | x_1^q) (N,), and what Eq. 11 needs;
        "coupled" sets log Sigma = 0."""
        tau = target.temperature
        if self.align:  # Eq. 3: the draft's x_K and step noises drive the target's run
            p_runs = target.sample(pz, pzu, gen, x_T=q_runs.states[:, 0], noise=q_runs.noise)
        else:
            p_runs = target.sample(pz, pzu, gen)
        dens_p, dens_q = p_runs.step_log_densities(tau), q_runs.step_log_densities(tau)
        # Eq. 1 without the last step, each factor on its model's own path; aligned, the exponentials
        # cancel and this is log Sigma of Eq. 4.
        log_sigma = (dens_p[:, :-1] - dens_q[:, :-1]).sum(-1)
        if self.ratio == "coupled":
            log_sigma = torch.zeros_like(log_sigma)
        elif not self.align:
            zero = torch.zeros_like(q_runs.states[:, 0])
            log_sigma = log_sigma + gaussian_log_density(p_runs.states[:, 0], zero, zero) \
                - gaussian_log_density(q_runs.states[:, 0], zero, zero)
        mean_p, logvar_p = p_runs.means[:, -1], p_runs.logvars[:, -1]
        log_p_last = transition_log_density(q_runs.x0, mean_p, logvar_p, tau)
        aux = {"log_sigma": log_sigma, "mean_p": mean_p, "logvar_p": logvar_p,
                   "mean_q": q_runs.means[:, -1], "logvar_q": q_runs.logvars[:, -1]}
        return log_sigma + log_p_last - dens_q[:, -1], aux

    def _paper_next(self, target: GuidedContinuous, accepted: torch.Tensor, aux: dict, pc: torch.Tensor,
                    pu: torch.Tensor | None, gen: torch.Generator):
        """Eq. 11 at the first rejected position (proposals from the target's last step given x_1^p);
        the bonus token from the target where the whole chain was accepted."""
        g, tau = self.gamma, target.temperature
        B = accepted.shape[0]
        k = accepted.clamp_max(g - 1)
        at = {name: _pick(t.reshape(B, g, *t.shape[1:]), k) for name, t in aux.items()}
        bonus = target.sample(pc[:, g], None if pu is None else pu[:, g], gen).x0
        pending = accepted < g
        draw = paper_residual(tau, at, pending, self.max_resample_tries, gen)
        nxt = torch.where(pending[:, None], draw.samples, bonus)
        return nxt, draw.tries, draw.fallback

    def _trajectory_next(self, target: GuidedContinuous, draft: GuidedContinuous, accepted: torch.Tensor,
                         pc: torch.Tensor, pu: torch.Tensor | None, zq: torch.Tensor, zqu: torch.Tensor | None,
                         gen: torch.Generator):
        """Residual on trajectory space: target runs x ~ p_traj accepted with max(0, 1 - q_traj/p_traj),
        the draft scored along them with its z at the rejected position. Rows that accepted the whole
        chain keep their first proposal: the bonus token, a plain target sample."""
        g = self.gamma
        k = accepted.clamp_max(g - 1)
        z_p, zu_p = _pick(pc, accepted), _pick(pu, accepted)
        z_q, zu_q = _pick(zq, k), _pick(zqu, k)
        draw = trajectory_residual(target, draft, z_p, zu_p, z_q, zu_q, accepted < g, self.max_resample_tries, gen)
        return draw.samples[:, -1], draw.tries, draw.fallback

    def _greedy(self, target: GuidedContinuous, drafts: torch.Tensor, pz: torch.Tensor, pzu: torch.Tensor | None,
                pc: torch.Tensor, pu: torch.Tensor | None, gen: torch.Generator):
        """Temperature 0: accept a draft token iff it matches the target's deterministic output; the
        first mismatch is replaced by that output (no randomness anywhere)."""
        B, g, C = drafts.shape
        own = target.sample(pz, pzu, gen).x0.reshape(B, g, C)
        close = ((drafts - own).abs() <= GREEDY_ATOL * (1 + own.abs())).all(-1)
        log_ratio = torch.where(close, 0.0, float("-inf"))
        bonus = target.sample(pc[:, g], None if pu is None else pu[:, g], gen).x0

        def nxt(accepted: torch.Tensor) -> torch.Tensor:
            return torch.where((accepted < g)[:, None], _pick(own, accepted.clamp_max(g - 1)), bonus)

        zeros = torch.zeros(B, dtype=torch.long, device=drafts.device)
        return log_ratio, nxt, zeros, zeros.bool()
