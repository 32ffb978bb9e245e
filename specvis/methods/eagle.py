"""EAGLE-2 dynamic draft trees (Li et al. 2024), batched: ``EagleTree`` and its builder.

Each round (``trees.decode_trees``) the drafter catches up on the tokens committed last round; the last
one is the root. Then depth by depth, the top-k children of each expanded node (by draft probability
of the guided drafter logits) join a candidate pool scored by cumulative log-probability; the top-k
candidates of each depth are expanded by one drafter forward over that depth (tree mask). The pool is
reranked and the best ``total_tokens - 1`` nodes form the tree. A stable sort on the pool laid out
depth by depth keeps every parent ahead of its children, so the tree is ancestor-closed. Tree
building loops over depth only; there is no Python loop over nodes, rows or vocabulary.

Verification (``round.verify_tree``) uses the rule's ``sibling(p, x, soft=...)``: at a node, children
are tried in draft-rank order, each accepted with the rule's alpha against the current residual
(Exact: p(x); on rejection zero it and renormalise); an accepted child continues the walk, else the
next token is drawn from the residual (from p at a leaf). Candidates depend only on the committed
prefix, so with ``Exact`` the output law is exactly the target's. ADT-Tree (``adt.py``) drafts with
the same builder at per-row depths and widths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..accept import AcceptanceRule, rule_option
from ..options import option
from .base import DecodeContext
from .verdicts import Tree
from .trees import (FixedSchedule, TreeMethod, TreeRound, TreeSchedule, catch_up, cfg_rows, decode_trees,
                    log_draft)


@dataclass(frozen=True)
class EagleTree(TreeMethod):
    """EAGLE-2 dynamic tree: ``depth`` draft levels, ``top_k`` children per expanded node,
    ``total_tokens`` tokens per target forward (root included). Needs ``drafter=`` (an EagleDrafter)."""

    depth: int = option(5, low=1, stream=True, help="draft levels per tree")
    top_k: int = option(10, low=1, high=1024, flag="tree-top-k", help="children per expanded node, and nodes expanded per level "
                                                           "(--top-k is the sampling top-k)")
    total_tokens: int = option(60, low=2, high=4096, help="tokens per target forward, the root included (the tree's size)")
    acceptance: AcceptanceRule = rule_option()
    name = "eagle"

    def decode(self, ctx: DecodeContext) -> None:
        decode_trees(ctx, self.name, self.total_tokens, FixedSchedule(self.depth, self.top_k), EagleBuilder(self.total_tokens))


class EagleBuilder:
    """The EAGLE-2 expansion and rerank (``build_tree``) as a ``trees.TreeBuilder``: trees of at most
    ``total_tokens`` tokens (root included) at each row's scheduled depth and width."""

    def __init__(self, total_tokens: int) -> None:
        self.total_tokens = total_tokens

    def drafter_slots(self, ctx: DecodeContext, schedule: TreeSchedule) -> int:
        """The candidate pool's: K per expanded level, plus the catch-up's."""
        D, K = schedule.max_depth, min(schedule.max_top_k, ctx.V)
        return D + 2 + D * K

    def build(self, ctx: DecodeContext, state: TreeRound) -> Tree:
        return build_tree(ctx, state, self.total_tokens)


def stable_top(key: torch.Tensor, valid: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the n best entries per row: valid before invalid, then by key (descending),
    ties by position (stable)."""
    key = torch.where(valid, key, torch.full_like(key, float("-inf")))
    order = torch.sort(key, dim=1, descending=True, stable=True).indices
    first = torch.sort(valid.gather(1, order).to(torch.uint8), dim=1, descending=True, stable=True).indices
    return order.gather(1, first)[:, :n]



def build_tree(ctx: DecodeContext, state: TreeRound, total_tokens: int) -> Tree:
    """Drafter catch-up on the tokens committed last round (``state.pending``, ``state.count``), then
    the EAGLE-2 tree of per-row depth ``state.depth`` <= D and width ``state.top_k`` <= K, reranked to
    ``total_tokens - 1`` nodes (EAGLE-2, Sec. 4: expand by top-k, rerank by cumulative draft log-prob)."""
    drafter, dev = ctx.drafter, ctx.device
    B = ctx.n.shape[0]
    n = ctx.n
    d_row, k_row, D, K = state.depth, state.top_k, state.levels, state.width
    Dm = state.pending.shape[-1]

    root_feat, root_lp = catch_up(ctx, state.pending, state.count)

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
        lg, f = drafter.forward_tokens(cfg_rows(ctx, exp_tok), exp_feat, cfg_rows(ctx, (n + d - 2)[:, None].expand(-1, K)),
                                       cfg_rows(ctx, anc), start=(d - 2) * K)
        cs, ct = log_draft(lg, ctx, (n + d - 1)[:, None].expand(-1, K)).topk(K, dim=-1)  # (B, K, K)
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
            sel = stable_top(c_score, c_valid, K)  # (B, K) of K*K
            parent = sel // K
            exp_pool, exp_tok, exp_score = offset + sel, c_tok.gather(1, sel), c_score.gather(1, sel)
            exp_valid = c_valid.gather(1, sel) & (rank[None] < k_row[:, None])
            exp_feat = f.gather(1, cfg_rows(ctx, parent)[:, :, None].expand(-1, -1, Dm))
            anc = torch.cat([anc.gather(1, parent[:, :, None].expand(-1, -1, anc.shape[2])), eye], dim=2)
        offset += K * K

    # rerank: the best total_tokens - 1 nodes, parents first
    p_tok, p_score, p_valid = torch.cat(pool_tok, 1), torch.cat(pool_score, 1), torch.cat(pool_valid, 1)
    p_par, p_depth, p_rank = torch.cat(pool_par, 1), torch.cat(pool_depth, 1), torch.cat(pool_rank, 1)
    N = min(total_tokens - 1, p_tok.shape[1])
    sel = stable_top(p_score, p_valid, N)  # (B, N) pool indices, parents first
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
