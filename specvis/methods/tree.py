"""EAGLE-2 dynamic draft trees (Li et al. 2024) and ADT-Tree adjacency-adaptive trees, batched.

One round per target forward, every row with its own tree and its own accepted length:

1. Drafter catch-up: the tokens committed by the last round are fed to the EAGLE head with the
   target's true features (its cache then holds every committed token); the last one is the root.
2. Tree: depth by depth, the top-k children of each expanded node (by draft probability of the
   guided drafter logits) join a candidate pool scored by cumulative log-probability; the top-k
   candidates of each depth are expanded by one drafter forward over that depth (tree mask). The pool
   is reranked and the best ``total_tokens - 1`` nodes form the tree. A stable sort on the pool laid
   out depth by depth keeps every parent ahead of its children, so the tree is ancestor-closed.
3. One target forward over root + tree with the tree mask and per-node grid positions.
4. Verification with the rule's ``sibling(p, x)``: at a node, children are tried in draft-rank order,
   each accepted with the rule's alpha against the current residual (Exact: p(x); on rejection zero
   it and renormalise); an accepted child continues the walk, else the next token is drawn from the
   residual (from p at a leaf). Candidates depend only on the committed prefix, so with ``Exact`` the
   output law is exactly the target's. Every node's sibling walk runs in parallel (a loop over rank);
   the path is then followed with one gather per depth.
5. ``ctx.commit``; the target keeps root + accepted path with one ``keep_block``.

Tree building loops over depth only; there is no Python loop over nodes, rows or vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..accept import Exact, normalise
from ..sampling import sample, uniform
from .base import DecodeContext

INITS = ("horizontal", "vertical", "random")


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
    """ADT-Tree: each tree's (depth, top_k) starts from the left (``horizontal``) or upper
    (``vertical``) neighbour's tree or uniformly at random (``random``), then moves by one bisection
    step: acceptance rate (accepted / depth of the previous tree) >= ``beta``: deeper by ``depth_step``
    and narrower by ``topk_step``, else shallower and wider; clamped to the ranges."""

    init: str = "horizontal"
    beta: float = 1.0
    depth_step: int = 1
    topk_step: int = 3
    depth_range: tuple[int, int] = (1, 10)
    topk_range: tuple[int, int] = (3, 14)
    total_tokens: int = 60
    acceptance: object = field(default_factory=Exact)
    name = "adt"

    def __post_init__(self) -> None:
        if self.init not in INITS:
            raise ValueError(f"ADTTree.init must be one of {', '.join(INITS)}, got {self.init!r}")
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not self.beta > 0:
            raise ValueError(f"ADTTree.beta must be a number > 0, got {self.beta!r}")
        _check_int("ADTTree", "depth_step", self.depth_step, 0)
        _check_int("ADTTree", "topk_step", self.topk_step, 0)
        _check_int("ADTTree", "total_tokens", self.total_tokens, 2)
        for name in ("depth_range", "topk_range"):
            value = getattr(self, name)
            ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value)
            if not ok or not 1 <= value[0] <= value[1]:
                raise ValueError(f"ADTTree.{name} must be two integers 1 <= low <= high, got {value!r}")
            object.__setattr__(self, name, tuple(value))

    def decode(self, ctx: DecodeContext) -> None:
        _decode_trees(ctx, self.name, self.total_tokens, _Adaptive(self, ctx))


# ---------------------------------------------------------------- tree shapes per round
class _Fixed:
    """Same (depth, top_k) for every tree; shapes known without a host sync."""

    def __init__(self, depth: int, top_k: int) -> None:
        self.max_depth, self.max_top_k = depth, top_k
        self.static = True

    def first(self, ctx: DecodeContext) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full_like(ctx.n, self.max_depth), torch.full_like(ctx.n, self.max_top_k)

    def next(self, ctx: DecodeContext, d: torch.Tensor, k: torch.Tensor, accepted: torch.Tensor,
             n_old: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return d, k


class _Adaptive:
    """ADT-Tree schedule: per-position record of the tree that committed each token, adjacent
    initialisation and bisection adaptation, all per row on the device."""

    def __init__(self, m: ADTTree, ctx: DecodeContext) -> None:
        self.m = m
        self.max_depth, self.max_top_k = m.depth_range[1], m.topk_range[1]
        self.static = False
        shape = ctx.tokens.shape
        self.dtab = torch.zeros(shape, dtype=torch.long, device=ctx.device)
        self.ktab = torch.zeros(shape, dtype=torch.long, device=ctx.device)

    def first(self, ctx: DecodeContext) -> tuple[torch.Tensor, torch.Tensor]:
        (dl, dh), (kl, kh) = self.m.depth_range, self.m.topk_range
        if self.m.init == "random":
            return self._random(ctx)
        return torch.full_like(ctx.n, (dl + dh) // 2), torch.full_like(ctx.n, (kl + kh) // 2)

    def _random(self, ctx: DecodeContext) -> tuple[torch.Tensor, torch.Tensor]:
        (dl, dh), (kl, kh) = self.m.depth_range, self.m.topk_range
        B = ctx.n.shape[0]
        d = torch.randint(dl, dh + 1, (B,), generator=ctx.generator, device=ctx.device)
        k = torch.randint(kl, kh + 1, (B,), generator=ctx.generator, device=ctx.device)
        return d, k

    def next(self, ctx: DecodeContext, d: torch.Tensor, k: torch.Tensor, accepted: torch.Tensor,
             n_old: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.m
        width = self.dtab.shape[1]
        j = torch.arange(int(m.depth_range[1]) + 1, device=ctx.device)
        idx = (n_old[:, None] + j).clamp_max(width - 1)
        write = j[None, :] < count[:, None]
        self.dtab.scatter_(1, idx, torch.where(write, d[:, None], self.dtab.gather(1, idx)))
        self.ktab.scatter_(1, idx, torch.where(write, k[:, None], self.ktab.gather(1, idx)))
        n = ctx.n  # the next tree drafts grid index n; its left neighbour n - 1 came from this tree
        if m.init == "horizontal":
            d0, k0 = d, k
        elif m.init == "vertical":
            up = n - ctx.layout.width
            have = up >= 0
            d0 = torch.where(have, self.dtab.gather(1, up.clamp_min(0)[:, None]).squeeze(1), d)
            k0 = torch.where(have, self.ktab.gather(1, up.clamp_min(0)[:, None]).squeeze(1), k)
        else:
            d0, k0 = self._random(ctx)
        good = accepted.float() >= m.beta * d.float()  # alpha = accepted / depth >= beta
        d_raw = torch.where(good, d0 + m.depth_step, d0 - m.depth_step)
        k_new = torch.where(d_raw > 1, torch.where(good, k0 - m.topk_step, k0 + m.topk_step), k0)
        return d_raw.clamp(*m.depth_range), k_new.clamp(*m.topk_range)


# ---------------------------------------------------------------- the shared loop
def _log_draft(logits: torch.Tensor, ctx: DecodeContext) -> torch.Tensor:
    """Draft ranking scores: log-softmax of the guided drafter logits at the sampling temperature
    (temperature 1 when greedy, so alternatives to the argmax keep their order)."""
    s = ctx.target.sampling
    guided = s.guide(*logits.chunk(2)) if ctx.target.cfg else logits
    t = s.temperature if s.temperature > 0 else 1.0
    return torch.log_softmax(guided / t, dim=-1)


def _stable_top(key: torch.Tensor, valid: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the n best entries per row: valid before invalid, then by key (descending),
    ties by position (stable)."""
    key = torch.where(valid, key, torch.full_like(key, float("-inf")))
    order = torch.sort(key, dim=1, descending=True, stable=True).indices
    first = torch.sort(valid.gather(1, order).to(torch.uint8), dim=1, descending=True, stable=True).indices
    return order.gather(1, first)[:, :n]


