"""PJD, Parallel Jacobi Decoding (Liao et al., CVPR 2026): Jacobi windows on several image rows at once.

As the official code runs it (boyaliao/PJD ``scheduler/jacobi_iteration_lumina_mgpt.py``, line numbers
+-3 from the reconstruction in pjd_zipar_brief A1): every active row r feeds a chain
``[x_r, d_1, .., d_{v-1}]`` (its last committed token, then drafts of its next columns) and all rows go
through one target forward (sched:426-561). Windows (sched:1230-1242): the top row (every row above
complete) feeds v = min(tokens left in the row, ``window``); a lower row v = min(c_above - c_r,
``window``), so it never drafts past the column under the row above's last committed token. Row
r + 1 starts once row r has ``lag`` image tokens (``long_size`` = 9 entries = 8 image tokens,
sched:923, 1248-1259; ``window_size`` = 8, sched:921). Verification, draft d_i against the law after
d_{i-1} (``SpeculativeSampler.__call__``, sched:249-329):

- top row: the acceptance rule (``acceptance``: Exact min(1, p/q) as official, sched:301; LANTERN or
  GSD pluggable as for SJD), at the first rejection a draw from the rule's residual, a bonus token when
  every draft passes: the row commits accepted + 1 (sched:280, 305-314);
- lower rows: the same test, no residual and no bonus: the accepted drafts only (sched:286-287, 316-317);
- after the first rejection, a later draft whose acceptance probability exceeds ``keep_threshold``
  (official 0.5, sched:320-323) stays a draft with its old law; every other re-draft is drawn from the
  new target law at its position (Jacobi refinement), coupled with the position's previous draft by
  ``coupling`` ("gumbel": one Exp(1) race per position kept while it is in the window, as SJD's);
  positions with no law yet are drawn uniformly over the codes, with their uniform law as q (official:
  a uniform draw with a one-hot q, sched:394-416; both are exact on the top row, uniform accepts more),
  or with ``init="vertical-repeat"`` (a specvis extension: SJD's spatial prior) copied from the
  committed token above, a point-mass law.
- ``rcm``: the Row-Causal Mask, drafts of other rows are never attended (sched:587-595; applied to every
  row, where the official offsets miss rows past the second, pjd_zipar_brief A6-1).

Checked against the official loop on tiny random Lumina-mGPTs, greedy (``docs/results/archive/faithfulness_pjd.py``,
docs/guide/rows2d.md): the same grids and forward counts up to the random first drafts once three official
defects are corrected in memory (those RCM offsets, the unconditional half's Jacobi positions one below its
prefix's, sched:569, and the verification one slot early in the step after a row end, sched:1152);
specvis reproduces none of them.

Per-sample rows (official: batch 1, commits the minimum over the batch, sched:721); the cache keeps each
row's committed prefix, positions and row ends handled by ``methods/rows2d.py`` on every family
(row-end layouts: the row end is forced, never drafted; no row end: the placeholder start of ZipAR's
official LlamaGen code, since PJD's LlamaGen code is not released).

The law (lossy): the top row's tokens pass a speculative-sampling step against the target's law given
everything committed; with ``keep_threshold=1``, ``coupling="none"`` and a grid whose rows never
overlap (``lag`` >= width) this is SJD and exact. Otherwise a lower row's token is accepted against the
law given the rows above up to their committed prefixes (and the row's own tokens keep the KV computed
then): neither AR's law nor a bound; measured TV on tiny models in docs/results/archive/rows2d-tv.md.
``keep_threshold`` keeps a draft whose old law is no longer its law, and a Gumbel race reused after a
lower-row rejection carries what that rejection revealed: both bias the top row too.

Under keyed noise with ``acceptance=Coupled()`` (opt-in: PJD's default rule stays ``Exact``, since PJD is
lossy) every row in flight is verified against the point masses at its laws' keyed choices t_m = argmax_v
p_m(v) / E(s, m, v), m the stream position of the law's column (row r, column c: r S + c, S the stride):
the top row commits t_m (accepted drafts equal it; the residual and the bonus are the point mass), a lower
row the drafts equal to its own t_m (from its partial-context law). Every draft races the same noise,
argmax q / E(s, m, .) (``coupling`` has no effect), so a draft whose law is already the target's is its
choice and the decode is a function of the seed. With rows that never overlap (``lag`` >= width,
``keep_threshold=1``) every law is AR's and the tokens are AR's for the seed; with overlapping rows the
top row's laws condition on tokens committed while their rows were lower rows (chosen from partial-context
laws, their KV computed then): its commits are the keyed choices of those laws, not AR's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..accept import AcceptanceRule, RuleMethod, rule_option, verify_chain
from ..options import option
from ..sampling import exponential, sample
from .base import DecodeContext
from .proposer import RowProposer, decode_rows
from .verdicts import chain_verdict
from .rows2d import MAX_ROWS, Rows

COUPLINGS = ("none", "gumbel")
INITS = ("random", "vertical-repeat")


def keyed_choice(ctx: DecodeContext, probs: torch.Tensor, at: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """The keyed race argmax_v probs(v) / E(s, m, v) (``specvis.noise``) of laws (B, H, n, V) at stream
    positions ``at`` (B, H, n), s the seed of the sample's image: for the image rows ``live`` (B, H) only
    (the rows in flight; the others get 0), so the noise drawn is that of the positions a round can use."""
    b, r = live.nonzero(as_tuple=True)
    out = torch.zeros(at.shape, dtype=torch.long, device=at.device)
    out[b, r] = ctx.keyed.draw(probs[b, r], at[b, r], rows=b)
    return out


def stream_positions(rows: Rows, first: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Stream positions (B, H, n) of columns ``first`` + k of every image row (row r, column c: r S + c, S
    the row stride with its row ends); ``first`` (B, H), ``k`` (n,) offsets."""
    return (rows.rid * rows.stride + first)[..., None] + k


