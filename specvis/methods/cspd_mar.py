"""CSpD on MAR (Wang et al. 2024, paper 000), run as its authors' code runs it (MarkXCloud/CSpD at
d91f721: ``spec_decode/spec_decode_runner.py`` ``SpecDecodeRunner.run``, lines 82-203, with
``models/mar.py`` ``sample_tokens_step`` / ``sample_tokens_step_with_mask``, lines 298-398).

MAR is bidirectional: there is no KV cache and no "next token". A forward encodes the known tokens,
puts the mask token everywhere else and yields z at every masked position; MAR's own sampler draws, at
step s of ``num_iter``, the tokens at the positions of a random order that its cosine schedule reveals
(``MAR.sample``). What the paper's draft/verify round means here, in the authors' code:

- One generation order (``orders``, runner line 104) and one noise per position, shared by draft and
  target: x_K (``noise``, line 101) and every step noise (``inter_noise``, line 103), which is the
  trajectory alignment of Eq. 3 (both models denoise a position from the same x_K with the same eps_k).
- Pre-filling (lines 113-130): the steps s <= ``prefill * num_iter`` (``milestone``; the demo notebook
  uses ratio 0.05, the paper's 5%) are MAR steps of the target alone (``sample_tokens_step``).
- Drafting (lines 132-153): every later step s is a MAR step of the DRAFT on the draft's own tokens
  (committed ones and its earlier drafts), revealing the schedule's positions for s at CFG scale
  ``scale[s]``; each drafted token keeps the draft's last-step mean and variance.
- Verification (lines 155-200): after draft step s with ``s % gamma == 0`` (and ``s != 0``) or at the
  last step, ONE target forward (``sample_tokens_step_with_mask``, mar.py lines 351-398) runs on the
  committed tokens only (``mask_target``: the drafts of the block are masked) and returns z for ALL
  positions drafted since the last verification (``mask_to_pred = mask_target xor mask_draft``), at the
  CFG scale of the block's last draft step (``draft_aux['mask_len']``). So ``gamma`` counts MAR draft
  STEPS per target forward (each step reveals several tokens of the order), and the first block after
  the pre-fill ends at the next multiple of gamma.
- Acceptance (lines 190-200, ``DistributionProcessor.speculative_sample``): every drafted token of the
  block is accepted or rejected INDEPENDENTLY (u < ratio); a rejected token is replaced by a residual
  draw (``sample_distribution``, acceptance-rejection with target proposals, at most 100 tries), and
  every token of the block is committed: there is no "stop at the first rejection" and no bonus token.

Why independent acceptance is right here: the target's z for the block comes from one bidirectional
pass over the committed set only, so its law for the block is the product of per-position laws p_j,
exactly the law of a MAR step that reveals the whole block at once. The draft's proposal for position j
depends on its own earlier drafts, but speculative sampling turns any proposal into a draw from p_j
whatever it was conditioned on, so the committed tokens of a block are independent draws from the p_j.
The law CSpD samples (with an exact ratio) is therefore MAR's sampler with a COARSER schedule:
one step per pre-fill step and one per verified block (``CSpDSchedule.target_reveals``), each block at
the CFG scale of its last draft step; ``gamma=1`` is MAR's own schedule. ``MAR.sample(reveals=,
scales=, last_step_noise=True)`` samples that law directly (the tests compare against it).

Ratios: the same three as ``specvis.methods.cspd``, CSpD's public pieces (``laws.paper_log_ratio``,
``trajectory_log_ratio``, ``paper_residual`` and ``trajectory_residual`` on N = B x block rows, with MAR's
DiffLoss as a ``laws.GuidedHead`` whose x_K stays random at temperature 0): ``"paper"`` Eq. 4/5
with Eq. 11 (not exact), ``"coupled"`` (Eq. 5 with Sigma := 1, exact) and ``"trajectory"`` (exact).
Departures from the authors' code, each deliberate:
- The official sampler adds no noise on the last denoising step (``p_sample``: ``nonzero_mask``), so
  x_0 = mu(x_1) is not a Gaussian draw and p(x_0 | x_1) of Eq. 5 has no density; the authors still
  evaluate a Gaussian of the last step's std there (and propose residual tokens WITH that noise).
  Here every run under CSpD, target pre-fill included, draws the last step with its noise, so Eq. 5
  and the exact ratios are densities of what is sampled. The law is MAR's with that last noise
  (``last_step_noise=True``), std sqrt(beta_tilde_1)-ish times the temperature.
- The authors' ``judge_accept`` (runner lines 19, 35-38) multiplies by
  ``fixed_term = exp(sum(log sigma_p - log sigma_q))`` over the non-last steps, i.e. 1 / Sigma of
  Eq. 4, and divides the exponents of both last-step Gaussians by ``inner_temperature`` = 42 (line 72);
  its residual (lines 40-43) uses the same 1/Sigma but the untempered densities. Here ``"paper"`` is
  Eq. 4/5/11 as printed (Sigma, no inner temperature).
- Randomness comes from one ``torch.Generator`` (``seed``) for the batch, not from the global CUDA RNG.
Temperature 0 (MAR's convention, also in ``MAR.sample``: the temperature scales the step noise only,
x_K stays random): a run is a deterministic function of its x_K; the target denoises the draft's x_K,
a drafted token is accepted iff it equals the target's output (``GREEDY_ATOL``), and the block commits
the target's outputs, so the result is the target's temperature-0 law exactly.

It runs through ``specvis.generate`` in the ordinary context (``methods.ordered``: MAR's family
declares its order, schedule, forward and head; ``CSpD.decode`` comes here when the target is ordered),
one round per pre-fill step or verified block, each ending in ``ctx.accept`` at the block's positions.
Statistics (``Stats``): ``target_forwards`` counts pre-fill steps + verifications (MAR's own sampler
needs one per non-empty step: ``CSpDMARStats.mar_steps``), ``mean_accepted_length`` = tokens per target
forward; ``CSpDMARStats``: ``acceptance_rate`` accepted / drafted tokens (the paper's alpha),
``resamples``, ``resample_tries``, ``resample_fallbacks``, ``prefill_steps``, ``verify_rounds``,
``mar_steps``, ``num_iter``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..models.mar import cfg_scales, mask_schedule
from ..sampling import uniform
from .base import DecodeContext
from .laws import ContinuousLaw, cat_runs, matches, paper_log_ratio, paper_residual, trajectory_log_ratio, trajectory_residual
from .ordered import Reveal, accept_at, known


@dataclass
class CSpDMARStats:
    """What CSpD on MAR reports (``Stats.extra``; module docstring)."""

    acceptance_rate: float
    resamples: float
    resample_tries: float
    resample_fallbacks: float
    prefill_steps: float
    verify_rounds: float
    mar_steps: float
    num_iter: float


@dataclass
class CSpDSchedule:
    """Which model draws which MAR step. ``reveals``/``scales``: MAR's own schedule (tokens drawn and
    CFG scale per step s); ``rounds``: ("prefill", [s]) target-only steps and ("verify", [s, ...])
    draft steps closed by one target forward, in order (empty steps dropped, empty rounds too)."""

    reveals: list[int]
    scales: list[float]
    rounds: list[tuple[str, list[int]]] = field(default_factory=list)

    @property
    def target_reveals(self) -> list[int]:
        """Tokens per target step of the law CSpD samples (a pre-fill step or a whole verified block)."""
        return [sum(self.reveals[s] for s in steps) for _, steps in self.rounds]

    @property
    def target_scales(self) -> list[float]:
        """CFG scale per target step: a block is verified at the scale of its last draft step."""
        return [self.scales[steps[-1]] for _, steps in self.rounds]

    @property
    def mar_steps(self) -> int:
        return sum(1 for n in self.reveals if n)


def cspd_schedule(seq_len: int, num_iter: int, gamma: int, prefill: float, cfg: float,
                  cfg_schedule: str) -> CSpDSchedule:
    """The authors' split of MAR's ``num_iter`` steps (its cosine mask schedule and CFG schedule)."""
    mask_lens, reveals = mask_schedule(seq_len, num_iter)
    return split_schedule(reveals, cfg_scales(cfg, cfg_schedule, seq_len, mask_lens), gamma, prefill)


def split_schedule(reveals: list[int], scales: list[float], gamma: int, prefill: float) -> CSpDSchedule:
    """The authors' split of a sampler's steps (runner lines 113-155): steps s <= prefill * num_iter by
    the target; later steps drafted, a verification after draft step s when s % gamma == 0 or
    s == num_iter - 1."""
    num_iter = len(reveals)
    sched, block = CSpDSchedule(list(reveals), list(scales)), []
    milestone = num_iter * prefill
    for s in range(num_iter):
        if s <= milestone:
            if reveals[s]:
                sched.rounds.append(("prefill", [s]))
            continue
        if reveals[s]:
            block.append(s)
        if (s % gamma == 0 and s != 0) or s == num_iter - 1:
            if block:
                sched.rounds.append(("verify", block))
            block = []
    return sched


def decode_ordered(method, ctx: DecodeContext) -> None:
    """CSpD (``method``) on a target decoded in its own order (module docstring): one round per
    pre-fill step (the target's own draw) or verified block of draft steps."""
    target, draft, gen = ctx.target, ctx.draft, ctx.generator
    s = target.sampling
    if s.top_k is not None or s.top_p is not None:
        raise ValueError("top_k/top_p do not apply to MAR's continuous tokens")
    tau = float(s.temperature)
    plan = Reveal(ctx)
    sched = split_schedule(plan.reveals, plan.scales, method.gamma, method.prefill)
    if draft is None and any(kind == "verify" for kind, _ in sched.rounds):
        raise ValueError("method cspd on MAR needs a draft MAR (draft=...) unless prefill=1")
    B, C = ctx.n.shape[0], target.token_dim
    tally = [0, 0, 0, 0]  # accepted, rejected, tries, fallbacks
    rounds = iter(sched.rounds)

    def round_() -> None:
        kind, steps = next(rounds)
        tokens, unknown = known(ctx)
        if kind == "prefill":
            idx = plan.at(steps[0])
            law = target.laws(tokens, unknown, idx, plan.scales[steps[0]])
            accept_at(ctx, idx, law.flat().sample(gen).reshape(B, -1, C), torch.zeros_like(ctx.n))
            return
        # draft steps on the draft's own tokens (committed + its earlier drafts of this block)
        d_tok, d_unknown = tokens, unknown
        runs, q_laws, idxs = [], [], []
        for st in steps:
            idx = plan.at(st)
            q = draft.laws(d_tok, d_unknown, idx, plan.scales[st]).flat()
            run = q.run(gen)
            d_tok = d_tok.scatter(1, idx[..., None].expand(-1, -1, C), run.x0.reshape(B, -1, C))
            d_unknown = d_unknown.scatter(1, idx, False)
            runs.append(run)
            q_laws.append((q, torch.full(idx.shape, float(plan.scales[st]), device=ctx.device)))
            idxs.append(idx)
        idx = torch.cat(idxs, 1)
        q_runs = cat_runs(runs, B)
        drafted = q_runs.x0
        # one target forward: z for every drafted position given the committed tokens only
        p = target.laws(tokens, unknown, idx, plan.scales[steps[-1]]).flat()
        if tau == 0:
            own = p.run(gen, x_T=q_runs.states[:, 0]).x0  # the draft's x_K
            ok, out = matches(drafted, own), own
        else:
            if method.ratio == "trajectory":
                log_ratio = trajectory_log_ratio(p, q_runs)
            else:
                log_ratio, aux = paper_log_ratio(p, q_runs, gen, method.align, method.ratio == "coupled")
            u = uniform(log_ratio.shape, log_ratio, gen)  # float64: no acceptance floor (sampling.uniform)
            ok = torch.log(u) < log_ratio
            if method.ratio == "trajectory":  # the draft's laws of the block, each at its step's scale
                q_all = ContinuousLaw(_cat([q.z for q, _ in q_laws], B),
                                      None if p.z_uncond is None else _cat([q.z_uncond for q, _ in q_laws], B),
                                      draft.head(torch.cat([sc for _, sc in q_laws], 1).reshape(-1, 1)))
                draw = trajectory_residual(p, q_all, ~ok, method.max_resample_tries, gen)
                resampled = draw.samples[:, -1]
            else:
                draw = paper_residual(tau, aux, ~ok, method.max_resample_tries, gen)
                resampled = draw.samples
            out = torch.where(ok[:, None], drafted, resampled)
            tally[2] += int((draw.tries * ~ok).sum())
            tally[3] += int((draw.fallback & ~ok).sum())
        tally[0] += int(ok.sum())
        tally[1] += int((~ok).sum())
        accept_at(ctx, idx, out.reshape(B, -1, C), ok.reshape(B, -1).sum(1))

    ctx.run(round_, rounds=len(sched.rounds))
    acc, rej, tries, fallbacks = tally
    prefill_steps = sum(1 for kind, _ in sched.rounds if kind == "prefill")
    ctx.record(CSpDMARStats(acceptance_rate=acc / max(acc + rej, 1), resamples=float(rej),
                            resample_tries=tries / max(rej, 1), resample_fallbacks=float(fallbacks),
                            prefill_steps=float(prefill_steps), verify_rounds=float(len(sched.rounds) - prefill_steps),
                            mar_steps=float(sched.mar_steps), num_iter=float(len(plan.reveals))))


def _cat(zs: list[torch.Tensor], B: int) -> torch.Tensor:
    """Rows of B * n_i (sample-major) per step -> B * sum(n_i) rows, sample-major."""
    return torch.cat([z.reshape(B, -1, z.shape[-1]) for z in zs], 1).reshape(-1, zs[0].shape[-1])