def _decode_trees(ctx: DecodeContext, name: str, total_tokens: int, shape) -> None:
    drafter, target, rule, gen = ctx.drafter, ctx.target, ctx.rule, ctx.generator
    if drafter is None:
        raise ValueError(f"method {name} needs an EAGLE drafter (drafter=...)")
    if not hasattr(rule, "sibling"):
        raise ValueError(f"acceptance rule {getattr(rule, 'name', rule)!r} has no sibling rule for draft trees")
    drafter.attach(target.model)
    dev, B, V, L = ctx.device, target.batch, ctx.layout.vocab_size, ctx.L
    cfg = target.cfg

    def rows(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t]) if cfg else t

    R = 2 * B if cfg else B
    Dmax, Kmax = shape.max_depth, min(shape.max_top_k, V)
    drafter.setup_cache(R, extra=Dmax + 2 + Dmax * Kmax)
    n_draft = 0
    depth_sum = torch.zeros((), dtype=torch.long, device=dev)
    depth_cnt = torch.zeros((), dtype=torch.long, device=dev)

    x0 = sample(target.prefill(), gen)
    count = ctx.commit(x0[:, None], torch.ones_like(ctx.n))
    pending = target.hidden[:, None]  # (R, m, Dm): target features of the tokens the drafter lacks
    d_row, k_row = shape.first(ctx)
    while True:
        if shape.static:
            if ctx.done():
                break
            D, K = Dmax, Kmax
        else:
            done, D, K = torch.stack([(ctx.n >= L).all().long(), d_row.max(), k_row.max()]).tolist()
            if done:
                break
            K = min(K, V)
        n = ctx.n.clone()
        active = n < L
        depth_sum += (d_row * active).sum()
        depth_cnt += active.sum()
        Dm = pending.shape[-1]

        # 1. drafter catch-up on the last committed tokens; the root's feature predicts depth 1
        m = pending.shape[1]
        pos = (n - count)[:, None] + torch.arange(m, device=dev)
        toks = ctx.tokens.gather(1, pos.clamp_max(ctx.tokens.shape[1] - 1))
        logits, feats = drafter.forward_tokens(rows(toks), pending, rows(pos))
        drafter.commit(rows(count))
        n_draft += 1
        last = rows((count - 1).clamp_min(0))[:, None, None]
        root_feat = feats.gather(1, last.expand(-1, 1, Dm))  # (R, 1, Dm)
        root_lp = _log_draft(logits.gather(1, last.expand(-1, 1, V)), ctx)[:, 0]  # (B, V)

        # 2. the tree: candidates pool, depth by depth
        rank = torch.arange(K, device=dev)
        score, tok = root_lp.topk(K, dim=-1)
        valid = rank[None] < k_row[:, None]
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
            lg, f = drafter.forward_tokens(rows(exp_tok), exp_feat, rows((n + d - 2)[:, None].expand(-1, K)),
                                           rows(anc), start=(d - 2) * K)
            n_draft += 1
            cs, ct = _log_draft(lg, ctx).topk(K, dim=-1)  # (B, K, K)
            c_score = (exp_score[:, :, None] + cs).flatten(1)
            c_valid = (exp_valid[:, :, None] & (rank[None, None] < k_row[:, None, None])
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
                exp_feat = f.gather(1, rows(parent)[:, :, None].expand(-1, -1, Dm))
                anc = torch.cat([anc.gather(1, parent[:, :, None].expand(-1, -1, anc.shape[2])), eye], dim=2)
            offset += K * K
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

        # 3. one target forward over root + tree
        tree_tok = torch.cat([ctx.tokens.gather(1, (n - 1)[:, None]), s_tok], 1)
        tree_pos = (n - 1)[:, None] + torch.cat([torch.zeros_like(n)[:, None], s_depth], 1)
        p = target.forward(tree_tok, tree_pos, mask)  # (B, T, V)

        # 4. sibling walks at every node in parallel, then follow the accepted path
        c_tok = tree_tok.gather(1, children.clamp_min(0).flatten(1)).view(B, T, K)
        c_ok = children >= 0
        outcome = torch.full((B, T), -1, dtype=torch.long, device=dev)
        for r in range(K):
            alpha, residual = rule.sibling(p, c_tok[..., r])
            live = c_ok[..., r] & (outcome < 0)
            acc = live & (uniform((B, T), p, gen) < alpha)
            outcome = torch.where(acc, r, outcome)
            p = torch.where((live & ~acc)[..., None], normalise(residual, p), p)
        final = sample(p, gen)  # (B, T): residual draw at every node (p itself at a leaf)
        acc_child = torch.where(outcome >= 0, children.gather(2, outcome.clamp_min(0)[..., None]).squeeze(-1),
                                torch.full_like(outcome, -1))
        cur = torch.zeros_like(n)
        alive = torch.ones_like(active)
        accepted = torch.zeros_like(n)
        path = []
        for _ in range(D):
            nxt = acc_child.gather(1, cur[:, None]).squeeze(1)
            ok = alive & (nxt >= 0)
            path.append(torch.where(ok, nxt, torch.zeros_like(nxt)))
            cur, alive, accepted = torch.where(ok, nxt, cur), ok, accepted + ok.long()
        path = torch.stack(path, 1)  # (B, D) tree positions of the accepted nodes (0 beyond)
        z = final.gather(1, cur[:, None])
        block = torch.cat([tree_tok.gather(1, path), z], 1).scatter(1, accepted[:, None], z)
        n_old = ctx.n.clone()
        count = ctx.commit(block, accepted + 1)

        # 5. caches: the target keeps root + path; the drafter gets their features next round
        keep = torch.cat([torch.zeros_like(n)[:, None], path], 1)
        target.keep_block(keep, count)
        pending = target.hidden.gather(1, rows(keep)[:, :, None].expand(-1, -1, Dm))
        d_row, k_row = shape.next(ctx, d_row, k_row, accepted, n_old, count)

    ctx.extra["draft_forwards"] = n_draft
    ctx.extra["mean_tree_depth"] = float(depth_sum) / max(int(depth_cnt), 1)
