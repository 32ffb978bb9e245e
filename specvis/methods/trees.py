"""The round loop shared by every draft-tree method (EagleTree, ADTTree, StaticTree), and the public
pieces their builders use.

A tree method is a ``TreeSchedule`` (each row's depth d-hat and width k-hat per round) plus a
``TreeBuilder`` (how a round's tree is drafted); ``decode_trees`` runs the rounds, one target forward
each, every row with its own tree and its own accepted length:

1. ``builder.build(ctx, TreeRound)``: the tokens committed by the last round are fed to the EAGLE
   drafter with the target's true features (``catch_up``: its cache then holds every committed token;
   the last one is the root), then the tree is drafted (EAGLE-2 expansion and rerank: ``eagle.py``; a
   fixed topology sampled without replacement: ``static_tree.py``). Positions are stream positions:
   at a forced position (a row end) the drafter's only candidate is its structural id with
   log-probability 0 (``log_draft``), so a tree runs across row ends at no cost in its ranking and
   the target's point mass accepts it.
2. One target forward over root + tree with the tree mask and per-node stream positions, then
   ``ctx.verify(p, tree)``: the rule's sibling walk (``round.verify_tree``).
3. ``ctx.accept(verdict)``: commit; the target keeps root + accepted path (``keep_block``; a sampled
   chain's path is already in place). The features of those tokens feed next round's catch-up.

Rounds of fixed trees (EagleTree, StaticTree) and of ADT-Tree with ``static_shapes`` (the default on
CUDA) have static shapes and never sync with the host (the round loop's ``ctx.done`` is the one
sync), so they run through ``ctx.run`` and are captured as CUDA graphs (``rounds.py``): an ADT tree is
then built at the fixed maximal depth and width with each row's scheduled d-hat and k-hat applied as
masks. With ``static_shapes=False`` (the default on CPU) an ADT round reads the batch's largest d-hat
and k-hat on the host and builds to them (one host sync per round, which also does the done-check;
fewer drafter forwards), drawing its random numbers as for the static shape (``Tree.draws``): both
give the same trees and the same tokens (see ``ADTTree``).

Statistics: ``TreeStats`` (``Stats.extra``); the drafter's forwards are counted by its view.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch

from ..accept import RuleMethod
from ..sampling import rows_at
from .base import DecodeContext
from .verdicts import Tree, Verdict


@dataclass
class TreeStats:
    """What a tree decode reports (``Stats.extra``): ``mean_tree_depth`` (d-bar of the ADT-Tree paper,
    Sec. V-A: the depth of the trees actually drafted, i.e. the deepest node that survives the rerank
    to ``total_tokens``, averaged over active rows and rounds) and ``mean_scheduled_depth`` (the depth
    the tree was built to before the rerank: ``depth`` for EAGLE-2, the schedule's d-hat for ADT-Tree)."""

    mean_tree_depth: float
    mean_scheduled_depth: float


@dataclass(frozen=True)
class TreeRound:
    """What a builder gets each round."""

    pending: torch.Tensor  # (R, m, Dm) target features of the tokens committed last round (catch-up)
    count: torch.Tensor  # (B,) tokens committed last round
    depth: torch.Tensor  # (B,) each row's scheduled depth d-hat (<= levels)
    top_k: torch.Tensor  # (B,) each row's scheduled width k-hat (<= width)
    levels: int  # D: the levels this round's tree is built to
    width: int  # K: the most children an expanded node gets this round


class TreeSchedule(Protocol):
    """Each row's tree depth and width, round by round."""

    max_depth: int  # the deepest d-hat it schedules
    max_top_k: int  # the widest k-hat it schedules
    levels: int  # the depth a static-shaped round is built to
    static: bool  # rounds of one shape (captured) rather than built to the batch's largest d-hat / k-hat

    def first(self, ctx: DecodeContext) -> tuple[torch.Tensor, torch.Tensor]: ...

    def next(self, ctx: DecodeContext, d: torch.Tensor, k: torch.Tensor, accepted: torch.Tensor,
             n_old: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class TreeBuilder(Protocol):
    """How a tree method drafts a round's tree."""

    def drafter_slots(self, ctx: DecodeContext, schedule: TreeSchedule) -> int:
        """Uncommitted drafter cache slots one round's drafting needs."""

    def build(self, ctx: DecodeContext, state: TreeRound) -> Tree: ...


class TreeMethod(RuleMethod):
    """What every tree method shares: losslessness follows the rule (``RuleMethod``); cache room for a
    whole tree."""

    walk = "tree"  # deterministic candidates: the rule's sibling(p, x)

    @property
    def pad(self) -> int:
        return self.total_tokens + 2


class FixedSchedule:
    """Same (depth, top_k) for every tree; shapes known without a host sync."""

    def __init__(self, depth: int, top_k: int) -> None:
        self.max_depth, self.max_top_k = depth, top_k
        self.levels = depth  # the depth every round is built to
        self.static = True

    def first(self, ctx: DecodeContext) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full_like(ctx.n, self.max_depth), torch.full_like(ctx.n, self.max_top_k)

    def next(self, ctx: DecodeContext, d: torch.Tensor, k: torch.Tensor, accepted: torch.Tensor,
             n_old: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return d, k


# ---------------------------------------------------------------- pieces the builders share
def log_draft(logits: torch.Tensor, ctx: DecodeContext, at: torch.Tensor) -> torch.Tensor:
    """Draft ranking scores of stream positions ``at`` (B, n): log-softmax of the guided drafter logits
    at the sampling temperature (temperature 1 when greedy, so alternatives to the argmax keep their
    order); a forced position scores its structural id 0 and everything else -inf."""
    s = ctx.target.sampling
    guided = s.guide(*logits.chunk(2)) if ctx.target.cfg else logits
    t = s.temperature if s.temperature > 0 else 1.0
    lp = torch.log_softmax(guided.float() / t, dim=-1)
    if not ctx.layout.row_end:
        return lp
    return ctx.force_law(torch.nn.functional.pad(lp.exp(), (0, ctx.layout.row_end)), at).log()


def cfg_rows(ctx: DecodeContext, t: torch.Tensor) -> torch.Tensor:
    """Per-row tensor for both CFG halves of the drafter / target rows."""
    return torch.cat([t, t]) if ctx.target.cfg else t


def catch_up(ctx: DecodeContext, pending: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One drafter forward over the ``count`` tokens committed last round (target features ``pending``),
    committed to the drafter cache; returns the root's predicted feature (R, 1, Dm), which predicts
    depth 1, and the draft log-law of depth 1 (B, V) (``log_draft``)."""
    drafter, dev, n = ctx.drafter, ctx.device, ctx.n
    m = pending.shape[1]
    pos = (n - count)[:, None] + torch.arange(m, device=dev)
    toks = ctx.tokens.gather(1, pos.clamp_max(ctx.tokens.shape[1] - 1))
    logits, feats = drafter.forward_tokens(cfg_rows(ctx, toks), pending, cfg_rows(ctx, pos))
    drafter.commit(cfg_rows(ctx, count))
    last = cfg_rows(ctx, (count - 1).clamp_min(0))[:, None]
    return rows_at(feats, last), log_draft(rows_at(logits, last), ctx, n[:, None])[:, 0]


def compact(ctx: DecodeContext, verdict: Verdict, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept the verdict (root-path tokens + the residual token; the target keeps root + path) and
    return the committed counts and the target features (R, m, Dm) of root + path, which the drafter
    lacks next round."""
    count = ctx.accept(verdict)
    return count, rows_at(ctx.target.hidden, cfg_rows(ctx, verdict.slots(m)))


# ---------------------------------------------------------------- the loop
def decode_trees(ctx: DecodeContext, name: str, total_tokens: int, schedule: TreeSchedule,
                 builder: TreeBuilder) -> None:
    """The rounds of a tree method (module docstring) until every row is done; records ``TreeStats``."""
    drafter, target, gen = ctx.drafter, ctx.target, ctx.generator
    if drafter is None:
        raise ValueError(f"method {name} needs an EAGLE drafter (drafter=...)")
    drafter.attach(target.model)
    dev, V, L = ctx.device, ctx.V, ctx.L
    Kmax = min(schedule.max_top_k, V)
    drafter.setup_cache(2 * target.batch if target.cfg else target.batch, extra=builder.drafter_slots(ctx, schedule))
    depth_sum = torch.zeros((), dtype=torch.long, device=dev)
    sched_sum = torch.zeros((), dtype=torch.long, device=dev)
    depth_cnt = torch.zeros((), dtype=torch.long, device=dev)

    count = ctx.accept(Verdict.sampled(target.prefill().sample(gen)))
    pending = target.hidden[:, None]  # (R, m, Dm): target features of the tokens the drafter lacks
    d_row, k_row = schedule.first(ctx)

    def round_(count: torch.Tensor, pending: torch.Tensor, d_row: torch.Tensor, k_row: torch.Tensor,
               D: int, K: int, draws: tuple[int, int] | None = None) -> tuple[torch.Tensor, ...]:
        active = ctx.n < L
        n_old = ctx.n.clone()
        tree = builder.build(ctx, TreeRound(pending, count, d_row, k_row, D, K))
        depth_sum.add_((tree.depth * active).sum())
        sched_sum.add_((d_row * active).sum())
        depth_cnt.add_(active.sum())
        p = target.forward(tree.tokens, tree.positions, tree.mask)  # (B, T, V)
        verdict = ctx.verify(p, tree if draws is None else replace(tree, draws=draws))
        count, pending = compact(ctx, verdict, tree.tokens.shape[1] if verdict.keep is None else verdict.keep.shape[1])
        return (count, pending, *schedule.next(ctx, d_row, k_row, verdict.accepted, n_old, count))

    if schedule.static:  # one tree shape (ADT: the maximal one, rows masked to their schedule); after the
        # first round (one feature per row) every round is alike
        D = schedule.levels
        if not ctx.done():
            count, pending, d_row, k_row = round_(count, pending, d_row, k_row, D, Kmax)
        state = (count, pending, d_row, k_row)  # updated in place: capturable

        def static_round() -> None:
            for buf, new in zip(state, round_(*state, D, Kmax)):
                if new is not buf:  # a fixed shape returns its (d, k) unchanged
                    buf.copy_(new)

        ctx.run(static_round)
    else:  # ADT, host-synced: this round's largest depth and width set the shapes (the one host sync of
        # the round); random draws as for the static path's maximal tree, so both paths draw alike
        draws = (min(total_tokens - 1, Kmax + (schedule.levels - 1) * Kmax * Kmax) + 1, Kmax)
        while True:
            done, D, K = torch.stack([(ctx.n >= L).all().long(), d_row.max(), k_row.max()]).tolist()
            if done:
                break
            count, pending, d_row, k_row = round_(count, pending, d_row, k_row, D, min(K, V), draws)

    cnt = max(int(depth_cnt), 1)
    ctx.record(TreeStats(mean_tree_depth=float(depth_sum) / cnt, mean_scheduled_depth=float(sched_sum) / cnt))
