"""LANTERN++ static draft trees (Park et al. 2025, arXiv 2502.06352), batched.

A fixed topology, given as paths like EAGLE/Medusa "choices" (``[[0], [1], [0, 0], ...]``: path
``[i, j]`` is the j-th child of the root's i-th child), is expanded every round whatever the drafter's
confidence. Each node's children are *sampled* from the drafter's law q at that node without
replacement: child 0 ~ q, child 1 ~ q with child 0 removed and renormalised, ... The siblings are
then verified one by one with the multi-draft recursive rejection (SpecInfer; Exact.sibling_q):

    try child r with min(1, p(x_r) / q_r(x_r)); on rejection p <- norm(max(0, p - q_r)) and
    q_{r+1} <- q_r with x_r removed and renormalised; after every child is rejected (or at a leaf)
    the next token is drawn from the current p.

With one child per node (the ``chain`` preset) this walk is speculative sampling of the drafted path, and it is
run as such (``round._verify_path``: the residual normalised only where the walk stops).

This differs from EagleTree, whose candidates are deterministic (the drafter's top-k) and are
verified with ``sibling(p, x)`` (accept with p(x), zero x).

Exactness (with ``Exact``). Fix a node with committed context c, target law p = p(. | c), and k
children drawn as above from q. Claim: the token the node emits has law p, for every k >= 0 and
every q. Induction on k. k = 0: it is drawn from p. k >= 1: child 1 is x with probability q(x) and
is accepted with min(1, p(x)/q(x)), so P(emit y and child 1 accepted) = min(p(y), q(y)). Given
x_1 = x and its rejection, the remaining k - 1 children are drawn without replacement from q_x = q
with x removed and renormalised, independently of the acceptance coin, and the walk goes on with
target law p' = norm(max(0, p - q)), which does not depend on x: by the induction hypothesis
(applied to the pair (p', q_x); if q_x is empty no further child is drawn and the k = 0 case
applies) the emitted token then has law p'. The rejection probability is
sum_x q(x) (1 - min(1, p(x)/q(x))) = 1 - sum_y min(p(y), q(y)) = sum_y max(0, p(y) - q(y)), so
P(emit y) = min(p(y), q(y)) + max(0, p(y) - q(y)) = p(y). (If p = q the rejection probability is 0
and p' never matters.) An accepted child x continues the walk at x; its own children were drawn
from the drafter's law at context (c, x) with randomness independent of everything at the parent,
and the number of children depends only on x's rank, so the same claim holds at x given (c, x):
the emitted tokens along the path have, position by position, the target's conditional laws, i.e.
the output is exactly distributed as ancestral sampling from the target. Which q the drafter
produces (here softmax of the guided drafter logits at the sampling temperature, temperature 1 when
greedy, without top-k/top-p) only changes speed. Under greedy sampling p is a point mass at the
argmax a: x = a is accepted (p(a)/q(a) >= 1), any other x is rejected and the residual stays the
point mass at a, so the output equals greedy AR.

Forced stream positions (row ends): the drafter's law there is the point mass at the structural id
(``trees.log_draft``), so child 0 is that id and no further child can be drawn (the remaining law is
empty): a node at a forced position has one child whatever the topology says, and the subtrees of
the missing children are not verified (the shapes stay static, their slots are padding).

Rounds have static shapes (the topology fixes every tensor shape), so they are captured like
EagleTree's fixed trees; the only host sync is ``ctx.done()``. One drafter forward for the catch-up
and one per depth below the deepest level; one target forward per round.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ..accept import AcceptanceRule, rule_option, without
from ..options import option
from ..noise import race
from ..sampling import sample
from .base import DecodeContext
from .verdicts import Tree
from .trees import FixedSchedule, TreeMethod, TreeSchedule, catch_up, cfg_rows, decode_trees, log_draft

# Topologies of the official LANTERN code (jadohu/LANTERN, models/drafters/choices.py), by its names;
# the default is its default ``--tree_choices``.
PRESETS: dict[str, tuple[tuple[int, ...], ...]] = {
    "mc_sim_7b_63": (
        (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1)),
    "mc_sim_7b_63_balanced": (
        (0,), (1,), (2,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1)),
    "naive_extend_57": (
        (0,), (1,), (2,), (3,), (4,),
        (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (4, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3), (0, 1, 0), (0, 1, 1), (0, 1, 2), (0, 2, 0), (0, 2, 1),
        (0, 2, 2), (0, 3, 0), (0, 3, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (2, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 3), (0, 0, 1, 0), (0, 0, 1, 1), (0, 0, 1, 2),
        (0, 0, 2, 0), (0, 0, 2, 1), (0, 0, 3, 0), (0, 1, 0, 0), (0, 1, 0, 1), (0, 1, 1, 0), (0, 2, 0, 0),
        (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 2), (0, 0, 0, 1, 0), (0, 0, 0, 1, 1), (0, 0, 1, 0, 0),
        (0, 0, 1, 0, 1), (0, 0, 1, 1, 0), (0, 0, 2, 0, 0)),
    "medusa_2_7b_63": (
        (0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,), (8,), (9,),
        (0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 6), (0, 7), (0, 8), (0, 9), (1, 0), (1, 1), (1, 2),
        (1, 3), (1, 4), (2, 0), (2, 1), (3, 0), (3, 1), (4, 0), (5, 0), (6, 0), (7, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3), (0, 0, 4), (0, 0, 5), (0, 0, 6), (0, 0, 7), (0, 0, 8),
        (0, 1, 0), (0, 1, 1), (0, 1, 2), (0, 1, 3), (0, 2, 0), (0, 2, 1), (0, 3, 0), (0, 4, 0), (0, 5, 0),
        (1, 0, 0), (1, 0, 1), (1, 0, 2), (1, 1, 0), (2, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 3), (0, 0, 1, 0), (0, 0, 2, 0), (0, 1, 0, 0)),
    "reverse_balanced_25": (
        (0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (1, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 1, 0), (0, 0, 1, 1),
        (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 2), (0, 0, 0, 0, 3), (0, 0, 0, 1, 0), (0, 0, 0, 1, 1),
        (0, 0, 0, 1, 2)),
    "chain": ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0)),
}


def tree_paths(tree) -> tuple[tuple[int, ...], ...]:
    """The paths of ``tree`` (a preset name or a list of paths), checked: non-empty paths of integers
    >= 0, no repeats, every proper prefix present and each node's children ranked 0, 1, ..., c - 1.
    Sorted by (depth, path): parents before children, each level contiguous."""
    if isinstance(tree, str):
        if tree not in PRESETS:
            raise ValueError(f"StaticTree.tree: unknown preset {tree!r}; choose from {', '.join(PRESETS)} "
                             "or give a list of paths like [[0], [1], [0, 0]] (in a spec or flag: 0/1/0.0)")
        return PRESETS[tree]
    bad = f"StaticTree.tree must be a preset name ({', '.join(PRESETS)}) or a non-empty list of paths like [[0], [1], [0, 0]]"
    if not isinstance(tree, (list, tuple)) or not tree:
        raise ValueError(f"{bad}, got {tree!r}")
    paths = []
    for path in tree:
        if (not isinstance(path, (list, tuple)) or not path
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in path)):
            raise ValueError(f"{bad}; path {path!r} is not a non-empty list of integers >= 0")
        paths.append(tuple(path))
    if len(set(paths)) != len(paths):
        raise ValueError(f"StaticTree.tree: a path is given twice in {tree!r}")
    have = set(paths)
    for path in paths:
        if len(path) > 1 and path[:-1] not in have:
            raise ValueError(f"StaticTree.tree: path {list(path)} has no parent {list(path[:-1])}")
        if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in have:
            raise ValueError(f"StaticTree.tree: path {list(path)} has no elder sibling {list(path[:-1] + (path[-1] - 1,))} "
                             "(children are ranked 0, 1, ... in draw order)")
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


class Topology:
    """Index tables of a topology (tree position 0 is the root, 1.. the paths in (depth, path) order)."""

    def __init__(self, paths: tuple[tuple[int, ...], ...], device: torch.device) -> None:
        index = {(): 0, **{p: i + 1 for i, p in enumerate(paths)}}
        T = len(paths) + 1
        self.T, self.D = T, max(len(p) for p in paths)
        self.K = max(p[-1] for p in paths) + 1
        parent = [0] + [index[p[:-1]] for p in paths]
        depth = [0] + [len(p) for p in paths]
        children = torch.full((T, self.K), -1, dtype=torch.long)
        for p in paths:
            children[index[p[:-1]], p[-1]] = index[p]
        anc = torch.eye(T, dtype=torch.bool)
        for t in range(1, T):  # parents come first
            anc[t] |= anc[parent[t]]
        self.depth = torch.tensor(depth, device=device)
        self.children = children.to(device)
        self.anc = anc.to(device)
        # level j: its tree positions (contiguous: first[j]..last[j]); for the draws of the children of
        # level j, per rank r: which level-j nodes have an r-th child (cols) and its position
        self.first = [min(t for t in range(T) if depth[t] == j) for j in range(self.D + 1)]
        self.last = [max(t for t in range(T) if depth[t] == j) for j in range(self.D + 1)]
        self.draws = []
        for j in range(self.D):
            nodes = [t for t in range(T) if depth[t] == j]
            ranks = []
            for r in range(self.K):
                cols = [i for i, t in enumerate(nodes) if children[t, r] >= 0]
                if cols:
                    ranks.append((torch.tensor(cols, device=device),
                                  torch.tensor([int(children[nodes[i], r]) for i in cols], device=device)))
            self.draws.append(ranks)
        # for level j >= 1: index of each node's parent within level j - 1
        self.parent_index = [None] + [torch.tensor([parent[t] - self.first[j - 1] for t in range(T) if depth[t] == j],
                                                   device=device) for j in range(1, self.D + 1)]


MAX_NODES = 4095  # a topology's nodes: tokens per target forward, the root aside (EAGLE's total_tokens bound)


@dataclass(frozen=True)
class StaticTree(TreeMethod):
    """LANTERN++ static tree (see the module docstring): ``tree`` a preset name of the official code
    (``PRESETS``; default its default, mc_sim_7b_63) or a list of paths; children sampled from the
    drafter's law without replacement and verified by the rule's ``sibling_q`` (``Exact``: lossless).
    Needs ``drafter=`` (an EagleDrafter). ``acceptance=Lantern(budget="relative", lam=...)`` is LANTERN++
    (its bound: ``BoundLantern.sibling_q``); rules without ``sibling_q`` (GSD) are refused."""

    tree: str | tuple[tuple[int, ...], ...] = option(
        "mc_sim_7b_63", choices=tuple(PRESETS), low=0, high=1023,
        help="the topology: a preset of the official LANTERN code, or paths split by '/' with a path's ranks joined "
             "by '.' (0/1/0.0: [0], [1], [0, 0])")
    acceptance: AcceptanceRule = rule_option()
    name = "static-tree"
    walk = "sampled-tree"  # children drawn without replacement: the rule's sibling_q(p, q, x)

    def check(self) -> None:
        if len(tree_paths(self.tree)) > MAX_NODES:  # parents and elder siblings present, no path twice
            raise ValueError(f"StaticTree.tree has {len(tree_paths(self.tree))} nodes, more than the {MAX_NODES} "
                             "a tree may have (tokens per target forward)")

    @cached_property
    def paths(self) -> tuple[tuple[int, ...], ...]:
        return tree_paths(self.tree)

    @property
    def total_tokens(self) -> int:
        """Tokens per target forward: the root and every node of the topology."""
        return len(self.paths) + 1

    def decode(self, ctx: DecodeContext) -> None:
        topo = Topology(self.paths, ctx.device)
        decode_trees(ctx, self.name, self.total_tokens, FixedSchedule(topo.D, topo.K), StaticBuilder(topo))


class StaticBuilder:
    """The topology sampled level by level (``build_static_tree``) as a ``trees.TreeBuilder``."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo

    def drafter_slots(self, ctx: DecodeContext, schedule: TreeSchedule) -> int:
        """One block per level below the root, plus the catch-up's."""
        return self.topo.D + 2 + self.topo.T

    def build(self, ctx: DecodeContext, state) -> Tree:
        return build_static_tree(ctx, state.pending, state.count, self.topo)