def _at(x: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """x[b, r, j[b, r, ...]] along dim 2 for x (B, H, K, ...) and j (B, H, n): (B, H, n, ...)."""
    idx = j.reshape(*j.shape, *([1] * (x.dim() - 3))).expand(*j.shape, *x.shape[3:])
    return x.gather(2, idx)


@dataclass(frozen=True)
class PJD(RuleMethod):
    """Parallel Jacobi decoding (module docstring): per-row Jacobi ``window`` (tokens a row feeds, its
    last committed token included), next row after ``lag`` image tokens of the row above, the top row
    verified by ``acceptance`` with residual, lower rows accept-prefix, ``keep_threshold`` (1: always
    refine), Row-Causal Mask ``rcm``, first drafts ``init``, re-draft ``coupling``. Lossy; batched with per-sample rows."""

    window: int = option(8, low=2, stream=True, help="tokens a row feeds per forward, its last committed one "
                                                     "included (official window_size 8)")
    lag: int = option(8, low=1, stream=True, help="image tokens of the row above before the next row starts "
                                                  "(official long_size 9 entries = 8 tokens)")
    keep_threshold: float = option(0.5, low=0.0, high=1.0, help="keep a draft tested after the first rejection "
                                                                 "whose acceptance probability exceeds this "
                                                                 "(official 0.5; 1: never, always refine)")
    rcm: bool = option(True, help="Row-Causal Mask: drafts of other rows are never attended")
    init: str = option("random", choices=INITS, help="law of a position's first draft: random (uniform, "
                                                     "official) or vertical-repeat (a copy of the committed "
                                                     "token above, as SJD's spatial prior; uniform where none)")
    coupling: str = option("none", choices=COUPLINGS, help="couple each re-draft with the position's previous "
                                                           "draft: none (official) or gumbel")
    acceptance: AcceptanceRule = rule_option()
    name = "pjd"
    walk = "chain"
    coupled_walk = True  # ``settle`` verifies Coupled's keyed point masses itself
    pad = MAX_ROWS
    refills = True

    @property
    def lossless(self) -> bool:
        return False

    def chain(self, width: int) -> int:
        """Tokens a row feeds at most: ``window``, at most the row's ``width`` (a row never feeds past
        its end: v <= W - c), at least 2 (x and one draft)."""
        return max(2, min(self.window, width))

    def scratch_bytes(self, layout) -> int:
        """Per cache row, what a round allocates besides its cache (an estimate for the memory plan): the
        laws of up to H x chain fed tokens (``memory.LAW_COPIES`` fp32 copies), and each image row's g =
        chain - 1 drafts' laws (fp32), races (fp64, ``coupling="gumbel"``) and point-mass laws (``init=
        "vertical-repeat"``) over V ids; under ``Coupled`` the keyed races of H x chain positions and their
        point masses (no Gumbel race of its own)."""
        from ..memory import LAW_COPIES

        H, K, V = layout.height, self.chain(layout.width), layout.law_size
        g, coupled = K - 1, "noise" in self.acceptance.needs
        per_draft = 4 + (16 if self.coupling == "gumbel" and not coupled else 0) + (12 if self.init == "vertical-repeat" else 0)
        keyed = H * K * V * 40 if coupled else 0  # Coupled: the keyed races (int64 words, fp64 E and ratio) and point masses
        return H * K * V * 4 * LAW_COPIES + H * g * V * per_draft + keyed

    def decode(self, ctx: DecodeContext) -> None:
        K = self.chain(ctx.layout.width)
        rows = Rows(ctx, lag=self.lag, chain=K, rcm=self.rcm)
        decode_rows(ctx, rows, JacobiRows(self, ctx, rows, K))


class JacobiRows(RowProposer):
    """PJD's per-row Jacobi windows (``PJD``): drafts of columns c .. c + g - 1 of every image row with the
    laws they were drawn from, verified by the rule's chain walk with the row's length (top row: residual
    or bonus; lower rows: accept-prefix; under ``Coupled`` against the keyed choices of the laws), then
    refined (or kept) for the next round."""

    def __init__(self, m: PJD, ctx: DecodeContext, rows: Rows, K: int) -> None:
        self.m, self.K, self.g = m, K, K - 1
        B, H, V, dev, g = ctx.n.shape[0], rows.height, ctx.V, ctx.device, K - 1
        self.uni = torch.zeros(V, device=dev)
        self.uni[: ctx.layout.vocab_size] = 1.0 / ctx.layout.vocab_size
        self.coupled = ctx.coupled  # ``accept.Coupled``: verify against, and draft by, the keyed races
        self.gumbel = m.coupling == "gumbel" and not self.coupled
        self.st = {"drafts": torch.zeros(B, H, g, dtype=torch.long, device=dev),  # drafts of columns c .. c + g - 1
                   "laws": torch.zeros(B, H, g, V, device=dev),  # the law each was drawn from
                   "has": torch.zeros(B, H, g, dtype=torch.bool, device=dev),
                   "race": torch.ones(B, H, g, V, dtype=torch.float64, device=dev) if self.gumbel else None}
        self.kk = torch.arange(g, device=dev)

    def draw(self, ctx: DecodeContext, q: torch.Tensor, race: torch.Tensor | None, at: torch.Tensor,
             live: torch.Tensor) -> torch.Tensor:
        """Drafts (B, H, g) from the laws q (B, H, g, V) of stream positions ``at`` (B, H, g): under
        ``Coupled`` the keyed race argmax q / E(s, m, .) of the rows ``live`` (B, H) (others 0), so a draft
        whose law is the target's is the target's choice; else the kept Gumbel race or a draw."""
        if self.coupled:
            return keyed_choice(ctx, q, at, live)
        return torch.argmax(q / race, dim=-1) if self.gumbel else sample(q, ctx.generator)

    def propose(self, ctx: DecodeContext, rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
        st, kk, K, g, gen = self.st, self.kk, self.K, self.g, ctx.generator
        B, H, W, V = ctx.n.shape[0], rows.height, rows.width, ctx.V
        c, open_, top = rows.c, rows.open, rows.top
        self.v = v = torch.where(top, W - c, rows.above() - c).clamp(1, K)
        fresh = ~st["has"] & open_[..., None]  # positions with no draft yet: uniform, or the token above
        q0 = self.uni.expand(B, H, g, V)
        if self.m.init == "vertical-repeat":  # a committed token above: a copy (point-mass law, exact)
            col = c[..., None] + kk
            above = ((rows.rid - 1) * rows.stride)[..., None] + col
            idx = above.clamp(0, ctx.L - 1).flatten(1)
            ok = (rows.rid[..., None] >= 1) & (col < W) & ctx.filled.gather(1, idx).view(above.shape)
            point = torch.nn.functional.one_hot(ctx.tokens.gather(1, idx).view(above.shape), V).to(q0.dtype)
            q0 = torch.where(ok[..., None], point, q0)
        if self.gumbel:
            st["race"] = torch.where(fresh[..., None], exponential(st["race"], gen), st["race"])
        at = stream_positions(rows, c, kk)  # columns c .. c + g - 1
        st["drafts"] = torch.where(fresh, self.draw(ctx, q0, st["race"], at, open_), st["drafts"])
        st["laws"] = torch.where(fresh[..., None], q0, st["laws"])
        return v, st["drafts"]

    def settle(self, ctx: DecodeContext, rows: Rows, block, law) -> None:
        st, kk, K, g, gen, v = self.st, self.kk, self.K, self.g, ctx.generator, self.v
        B, H, V = ctx.n.shape[0], rows.height, ctx.V
        open_, top = rows.open, rows.top
        D, Q = st["drafts"], st["laws"]
        P = rows.chain_laws(block, law.probs)  # (B, H, K, V): the law of column c + k
        soft = None if law.soft is None else rows.chain_laws(block, law.soft).reshape(-1, K, V)
        verified = P
        if self.coupled:  # each law's keyed choice at its stream position (column c + k)
            at = stream_positions(rows, block.c, torch.arange(K, device=ctx.device))
            verified = torch.zeros_like(P).scatter_(-1, keyed_choice(ctx, P, at, open_)[..., None], 1.0)
        m = torch.where(open_, v - 1, torch.zeros_like(v))  # drafts fed
        # the top row: the rule's residual or bonus; lower rows: the accepted drafts only
        walk = verify_chain(ctx.rule, verified.reshape(-1, K, V), Q.reshape(-1, g, V), D.reshape(-1, g), gen,
                            soft=soft, length=m.flatten(), bonus=top.flatten())
        verdict = chain_verdict(D.reshape(-1, g), walk)
        a, alpha = walk.accepted.view(B, H), walk.alpha.view(B, H, g)
        n = torch.where(open_, verdict.committed.view(B, H), torch.zeros_like(a))
        rows.commit(block, n, verdict.block.view(B, H, K))
        # the next window: slot k holds column c + n + k, i.e. old chain column j = n + k
        j = n[..., None] + kk
        refined = j < v[..., None]  # a law of this round
        had = (j < g) & _at(st["has"], j.clamp_max(g - 1))
        old_d, old_q = _at(D, j.clamp_max(g - 1)), _at(Q, j.clamp_max(g - 1))
        keep = ~refined & had  # fed no more since drawn: untested, still distributed as its q
        if self.m.keep_threshold < 1.0:  # tested after the first rejection, likely enough: kept (official)
            tested_late = refined & (j > a[..., None]) & (j < m[..., None]) & had
            keep |= tested_late & (_at(alpha, j.clamp_max(g - 1)) > self.m.keep_threshold)
        p_j = _at(P, j.clamp_max(K - 1))
        redraw = refined & ~keep
        race = None
        if self.gumbel:  # E_m follows its position; a new position gets a fresh one
            race = torch.where(had[..., None], _at(st["race"], j.clamp_max(g - 1)), exponential(st["race"], gen))
            st["race"] = race
        at = stream_positions(rows, block.c + n, kk)  # the new window's columns
        st["drafts"] = torch.where(keep, old_d, self.draw(ctx, p_j, race, at, rows.open))
        st["laws"] = torch.where(keep[..., None], old_q, p_j)
        st["has"] = (keep | redraw) & rows.open[..., None]

    def restart(self, ctx: DecodeContext, rows: Rows, fresh: torch.Tensor) -> None:
        rows.restart(fresh)  # a new sample: its rows from the start, no drafts
        self.st["has"].masked_fill_(fresh[:, None, None], False)
