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
``residual_sample``); counted in ``CSpDStats.resample_fallbacks``.

The rounds run in ``ctx.run`` like every method's (not captured: the residual sampler reads the host);
the views give each position's ``laws.ContinuousLaw`` (sample, run, path density), the ratios and
residuals are ``laws``' functions (shared with CSpD on MAR, ``cspd_mar``), and each round ends with
``ctx.accept``, which commits the continuous tokens to ``ctx.latents`` (B, L + pad, C) and rolls the
target cache back. Statistics: ``CSpDStats``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..options import Options, option
from ..sampling import uniform
from .ar import sample_prefix
from .base import DecodeContext
from .cspd_mar import decode_ordered
from .laws import (ContinuousLaw, cat_runs, matches, paper_log_ratio, paper_residual, trajectory_log_ratio,
                   trajectory_residual)
from .verdicts import Verdict

RATIOS = ("paper", "coupled", "trajectory")


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


def _pick(t: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    """t (B, m, ...) -> t[b, index[b]] (B, ...)."""
    if t is None:
        return None
    idx = index.reshape(-1, 1, *([1] * (t.ndim - 2))).expand(-1, 1, *t.shape[2:])
    return t.gather(1, idx).squeeze(1)


def _pick_law(law: ContinuousLaw, index: torch.Tensor) -> ContinuousLaw:
    """The law at position ``index[b]`` of each row (B, m, D) -> (B, D)."""
    return ContinuousLaw(_pick(law.z, index), _pick(law.z_uncond, index), law.head)


@dataclass(frozen=True)
class CSpD(Options):
    """Continuous speculative decoding: gamma draft tokens per target forward (see the module docstring)."""

    gamma: int = option(8, low=1, stream=True, help="draft tokens per round")
    prefill: float = option(0.05, low=0, high=1, help="fraction of the tokens sampled by the target alone first")
    align: bool = option(True, help="trajectory alignment: the target scores each draft on the draft's own noise")
    ratio: str = option("paper", choices=RATIOS, help="acceptance ratio: paper (Eq. 5), coupled (exact, Eq. 5 "
                                                      "without Sigma) or trajectory (exact)")
    max_resample_tries: int = option(100, low=1, high=10_000, help="residual proposals per rejected token before the last one is "
                                                      "taken (TV error <= 1 / (tries + 1))")
    name = "cspd"
    acceptance = None
    model_order = True  # a MAR model's own order: ``cspd_mar.decode_ordered``

    def check(self) -> None:
        if self.ratio == "trajectory" and not self.align:
            raise ValueError("CSpD.align=False has no meaning with ratio='trajectory' (the target is always scored on the draft's own path)")

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
        if ctx.target.ordered is not None:  # MAR: blocks of drafted steps in the model's order
            decode_ordered(self, ctx)
            return
        s = ctx.target.sampling
        if ctx.target.token_dim is None:
            raise ValueError("method cspd needs continuous-token models (specvis.models.ContinuousAR) as target and draft")
        if s.top_k is not None or s.top_p is not None:
            raise ValueError("method cspd samples continuous tokens: top_k and top_p do not apply (leave them None)")
        n_pre = self.prefill_tokens(ctx.L)
        sample_prefix(ctx, n_pre)  # target-only tokens: every row advances by one a round
        tally = torch.zeros(4, dtype=torch.long, device=ctx.device)  # accepted, rejected, tries, fallbacks
        if not ctx.done():
            draft = ctx.draft
            if draft is None:
                raise ValueError("method cspd needs a draft model (draft=...) unless prefill=1")
            if draft.token_dim != ctx.target.token_dim:
                raise ValueError(f"draft token_dim {draft.token_dim} != target token_dim {ctx.target.token_dim}")
            draft.prefill()
            back = [n_pre]  # the draft re-feeds the whole pre-filled prefix on the first round, 2 later

            def round_() -> None:
                tally.add_(self._round(ctx, back[0]))
                back[0] = 2

            ctx.run(round_, capture=False)
        acc, rej, tries, fallbacks = tally.tolist()
        ctx.record(CSpDStats(acceptance_rate=acc / max(acc + rej, 1), resamples=float(rej),
                             resample_tries=tries / max(rej, 1), resample_fallbacks=float(fallbacks),
                             prefill_tokens=float(n_pre)))

    def _round(self, ctx: DecodeContext, back: int) -> torch.Tensor:
        """One draft/verify round for all rows; returns this round's (accepted, rejected, tries,
        fallbacks) counted over active rows and positions inside the grid."""
        target, draft, g, gen, L = ctx.target, ctx.draft, self.gamma, ctx.generator, ctx.L
        lat = ctx.latents
        B, C = lat.shape[0], lat.shape[2]
        n = ctx.n.clone()
        # Draft: re-feed the last `back` committed tokens (its cache lacks the previous round's last one
        # or two; the whole pre-filled prefix on the first round), then gamma tokens autoregressively.
        draft.set_committed(n - back)
        pos = ctx.positions(n - back, back)
        feed = lat.gather(1, pos[..., None].expand(-1, -1, C))
        runs, q_laws = [], []
        for _ in range(g):
            q = draft.forward(feed, pos)[:, -1]
            draft.set_committed(pos[:, -1] + 1)
            run = q.run(gen)
            runs.append(run)
            q_laws.append(q)
            feed, pos = run.x0[:, None], pos[:, -1:] + 1
        q_all = ContinuousLaw(torch.stack([q.z for q in q_laws], 1),
                              None if q_laws[0].z_uncond is None else torch.stack([q.z_uncond for q in q_laws], 1),
                              q_laws[0].head)
        q_runs = cat_runs(runs, B)
        drafts = q_runs.x0.reshape(B, g, C)

        # Target: one forward over [last committed, d_1 .. d_gamma] -> laws of positions n .. n + gamma.
        last = lat.gather(1, (n - 1)[:, None, None].expand(-1, 1, C))
        p = target.forward(torch.cat([last, drafts], 1), ctx.positions(n - 1, g + 1))
        p_drafted = p[:, :g].flat()  # (B * g) rows, sample-major
        tries = torch.zeros(B, dtype=torch.long, device=lat.device)
        fallback = tries.bool()
        if p.temperature == 0:  # deterministic runs: accept while the draft equals the target's output
            own = p_drafted.sample(gen).reshape(B, g, C)
            accepted = matches(drafts, own).long().cumprod(1).sum(1)
            bonus = p[:, g].sample(gen)
            nxt = torch.where((accepted < g)[:, None], _pick(own, accepted.clamp_max(g - 1)), bonus)
        else:
            if self.ratio == "trajectory":
                log_ratio = trajectory_log_ratio(p_drafted, q_runs).reshape(B, g)
            else:
                log_ratio, aux = paper_log_ratio(p_drafted, q_runs, gen, self.align, self.ratio == "coupled")
                log_ratio = log_ratio.reshape(B, g)
            u = uniform((B, g), lat, gen)  # float64: log u = -inf (accept all) has probability 2^-53
            accepted = (torch.log(u) < log_ratio).long().cumprod(1).sum(1)
            k, pending = accepted.clamp_max(g - 1), accepted < g
            if self.ratio == "trajectory":  # target runs accepted with max(0, 1 - q_traj / p_traj); a fully
                # accepted row keeps its first proposal: the bonus token, a plain target sample
                draw = trajectory_residual(_pick_law(p, accepted), _pick_law(q_all, k), pending,
                                           self.max_resample_tries, gen)
                nxt = draw.samples[:, -1]
            else:  # Eq. 11 at the first rejected position; the bonus token where the whole chain passed
                at = {name: _pick(t.reshape(B, g, *t.shape[1:]), k) for name, t in aux.items()}
                bonus = p[:, g].sample(gen)
                draw = paper_residual(p.temperature, at, pending, self.max_resample_tries, gen)
                nxt = torch.where(pending[:, None], draw.samples, bonus)
            tries, fallback = draw.tries, draw.fallback

        block = torch.cat([drafts, nxt[:, None]], 1)
        block = block.scatter(1, accepted[:, None, None].expand(-1, 1, C), nxt[:, None])
        active, remaining = n < L, L - n
        ctx.accept(Verdict(accepted, block))
        rejected = active & (accepted < g) & (accepted < remaining)
        return torch.stack([
            torch.where(active, torch.minimum(accepted, remaining), 0).sum(),
            rejected.sum(),
            (tries * rejected).sum(),
            (fallback & rejected).sum(),
        ])
