"""Jacobi decoding (Song et al. 2021) and Speculative Jacobi Decoding (Teng et al. 2024), batched.

Both keep a Jacobi window of W draft tokens per row, at that row's own position (rows never wait for
the slowest one). Each iteration feeds the pending committed token plus the W drafts in ONE target
forward over W + 1 positions (causal), which yields the law ``P[:, j]`` of position ``n + j`` given
the committed prefix and the drafts before it (``P[:, W]`` is the bonus position's law).

SJD (paper Sec. 4.1, App. A). Draft token ``d_j`` was drawn from a law ``q_j`` that is kept per token
(B, W, V), never recomputed. The acceptance rule walks the window left to right
(``accept.verify_chain``): accept while u < alpha(p, q, x); at the first rejection resample from the
rule's residual (Exact: normalise(max(0, p_new - p_old)), eq. 2); when all W are accepted the bonus
token is drawn from ``P[:, W]``. Either way the row commits accepted + 1 tokens, exactly like
draft-model speculative sampling. Then:

- ``refine=True`` (eq. 3): every remaining window position, and the bonus position, is re-sampled
  from ``P`` at its position and its q becomes that ``P`` (the paper's refinement, App. F);
- ``refine=False`` (App. F ablation): those tokens are replaced by fresh initialisations;
- the window slides to the new committed length and the free slots at its end are initialised.

Why this is exact: conditional on the committed prefix and on the drafts before it, each draft token
is distributed as its stored q (it was drawn from q with fresh randomness, and q depends only on
earlier positions), and ``P`` at an accepted-prefix position is the true conditional law, so each
verification step is a speculative-sampling step (min(1, p/q) + residual) and yields the target law.
Repeat initialisations draw from a point mass (q = one-hot of the copied token): min(1, p/q) = p(x)
and the residual is p without x, still exact.

Initialisations (paper Sec. 4.2; left/above in the ``height x width`` grid of ``ctx.layout``):
``random`` uniform over the codebook; ``horizontal-repeat`` / ``vertical-repeat`` copy the left /
above token (point mass); ``horizontal-sample`` / ``vertical-sample`` draw from the law of the left /
above token. The "law of a token" is its q while it is a draft and the target law ``P`` of its
position at the iteration that committed it. In the first column (horizontal) or first row (vertical)
the initialisation falls back to ``random``. A left/above token that is itself still a draft (in the
window, or initialised in the same step) contributes its current draft token / law, so chains of
initialisations resolve to the nearest existing token, or to a random head in the first column/row.
``vertical-sample`` keeps the laws of the last ``width + W`` positions per row in a ring buffer
(B, width + W, V); no other scheme stores laws beyond the window.

Coupled re-drafts (MC-SJD, So et al. 2025, arXiv 2510.24211), ``coupling``: a window position m that
is re-drafted (refined from ``p_new``, or re-initialised when ``refine=False``) already holds a draft x
drawn from its stored law ``p_old``. ``"none"`` draws afresh. ``"maximal"`` keeps x with probability
min(1, p_new(x) / p_old(x)), else draws from normalise(max(0, p_new - p_old)): a speculative-sampling
step of x against p_new, so P(y) = min(p_old, p_new)(y) + (1 - sum min(p_old, p_new)) (p_new - p_old)^+(y)
/ sum (p_new - p_old)^+ = min(p_old, p_new)(y) + (p_new - p_old)^+(y) = p_new(y), and q becomes p_new.
``"gumbel"`` draws every draft of m (initialisation and re-drafts; copies stay copies) as
argmax(q / E_m) with one Exp(1) vector E_m per (row, position), drawn when m enters the window and
kept while it is there (argmax(q / E) is Gumbel-max, E = exp(-g), so each draft is distributed as
its q); while q does not change the draft does not either. The previous draft of the new slot j is
old slot j + accepted + 1 (the window slid by accepted + 1); the bonus position and the positions
entering the window have none and draw afresh.

Why coupling stays exact: let G_m hold everything the verification of m conditions on, the committed
tokens before m, the drafts and laws of positions < m in every round, the verification coins of
positions < m and the laws ``p_old``, ``p_new`` of m (functions of earlier drafts). The earlier drafts
of m are never in G_m: m is verified only once (a verification that reaches m commits it), the target
is causal, initialisations read only left/above tokens and the acceptance of positions < m never reads
slot m. So given G_m the drafts of m form a Markov chain driven by m's own randomness (coins, E_m),
whose kernels are G_m-measurable and map the law of the previous draft (its stored q) to the new q;
by induction the current draft is distributed as its stored q given G_m, which is all the
speculative-sampling step at m needs (drafts after m may depend on it: they are not in G_m). What it
needs: pair m with the previous draft of the same position m (another position's draft lies in G_m,
or has the wrong law) with its own stored q, and never use E_m for the residual or bonus draw.

Jacobi (``jacobi.py``) is the greedy special case with the deterministic criterion: a draft is
accepted while it equals the argmax computed from the previous drafts (token equality), and the new
drafts are the argmaxes (a Jacobi fixed-point iteration). Its output is greedy AR token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..accept import AcceptanceRule, RuleMethod, normalise, rule_option
from ..options import option
from ..sampling import exponential, rows_at, sample, uniform
from .base import DecodeContext
from .proposer import Proposer, decode_chain
from .laws import DiscreteLaw
from .verdicts import Chain, Verdict

INITS = ("random", "horizontal-repeat", "vertical-repeat", "horizontal-sample", "vertical-sample")
COUPLINGS = ("none", "maximal", "gumbel")


@dataclass(frozen=True)
class SJD(RuleMethod):
    """Speculative Jacobi decoding: a ``window`` of self-drafted tokens verified by ``acceptance``
    (any rule of ``specvis.accept``), initialised by ``init`` (see module docstring), refined by
    eq. 3 when ``refine`` (else re-initialised: the paper's App. F ablation), each re-draft coupled
    with the position's previous draft by ``coupling`` (none, maximal or gumbel: MC-SJD, exact). The
    default coupling is "gumbel", the one that accepted the most and ran fastest
    (docs/results/archive/successors.md)."""

    window: int = option(16, low=1, stream=True, help="Jacobi window: draft tokens verified per round")
    init: str = option("random", choices=INITS, help="initialisation of new window slots (paper Sec. 4.2): uniform, "
                                                     "or a copy of / a draw from the left or upper token's law")
    refine: bool = option(True, help="re-draft the rest of the window from the target's laws (eq. 3); false: "
                                     "re-initialise it (App. F ablation)")
    coupling: str = option("gumbel", choices=COUPLINGS, help="couple each re-draft with the position's previous "
                                                             "draft (MC-SJD; exact): none, maximal or gumbel")
    acceptance: AcceptanceRule = rule_option()
    name = "sjd"
    refills = True
    walk = "chain"

    @property
    def pad(self) -> int:
        return self.window + 2

    def decode(self, ctx: DecodeContext) -> None:
        decode_chain(ctx, JacobiDrafts(self.window, self.init, self.coupling, self.refine))


class JacobiDrafts(Proposer):
    """SJD's window (``JacobiWindow``): drafts with the laws they were drawn from; after each round the
    rest of the window is refined from the target's laws (``refine``, eq. 3) or re-initialised, and new
    slots initialised by ``init``."""

    def __init__(self, window: int, init: str, coupling: str, refine: bool = True) -> None:
        self.W, self.init, self.coupling, self.refine = window, init, coupling, refine

    def start(self, ctx: DecodeContext, law: DiscreteLaw) -> None:
        self.win = JacobiWindow(ctx, self.W, self.init, self.coupling)
        self.draft, self.q = self.win.next_window(law.probs[:, None], base=ctx.n - 1, start=ctx.n, first_init=ctx.n)  # updated in place

    def propose(self, ctx: DecodeContext, n: torch.Tensor) -> Chain:
        return Chain(self.draft, self.q)

    def observe(self, ctx: DecodeContext, n: torch.Tensor, p: DiscreteLaw, verdict: Verdict) -> None:
        start = n + verdict.accepted + 1  # the new window's first position (finished rows: don't care)
        first_init = n + self.W + 1 if self.refine else start  # refined slots lie in [start, first_init)
        new_draft, new_q = self.win.next_window(p.probs, base=n, start=start, first_init=first_init, prev=(self.draft, self.q))
        self.draft.copy_(new_draft)
        self.q.copy_(new_q)

    def restart(self, ctx: DecodeContext, fresh: torch.Tensor, law: DiscreteLaw) -> None:
        new_draft, new_q = self.win.restart(fresh, law.probs, ctx.n)  # a new sample: its first window
        self.draft.copy_(torch.where(fresh[:, None], new_draft, self.draft))
        self.q.copy_(torch.where(fresh[:, None, None], new_q, self.q))


def coupling_step(p_new: torch.Tensor, p_old: torch.Tensor, x: torch.Tensor,
                  u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Maximal coupling of x ~ p_old (..., V) with p_new: (keep, law) where keep = u < min(1,
    p_new(x) / p_old(x)) and law = normalise(max(0, p_new - p_old)) is drawn from when not kept."""
    px = p_new.gather(-1, x[..., None]).squeeze(-1)
    qx = p_old.gather(-1, x[..., None]).squeeze(-1)
    keep = u * qx < px  # u < px / qx (qx = 0: keep iff px > 0)
    return keep, normalise((p_new - p_old).clamp_min(0.0), p_new)


def maximal_coupling(p_new: torch.Tensor, p_old: torch.Tensor, x: torch.Tensor,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """A draw distributed as p_new, equal to x ~ p_old with probability min(1, p_new(x) / p_old(x))."""
    keep, law = coupling_step(p_new, p_old, x, uniform(x.shape, x, generator))
    return torch.where(keep, x, sample(law, generator))


class JacobiWindow:
    """Builds the next Jacobi window (tokens (B, W) and the laws they were drawn from (B, W, V)),
    vectorised over rows and slots: refined slots draw from the target laws, initialised slots
    follow the init scheme, repeat schemes then copy their source token (point-mass law). Drawn
    slots that held a draft are coupled with it (``coupling``, module docstring)."""

    def __init__(self, ctx: DecodeContext, window: int, init: str, coupling: str = "none") -> None:
        self.ctx, self.W, self.init, self.coupling = ctx, window, init, coupling
        self.V, self.width = ctx.V, ctx.layout.stride  # laws over codes + structural ids; grid rows in the stream
        dev = ctx.device
        self.slots = torch.arange(window, device=dev)
        codes = ctx.layout.vocab_size
        self.uniform = torch.zeros(self.V, device=dev)
        self.uniform[:codes] = 1.0 / codes
        self.ring = self.race = None
        if init == "vertical-sample":  # laws of the last width + W positions per row
            self.R = self.width + window
            self.ring = torch.zeros(ctx.n.shape[0], self.R, self.V, device=dev)
        if coupling == "gumbel" and ctx.keyed is None:  # E_m of the positions in the window, slot-aligned like the drafts
            self.race = torch.ones(ctx.n.shape[0], window, self.V, device=dev, dtype=torch.float64)

    def restart(self, fresh: torch.Tensor, p0: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The first window (as after the prefill) of rows ``fresh``, restarted with a new sample whose
        token 0 was drawn from ``p0`` (B, V); the other rows' laws and races are kept."""
        state = [t for t in (self.ring, self.race) if t is not None]
        kept = [t.clone() for t in state]
        if self.ring is not None:
            self.ring.masked_fill_(fresh[:, None, None], 0.0)
        window = self.next_window(p0[:, None], base=n - 1, start=n, first_init=n)
        for t, old in zip(state, kept):
            t.copy_(torch.where(fresh[:, None, None], t, old))
        return window

    def _ring_write(self, pos: torch.Tensor, laws: torch.Tensor) -> None:
        rows = torch.arange(pos.shape[0], device=pos.device)[:, None] * self.R
        self.ring.view(-1, self.V).index_copy_(0, (rows + pos % self.R).flatten(), laws.reshape(-1, self.V))

    def next_window(self, p: torch.Tensor, base: torch.Tensor, start: torch.Tensor, first_init: torch.Tensor,
                    prev: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``p`` (B, K, V): target laws of positions base .. base+K-1 (committed or refinable).
        The window covers start .. start+W-1; slots before ``first_init`` are refined from ``p``,
        the others initialised. ``prev``: the previous window (draft, q), which started at ``base``.
        Returns (draft (B, W), q (B, W, V))."""
        ctx, W, width = self.ctx, self.W, self.width
        K = p.shape[1]
        pos = start[:, None] + self.slots  # (B, W) grid positions of the window slots
        s = first_init[:, None]
        refined = pos < s
        p_ref = rows_at(p, (pos - base[:, None]).clamp(0, K - 1))
        if self.ring is not None:  # committed and refined positions: their law is p
            self._ring_write(base[:, None] + torch.arange(K, device=p.device), p)

        if self.init == "random":
            q_init = self.uniform
        elif self.init.startswith("horizontal"):
            col = pos % width
            src = torch.where(pos - col >= s, pos - col, s - 1)  # first-column head, or the token left of the run
            from_head = src >= s
            head = from_head & (col == 0)
            if self.init == "horizontal-sample":
                left = rows_at(p, (first_init - 1 - base).clamp(0, K - 1)[:, None])
                q_init = torch.where(from_head[..., None], self.uniform, left)
        else:  # vertical: walk up by rows to the first position before the initialised run
            k = torch.div(pos - s, width, rounding_mode="floor") + 1
            up = pos - k * width
            from_head = up < 0  # the run reaches the first row, whose slot is a random head
            src = torch.where(from_head, up + width, up)
            head = pos < width
            if self.init == "vertical-sample":
                above = rows_at(self.ring, src % self.R)
                q_init = torch.where(from_head[..., None], self.uniform, above)
        if self.init.endswith("repeat"):
            q_init = self.uniform  # heads draw uniformly; the others copy below

        q = torch.where(refined[..., None], p_ref, q_init)
        old = (pos - base[:, None]).clamp(0, W - 1)  # the slot of pos in the previous window
        had = pos - base[:, None] < W if prev is not None else torch.zeros_like(refined)
        if self.coupling == "gumbel" and ctx.keyed is not None:  # argmax(q / E_m), E_m the keyed noise of m
            draft = torch.argmax(q / ctx.keyed.noise(pos), dim=-1)
        elif self.coupling == "gumbel":  # argmax(q / E_m), E_m kept while m stays in the window
            fresh = exponential(q, ctx.generator)
            race = torch.where(had[..., None], rows_at(self.race, old), fresh)
            self.race.copy_(race)
            draft = torch.argmax(q / race, dim=-1)
        elif self.coupling == "maximal" and prev is not None:
            x, q_old = prev[0].gather(1, old), rows_at(prev[1], old)
            keep, law = coupling_step(q, q_old, x, uniform(x.shape, x, ctx.generator))
            draft = torch.where(had & keep, x, sample(torch.where(had[..., None], law, q), ctx.generator))
        else:
            draft = sample(q, ctx.generator)
        if self.init.endswith("repeat"):
            tokens = ctx.tokens.gather(1, src.clamp(0, ctx.tokens.shape[1] - 1))
            in_window = draft.gather(1, (src - start[:, None]).clamp(0, W - 1))
            copied = torch.where(src >= start[:, None], in_window, tokens)
            copy = ~refined & ~head
            draft = torch.where(copy, copied, draft)
            point = torch.zeros_like(q).scatter_(-1, draft[..., None], 1.0)
            q = torch.where(copy[..., None], point, q)
        if ctx.layout.row_end:  # forced positions: their id, as a point mass
            draft, q = ctx.force(draft, pos), ctx.force_law(q, pos)
        if self.ring is not None:
            self._ring_write(pos, q)
        return draft, q
