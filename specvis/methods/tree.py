"""EAGLE-2 dynamic draft trees (Li et al. 2024) and ADT-Tree adjacency-adaptive trees, batched.

One round per target forward, every row with its own tree and its own accepted length, in three
steps (each a plain function over batched tensors):

1. ``build_tree``: the tokens committed by the last round are fed to the EAGLE head with the
   target's true features (its cache then holds every committed token); the last one is the root.
   Then depth by depth, the top-k children of each expanded node (by draft probability of the guided
   drafter logits) join a candidate pool scored by cumulative log-probability; the top-k candidates
   of each depth are expanded by one drafter forward over that depth (tree mask). The pool is
   reranked and the best ``total_tokens - 1`` nodes form the tree. A stable sort on the pool laid out
   depth by depth keeps every parent ahead of its children, so the tree is ancestor-closed. Positions
   are stream positions: the drafter scores the image codes only, and at a forced position (a row
   end) the only candidate is its structural id with log-probability 0 (``_log_draft``), so a tree
   runs across row ends at no cost in its ranking and the target's point mass accepts it.
2. One target forward over root + tree with the tree mask and per-node grid positions, then
   ``verify_tree`` with the rule's ``sibling(p, x, soft=...)``: at a node, children are tried in
   draft-rank order, each accepted with the rule's alpha against the current residual (Exact: p(x);
   on rejection zero it and renormalise); an accepted child continues the walk, else the next token
   is drawn from the residual (from p at a leaf). Candidates depend only on the committed prefix, so with ``Exact``
   the output law is exactly the target's. Every node's sibling walk runs in parallel (a loop over
   rank); the path is then followed with one gather per depth.
3. ``compact``: ``ctx.commit``; the target keeps root + accepted path with one ``keep_block`` (a
   sampled chain's path is already in place: only committed); the features of those tokens feed the
   drafter's catch-up next round.

Tree building loops over depth only; there is no Python loop over nodes, rows or vocabulary. Rounds
of fixed trees (EagleTree, StaticTree) and of ADT-Tree with ``static_shapes`` (the default on CUDA)
have static shapes and never sync with the host (the round loop's ``ctx.done`` is the one sync), so
they run through ``ctx.run`` and are captured as CUDA graphs (``rounds.py``): an ADT tree is then
built at the fixed maximal depth and width with each row's scheduled d-hat and k-hat applied as
masks. With ``static_shapes=False`` (the default on CPU) an ADT round reads the batch's largest
d-hat and k-hat on the host and builds to them (one host sync per round, which also does the
done-check; fewer drafter forwards). Both give the same trees, the same random draws and so the
same tokens (see ``ADTTree``).

Statistics: ``TreeStats`` (``Stats.extra``); the drafter's forwards are counted by its view.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..accept import Exact
from ..sampling import rows_at, sample
from .base import DecodeContext
from .round import Tree, Verdict

INITS = ("horizontal", "vertical", "random")


@dataclass
class TreeStats:
    """What a tree decode reports (``Stats.extra``): ``mean_tree_depth`` (d-bar of the ADT-Tree paper,
    Sec. V-A: the depth of the trees actually drafted, i.e. the deepest node that survives the rerank
    to ``total_tokens``, averaged over active rows and rounds) and ``mean_scheduled_depth`` (the depth
    the tree was built to before the rerank: ``depth`` for EAGLE-2, the schedule's d-hat for ADT-Tree)."""

    mean_tree_depth: float
    mean_scheduled_depth: float


def _check_int(owner: str, name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{owner}.{name} must be an integer >= {low}, got {value!r}")


class _TreeMethod:
    """What both tree methods share: losslessness follows the rule; cache room for a whole tree."""

    @property
    def lossless(self) -> bool:
        return self.acceptance.lossless

    @property
    def pad(self) -> int:
        return self.total_tokens + 2


@dataclass(frozen=True)
class EagleTree(_TreeMethod):
    """EAGLE-2 dynamic tree: ``depth`` draft levels, ``top_k`` children per expanded node,
    ``total_tokens`` tokens per target forward (root included). Needs ``drafter=`` (an EagleDrafter)."""

    depth: int = 5
    top_k: int = 10
    total_tokens: int = 60
    acceptance: object = field(default_factory=Exact)
    name = "eagle"

    def __post_init__(self) -> None:
        _check_int("EagleTree", "depth", self.depth, 1)
        _check_int("EagleTree", "top_k", self.top_k, 1)
        _check_int("EagleTree", "total_tokens", self.total_tokens, 2)

    def decode(self, ctx: DecodeContext) -> None:
        _decode_trees(ctx, self.name, self.total_tokens, _Fixed(self.depth, self.top_k))


@dataclass(frozen=True)
class ADTTree(_TreeMethod):
    """ADT-Tree (Lei et al., paper 002, Sec. IV): each tree's depth d-hat and width (top-k) k-hat.

    Initialisation (Sec. IV-A): from the tree that committed the left neighbour (``horizontal``: the
    previous tree of the row), the upper neighbour (``vertical``: the stream position one layout stride
    back, row ends included; the previous tree where there is no upper neighbour or it came from the
    prefill), or uniformly at random (``random``).
    Adaptation (eq. 2): the acceptance rate of the previous tree is alpha = tau / d with tau its
    acceptance length *including* the bonus token (accepted + 1; Sec. III-B, and tau = accept_length
    + 1 in the authors' code) and d its scheduled depth. alpha >= ``beta``: d + ``depth_step`` and
    k - ``topk_step`` (deeper, narrower), else d - ``depth_step`` and k + ``topk_step``; k changes only
    when the new depth d-tilde +- l_d > 1 (Sec. IV-B, last paragraph).

    Bounds (Sec. IV-B): ``depth_range=(d_min, d_max)`` and ``topk_range=(k_min, k_max)`` are *open*
    intervals, d_min < d < d_max and k_min < k < k_max; the defaults are the paper's Anole setting
    (Sec. V-A: (0, 10) and (3, 14), beta 1, l_d 1, l_k 3), i.e. depths 1..9 and top-k 4..13. Values
    are clamped into the interval; ``random`` draws uniformly from its integers. (API.md lists
    ``depth_range=(1, 10)``; the default stays the paper's (0, 10), which admits depth 1; the authors'
    public code has no schedule to settle it.)

    First tree (no neighbour yet; the authors' public code does not contain the schedule): the
    midpoint of the admissible integers, ((d_min + d_max) // 2, (k_min + k_max) // 2) -- equidistant
    from both bounds, so bisection reaches either end in the fewest rounds; for the defaults this is
    depth 5, the EAGLE-2 depth the paper compares against (Fig. 3, Table I), and top-k 8. With
    ``random`` the first tree is drawn like every other one.

    Round shapes (``static_shapes``; None: True on CUDA, False on CPU). True: every round is built at
    one fixed shape, depth D = min(d_max - 1, ``total_tokens`` - 1) (no node of a tree of
    ``total_tokens`` - 1 nodes lies deeper: the rerank keeps it ancestor-closed) and width
    K = min(k_max - 1, vocabulary), with each row's d-hat and k-hat as masks (children beyond rank
    k-hat and nodes deeper than d-hat are invalid: not drafted into the tree, not verified); no host
    sync, so the round is captured as a CUDA graph like EagleTree's. The cost: D drafter forwards per
    round (catch-up + D - 1 expansions of K nodes each) whatever the schedule, where the host-synced
    path spends the batch's largest d-hat, each expansion over its largest k-hat nodes. On a
    launch-bound GPU a fixed count of small drafter forwards in one graph is cheaper than a host
    round-trip per round (which also forbids capture); on CPU the drafter's compute counts, so the
    host-synced path is the default there (measured on the emoji bundle, one core, batch 1: the
    static path 2.8x slower at ``total_tokens=24`` and 4.2x at 60, with 3.3x the drafter forwards).
    False: each round reads the batch's largest d-hat and k-hat on the host (one sync, shared with
    the done-check) and builds to them. Both paths draft the same nodes at the same tree positions
    for the same schedule and draw their random numbers at the static shape (``verify_tree``'s
    ``draws``), so with the same seed they give the same tokens and the same statistics except
    ``draft_forwards``."""

    init: str = "horizontal"
    beta: float = 1.0
    depth_step: int = 1
    topk_step: int = 3
    depth_range: tuple[int, int] = (0, 10)
    topk_range: tuple[int, int] = (3, 14)
    total_tokens: int = 60
    acceptance: object = field(default_factory=Exact)
    static_shapes: bool | None = None
    name = "adt"

    def __post_init__(self) -> None:
        if self.init not in INITS:
            raise ValueError(f"ADTTree.init must be one of {', '.join(INITS)}, got {self.init!r}")
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not self.beta > 0:
            raise ValueError(f"ADTTree.beta must be a number > 0, got {self.beta!r}")
        _check_int("ADTTree", "depth_step", self.depth_step, 0)
        _check_int("ADTTree", "topk_step", self.topk_step, 0)
        _check_int("ADTTree", "total_tokens", self.total_tokens, 2)
        if self.static_shapes is not None and not isinstance(self.static_shapes, bool):
            raise ValueError(f"ADTTree.static_shapes must be None, True or False, got {self.static_shapes!r}")
        for name in ("depth_range", "topk_range"):
            value = getattr(self, name)
            ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value)
            if not ok or not 0 <= value[0] <= value[1] - 2:
                raise ValueError(f"ADTTree.{name} must be an open interval (low, high) of integers with "
                                 f"0 <= low and at least one integer inside (low + 2 <= high), got {value!r}")
            object.__setattr__(self, name, tuple(value))

    def decode(self, ctx: DecodeContext) -> None:
        static = ctx.device.type == "cuda" if self.static_shapes is None else self.static_shapes
        _decode_trees(ctx, self.name, self.total_tokens, _Adaptive(self, ctx, static=static))


# ---------------------------------------------------------------- tree shapes per round
class _Fixed:
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


class _Adaptive:
    """ADT-Tree schedule (see ``ADTTree``): per-position record of the tree that committed each token,
    adjacent initialisation and bisection adaptation (eq. 2), all per row on the device."""

    def __init__(self, m: ADTTree, ctx: DecodeContext, static: bool = False) -> None:
        self.m = m
        (dl, dh), (kl, kh) = m.depth_range, m.topk_range
        self.dlim, self.klim = (dl + 1, dh - 1), (kl + 1, kh - 1)  # open bounds as closed integer ranges
        self.max_depth, self.max_top_k = self.dlim[1], self.klim[1]
        # static shapes: the depth every round is built to; total_tokens - 1 nodes reach no deeper level
        self.levels = min(self.max_depth, m.total_tokens - 1)
        self.static = static
        shape = ctx.tokens.shape
        self.dtab = torch.zeros(shape, dtype=torch.long, device=ctx.device)  # 0: no tree (prefill)
        self.ktab = torch.zeros(shape, dtype=torch.long, device=ctx.device)

    def first(self, ctx: DecodeContext) -> tuple[torch.Tensor, torch.Tensor]:
        if self.m.init == "random":
            return self._random(ctx)
        (dl, dh), (kl, kh) = self.dlim, self.klim
        return torch.full_like(ctx.n, (dl + dh) // 2), torch.full_like(ctx.n, (kl + kh) // 2)

    def _random(self, ctx: DecodeContext) -> tuple[torch.Tensor, torch.Tensor]:
        (dl, dh), (kl, kh) = self.dlim, self.klim
        B = ctx.n.shape[0]
        d = torch.randint(dl, dh + 1, (B,), generator=ctx.generator, device=ctx.device)
        k = torch.randint(kl, kh + 1, (B,), generator=ctx.generator, device=ctx.device)
        return d, k

    def next(self, ctx: DecodeContext, d: torch.Tensor, k: torch.Tensor, accepted: torch.Tensor,
             n_old: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(d, k) of the next tree from the previous tree's scheduled (d, k), its accepted draft
        tokens (bonus excluded) and the ``count`` tokens it committed from grid index ``n_old``."""
        m = self.m
        width = self.dtab.shape[1]
        j = torch.arange(self.max_depth + 1, device=ctx.device)
        idx = (n_old[:, None] + j).clamp_max(width - 1)
        write = j[None, :] < count[:, None]
        self.dtab.scatter_(1, idx, torch.where(write, d[:, None], self.dtab.gather(1, idx)))
        self.ktab.scatter_(1, idx, torch.where(write, k[:, None], self.ktab.gather(1, idx)))
        n = ctx.n  # the next tree drafts grid index n; its left neighbour n - 1 came from this tree
        if m.init == "horizontal":
            d0, k0 = d, k
        elif m.init == "vertical":  # the token above is one grid row back in the stream: its row end(s) included
            stride = ctx.layout.stride
            up = (n - stride).clamp_min(0)[:, None]
            d_up, k_up = self.dtab.gather(1, up).squeeze(1), self.ktab.gather(1, up).squeeze(1)
            have = (n >= stride) & (d_up > 0)
            d0, k0 = torch.where(have, d_up, d), torch.where(have, k_up, k)
        else:
            d0, k0 = self._random(ctx)
        tau = accepted + 1  # acceptance length including the bonus token
        good = tau.float() >= m.beta * d.float()  # alpha = tau / d >= beta
        d_raw = torch.where(good, d0 + m.depth_step, d0 - m.depth_step)
        k_new = torch.where(d_raw > 1, torch.where(good, k0 - m.topk_step, k0 + m.topk_step), k0)
        return d_raw.clamp(*self.dlim), k_new.clamp(*self.klim)


# ---------------------------------------------------------------- the three steps of a round
def _log_draft(logits: torch.Tensor, ctx: DecodeContext, at: torch.Tensor) -> torch.Tensor:
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


def _stable_top(key: torch.Tensor, valid: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the n best entries per row: valid before invalid, then by key (descending),
    ties by position (stable)."""
    key = torch.where(valid, key, torch.full_like(key, float("-inf")))
    order = torch.sort(key, dim=1, descending=True, stable=True).indices
    first = torch.sort(valid.gather(1, order).to(torch.uint8), dim=1, descending=True, stable=True).indices
    return order.gather(1, first)[:, :n]


def _rows(ctx: DecodeContext, t: torch.Tensor) -> torch.Tensor:
    """Per-row tensor for both CFG halves of the drafter / target rows."""
    return torch.cat([t, t]) if ctx.target.cfg else t


def catch_up(ctx: DecodeContext, pending: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One drafter forward over the ``count`` tokens committed last round (target features ``pending``),
    committed to the drafter cache; returns the root's predicted feature (R, 1, Dm), which predicts
    depth 1, and the draft log-law of depth 1 (B, V) (``_log_draft``)."""
    drafter, dev, n = ctx.drafter, ctx.device, ctx.n
    m = pending.shape[1]
    pos = (n - count)[:, None] + torch.arange(m, device=dev)
    toks = ctx.tokens.gather(1, pos.clamp_max(ctx.tokens.shape[1] - 1))
    logits, feats = drafter.forward_tokens(_rows(ctx, toks), pending, _rows(ctx, pos))
    drafter.commit(_rows(ctx, count))
    last = _rows(ctx, (count - 1).clamp_min(0))[:, None]
    return rows_at(feats, last), _log_draft(rows_at(logits, last), ctx, n[:, None])[:, 0]


def build_tree(ctx: DecodeContext, pending: torch.Tensor, count: torch.Tensor, d_row: torch.Tensor,
               k_row: torch.Tensor, D: int, K: int, total_tokens: int) -> Tree:
    """Drafter catch-up on the ``count`` tokens committed last round (target features ``pending``),
    then the EAGLE-2 tree of per-row depth ``d_row`` <= D and width ``k_row`` <= K, reranked to
    ``total_tokens - 1`` nodes (EAGLE-2, Sec. 4: expand by top-k, rerank by cumulative draft log-prob)."""
    drafter, dev = ctx.drafter, ctx.device
    B = ctx.n.shape[0]
    n = ctx.n
    Dm = pending.shape[-1]

    root_feat, root_lp = catch_up(ctx, pending, count)

    # candidates pool, depth by depth
    rank = torch.arange(K, device=dev)
    score, tok = root_lp.topk(K, dim=-1)
    valid = (rank[None] < k_row[:, None]) & (score > float("-inf"))
    pool_tok, pool_score, pool_valid = [tok], [score], [valid]
    pool_par = [torch.full_like(tok, -1)]
    pool_depth = [torch.ones_like(tok)]
    pool_rank = [rank[None].expand(B, -1)]
    exp_pool, exp_tok, exp_score, exp_valid = rank[None].expand(B, -1), tok, score, valid
    exp_feat = root_feat.expand(-1, K, -1)
    anc = torch.eye(K, dtype=torch.bool, device=dev)[None].expand(B, -1, -1)
    eye = anc
    offset = K
    for d in range(2, D + 1):
        lg, f = drafter.forward_tokens(_rows(ctx, exp_tok), exp_feat, _rows(ctx, (n + d - 2)[:, None].expand(-1, K)),
                                       _rows(ctx, anc), start=(d - 2) * K)
        cs, ct = _log_draft(lg, ctx, (n + d - 1)[:, None].expand(-1, K)).topk(K, dim=-1)  # (B, K, K)
        c_score = (exp_score[:, :, None] + cs).flatten(1)
        c_valid = (exp_valid[:, :, None] & (rank[None, None] < k_row[:, None, None]) & (cs > float("-inf"))
                   & (d <= d_row)[:, None, None]).flatten(1)
        c_tok = ct.flatten(1)
        pool_tok.append(c_tok)
        pool_score.append(c_score)
        pool_valid.append(c_valid)
        pool_par.append(exp_pool[:, :, None].expand(-1, -1, K).flatten(1))
        pool_depth.append(torch.full_like(c_tok, d))
        pool_rank.append(rank[None, None].expand(B, K, -1).flatten(1))
        if d < D:
            sel = _stable_top(c_score, c_valid, K)  # (B, K) of K*K
            parent = sel // K
            exp_pool, exp_tok, exp_score = offset + sel, c_tok.gather(1, sel), c_score.gather(1, sel)
            exp_valid = c_valid.gather(1, sel) & (rank[None] < k_row[:, None])
            exp_feat = f.gather(1, _rows(ctx, parent)[:, :, None].expand(-1, -1, Dm))
            anc = torch.cat([anc.gather(1, parent[:, :, None].expand(-1, -1, anc.shape[2])), eye], dim=2)
        offset += K * K

    # rerank: the best total_tokens - 1 nodes, parents first
    p_tok, p_score, p_valid = torch.cat(pool_tok, 1), torch.cat(pool_score, 1), torch.cat(pool_valid, 1)
    p_par, p_depth, p_rank = torch.cat(pool_par, 1), torch.cat(pool_depth, 1), torch.cat(pool_rank, 1)
    N = min(total_tokens - 1, p_tok.shape[1])
    sel = _stable_top(p_score, p_valid, N)  # (B, N) pool indices, parents first
    s_tok, s_par, s_valid = p_tok.gather(1, sel), p_par.gather(1, sel), p_valid.gather(1, sel)
    s_depth, s_rank = p_depth.gather(1, sel), p_rank.gather(1, sel)
    inv = torch.full_like(p_tok, -1).scatter(1, sel, torch.arange(1, N + 1, device=dev)[None].expand(B, -1))
    s_ppos = torch.where(s_par < 0, torch.zeros_like(s_par), inv.gather(1, s_par.clamp_min(0)))
    s_valid = s_valid & (s_ppos >= 0)
    s_ppos = torch.where(s_valid, s_ppos, torch.zeros_like(s_ppos))
    T = N + 1
    parent_all = torch.cat([torch.zeros_like(n)[:, None], s_ppos], 1)  # (B, T); root is its own parent
    eyeT = torch.eye(T, dtype=torch.bool, device=dev)[None].expand(B, -1, -1)
    mask = eyeT
    for _ in range(D):
        mask = eyeT | mask.gather(1, parent_all[:, :, None].expand(-1, -1, T))
    children = torch.full((B, T * K + 1), -1, dtype=torch.long, device=dev)
    slot = torch.where(s_valid, s_ppos * K + s_rank, torch.full_like(s_rank, T * K))
    children.scatter_(1, slot, torch.arange(1, T, device=dev)[None].expand(B, -1))
    children = children[:, :-1].view(B, T, K)

    # padding nodes (fewer valid nodes than N) hang off the root: position n, like their mask says
    s_depth = torch.where(s_valid, s_depth, torch.ones_like(s_depth))
    tokens = torch.cat([ctx.tokens.gather(1, (n - 1)[:, None]), s_tok], 1)
    positions = (n - 1)[:, None] + torch.cat([torch.zeros_like(n)[:, None], s_depth], 1)
    depth = torch.where(s_valid, s_depth, torch.zeros_like(s_depth)).amax(1)
    return Tree(tokens, positions, mask, children, depth, D)


def compact(ctx: DecodeContext, verdict: Verdict, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Commit the verdict (root-path tokens + the residual token; the target keeps root + path) and
    return the committed counts and the target features (R, m, Dm) of root + path, which the drafter
    lacks next round."""
    count = ctx.accept(verdict)
    return count, rows_at(ctx.target.hidden, _rows(ctx, verdict.slots(m)))


def _decode_trees(ctx: DecodeContext, name: str, total_tokens: int, shape, build=None, drafter_extra: int | None = None) -> None:
    """The round loop of every tree method. ``build(ctx, pending, count, d_row, k_row, D, K, total_tokens)``
    makes the round's ``Tree`` (default ``build_tree``); ``drafter_extra``: uncommitted drafter cache
    slots it needs (default: the EAGLE-2 pool's)."""
    drafter, target, rule = ctx.drafter, ctx.target, ctx.rule
    if drafter is None:
        raise ValueError(f"method {name} needs an EAGLE drafter (drafter=...)")
    if build is None and not hasattr(rule, "sibling"):
        raise ValueError(f"acceptance rule {getattr(rule, 'name', rule)!r} has no sibling rule for draft trees")
    drafter.attach(target.model)
    _tree_rounds(ctx, name, total_tokens, shape, build, drafter_extra)


def _tree_rounds(ctx: DecodeContext, name: str, total_tokens: int, shape, build, drafter_extra: int | None) -> None:
    drafter, target, gen = ctx.drafter, ctx.target, ctx.generator
    dev, V, L = ctx.device, ctx.V, ctx.L
    Dmax, Kmax = shape.max_depth, min(shape.max_top_k, V)
    extra = Dmax + 2 + Dmax * Kmax if drafter_extra is None else drafter_extra
    drafter.setup_cache(2 * target.batch if target.cfg else target.batch, extra=extra)
    depth_sum = torch.zeros((), dtype=torch.long, device=dev)
    sched_sum = torch.zeros((), dtype=torch.long, device=dev)
    depth_cnt = torch.zeros((), dtype=torch.long, device=dev)

    x0 = sample(target.prefill(), gen)
    count = ctx.commit(x0[:, None], torch.ones_like(ctx.n))
    pending = target.hidden[:, None]  # (R, m, Dm): target features of the tokens the drafter lacks
    d_row, k_row = shape.first(ctx)

    def round_(count: torch.Tensor, pending: torch.Tensor, d_row: torch.Tensor, k_row: torch.Tensor,
               D: int, K: int, draws: tuple[int, int] | None = None) -> tuple[torch.Tensor, ...]:
        active = ctx.n < L
        n_old = ctx.n.clone()
        tree = (build or build_tree)(ctx, pending, count, d_row, k_row, D, K, total_tokens)
        depth_sum.add_((tree.depth * active).sum())
        sched_sum.add_((d_row * active).sum())
        depth_cnt.add_(active.sum())
        p = target.forward(tree.tokens, tree.positions, tree.mask)  # (B, T, V)
        verdict = ctx.verify(p, tree if draws is None else replace(tree, draws=draws))
        count, pending = compact(ctx, verdict, tree.tokens.shape[1] if verdict.keep is None else verdict.keep.shape[1])
        return (count, pending, *shape.next(ctx, d_row, k_row, verdict.accepted, n_old, count))

    if shape.static:  # one tree shape (ADT: the maximal one, rows masked to their schedule); after the
        # first round (one feature per row) every round is alike
        D = shape.levels
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
        draws = (min(total_tokens - 1, Kmax + (shape.levels - 1) * Kmax * Kmax) + 1, Kmax)
        while True:
            done, D, K = torch.stack([(ctx.n >= L).all().long(), d_row.max(), k_row.max()]).tolist()
            if done:
                break
            count, pending, d_row, k_row = round_(count, pending, d_row, k_row, D, min(K, V), draws)

    cnt = max(int(depth_cnt), 1)
    ctx.record(TreeStats(mean_tree_depth=float(depth_sum) / cnt, mean_scheduled_depth=float(sched_sum) / cnt))