def build_static_tree(ctx: DecodeContext, pending: torch.Tensor, count: torch.Tensor, topo: Topology) -> Tree:
    """Drafter catch-up, then the topology level by level: one drafter forward over the nodes of each
    level (tree mask, one block of the drafter's uncommitted region per level) gives their children's
    draft law q; each node's children are drawn from q without replacement, rank by rank. A child that
    cannot be drawn (its parent is missing, or q has no mass left: a forced position after its
    structural id) is missing, and so is its subtree. Returns the tree with ``laws`` = q per node."""
    drafter, gen, n = ctx.drafter, ctx.generator, ctx.n
    B, T = n.shape[0], topo.T
    root_feat, root_lp = catch_up(ctx, pending, count)
    tokens = torch.zeros(B, T, dtype=torch.long, device=n.device)
    tokens[:, 0] = ctx.tokens.gather(1, (n - 1)[:, None])[:, 0]
    present = torch.ones(B, T, dtype=torch.bool, device=n.device)
    laws = torch.zeros(B, T, root_lp.shape[-1], dtype=root_lp.dtype, device=n.device)
    feat = root_feat  # (R, m, Dm): predicted features of the current level's nodes
    for d in range(1, topo.D + 1):  # draw the children (depth d) of the level d - 1 nodes
        first, last = topo.first[d - 1], topo.last[d - 1]
        level = slice(first, last + 1)  # the level's tree positions are contiguous
        if d == 1:
            lq = root_lp[:, None]
        else:  # the level's slots in the drafter's uncommitted region: first - 1 .. last - 1
            pos = (n + d - 2)[:, None].expand(-1, last + 1 - first)  # stream positions of the level's nodes
            mask = topo.anc[level, 1: last + 1][None].expand(B, -1, -1)
            lg, f_out = drafter.forward_tokens(cfg_rows(ctx, tokens[:, level]), feat, cfg_rows(ctx, pos),
                                               cfg_rows(ctx, mask), start=first - 1)
            lq = log_draft(lg, ctx, pos + 1)
        q = lq.exp()  # (B, m, V): the draft law of each level node's children
        laws[:, level] = q
        live = present[:, level]
        ranks = topo.draws[d - 1]
        # keyed noise: the children's position n - 1 + d races, so rank r is the r-th of q / E (Gumbel-top-k)
        noise = None if ctx.keyed is None else ctx.keyed.noise((n + d - 1)[:, None].expand(-1, q.shape[1]))
        for r, (cols, slots) in enumerate(ranks):  # rank by rank
            x = sample(q, gen) if noise is None else race(q, noise)  # (B, m)
            tokens[:, slots] = x[:, cols]
            present[:, slots] = live[:, cols]
            if r + 1 < len(ranks):  # the next sibling is drawn from q without x, if q has mass left
                live = live & (q.scatter(-1, x[..., None], 0.0).sum(-1) > 1e-12)
                q = without(q, x)
        if d < topo.D:  # predicted features of the depth-d nodes: their parents' drafter outputs
            src = root_feat if d == 1 else f_out
            feat = src.index_select(1, topo.parent_index[d])
    children = torch.where(present.gather(1, topo.children.clamp_min(0).flatten()[None].expand(B, -1)).view(B, T, -1)
                           & (topo.children >= 0), topo.children, torch.full_like(topo.children, -1))
    positions = (n - 1)[:, None] + topo.depth[None]
    depth = torch.where(present, topo.depth[None], torch.zeros_like(topo.depth[None])).amax(1)
    mask = topo.anc[None].expand(B, -1, -1)
    return Tree(tokens, positions, mask, children, depth, topo.D, laws=laws)

