"""A round as a typed value: a proposal (``Chain`` or ``Tree``) goes in, a ``Verdict`` comes out.

Every drafting method's round is: draft a proposal, score it with one target forward (laws ``p``),
``ctx.verify(p, proposal)`` (the acceptance rule's chain or tree walk, below), then
``ctx.accept(verdict)`` (commit the verdict's block and roll the target cache back to what the
committed tokens need, ``DecodeContext.accept``). A method whose criterion is not an acceptance rule
(Jacobi's token equality, a 2-D method's accept-prefix rows) builds its ``Verdict`` itself.

Stream positions: a proposal's tokens sit after each row's committed prefix (``Chain``: n, n + 1, ...;
``Tree``: the root is the last committed token at n - 1, a node at depth j at n - 1 + j). A verdict's
block is written there, or at the stream positions ``Verdict.at`` gives (committed tokens that are not
a prefix of the stream: MAR's order, several image rows in flight).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..accept import ChainWalk, normalise, verify_chain
from ..sampling import sample, uniform


@dataclass(frozen=True)
class Chain:
    """Drafts at consecutive stream positions after the committed prefix, fed after the last committed
    token in one target forward (so ``p`` has one more position than the chain: the bonus law)."""

    tokens: torch.Tensor  # (B, g)
    laws: torch.Tensor | None  # (B, g, V) the law each draft was drawn from


@dataclass(frozen=True)
class Tree:
    """One round's draft tree; position 0 is the root (the last committed token), 1.. the nodes."""

    tokens: torch.Tensor  # (B, T)
    positions: torch.Tensor  # (B, T) stream positions (root: n - 1, node at depth j: n - 1 + j)
    mask: torch.Tensor  # (B, T, T) bool, node attends to itself and its ancestors
    children: torch.Tensor  # (B, T, K) tree positions of each node's children by draft rank, -1 none
    depth: torch.Tensor  # (B,) deepest selected node (the drafted tree's depth)
    levels: int  # D, the deepest level any row may reach (path length bound)
    laws: torch.Tensor | None = None  # (B, T, V) sampled trees (StaticTree): the draft law q each node's
    # children were drawn from without replacement; None: deterministic candidates (EAGLE-2, ADT)
    draws: tuple[int, int] | None = None  # draw random numbers as for a tree of (T', K') (``verify_tree``)


@dataclass(frozen=True)
class Verdict:
    """The outcome of a verification: what to commit and what the target cache keeps.

    ``block[:, :count]`` is committed (``count`` None: ``accepted + 1``, the accepted drafts then the
    residual or bonus token), at each row's next stream positions or at ``at``. The target keeps the
    fed-block slots ``keep[:, :count]`` (moved to the block's start, ``keep_block``); ``keep`` None: the
    fed chain's own first ``count`` slots, in place (``set_committed``)."""

    accepted: torch.Tensor  # (B,) accepted drafts (bonus excluded)
    block: torch.Tensor  # (B, m) token ids, or (B, m, C) continuous tokens
    keep: torch.Tensor | None = None  # (B, m') fed-block slots the target cache keeps
    count: torch.Tensor | None = None  # (B,) tokens of the block to commit (None: accepted + 1)
    at: torch.Tensor | None = None  # (B, m) stream positions of the block's tokens (None: the rows' next)

    @classmethod
    def sampled(cls, x: torch.Tensor) -> Verdict:
        """One token per row drawn from the target's law (no draft): commit it."""
        return cls(torch.zeros(x.shape[0], dtype=torch.long, device=x.device), x[:, None])

    @property
    def committed(self) -> torch.Tensor:
        """Tokens per row the verdict commits (before finished rows are cut off)."""
        return self.accepted + 1 if self.count is None else self.count

    def slots(self, m: int) -> torch.Tensor:
        """(B, m) fed-block slots of the committed tokens' inputs (the root, then the accepted path;
        0 beyond): ``keep``, or for an in-place chain slots 0 .. accepted."""
        if self.keep is not None:
            return self.keep
        j = torch.arange(m, device=self.accepted.device)[None]
        return torch.where(j <= self.accepted[:, None], j, torch.zeros_like(j))


def verify_chain_rule(rule, p: torch.Tensor, chain: Chain, generator: torch.Generator | None,
                      soft: torch.Tensor | None = None, length: torch.Tensor | None = None,
                      bonus: bool | torch.Tensor = True) -> Verdict:
    """The rule's chain walk (``accept.verify_chain``): p (B, g + 1, V) the target laws after the last
    committed token and each draft; ``length`` (B,) the drafts fed per row (None: all), ``bonus`` which
    rows commit the next token (``verify_chain``). The verdict: ``chain_verdict``."""
    return chain_verdict(chain.tokens, verify_chain(rule, p, chain.laws, chain.tokens, generator, soft=soft,
                                                    length=length, bonus=bonus))


def chain_verdict(tokens: torch.Tensor, walk: ChainWalk) -> Verdict:
    """The block of a chain walk over drafts ``tokens`` (B, g): the accepted drafts, then the next token
    (the residual draw at the first rejection, else the bonus draw), committed per ``walk.count``."""
    accepted, nxt = walk.accepted, walk.next
    block = torch.cat([tokens, nxt[:, None]], 1).scatter(1, accepted[:, None], nxt[:, None])
    return Verdict(accepted, block, count=walk.count)


def verify_tree(rule, tree: Tree, p: torch.Tensor, generator: torch.Generator | None,
                soft: torch.Tensor | None = None, draws: tuple[int, int] | None = None) -> Verdict:
    """Multi-candidate verification (EAGLE-2 / SpecInfer): the sibling walk of every node in
    parallel against the target laws ``p`` (B, T, V) of the tree nodes, then the accepted path.
    Deterministic candidates (``tree.laws`` None) use ``rule.sibling(p, x)``; children sampled from
    ``tree.laws`` without replacement (StaticTree) use ``rule.sibling_q(p, q, x)``, which also returns
    the law the next sibling was drawn from.
    ``soft`` (B, T, V), the temperature-1 target laws of the same nodes for rules that need them
    (greedy LANTERN), goes unchanged to every sibling try. Draws: one uniform (B, T) per rank, then
    one sample of the residuals. ``draws=(T', K')`` (T' >= T, K' >= K; default ``tree.draws``): draw as
    for a tree of T' positions and K' ranks and use the first T x K, so that a tree which is a prefix
    of a padded one (ADT-Tree's host-synced rounds, see ``ADTTree``) reads the same random numbers."""
    if tree.laws is not None and tree.children.shape[-1] == 1:  # a sampled chain (StaticTree, one child per node)
        return _verify_path(rule, tree, p, generator, soft)
    B, T, K = tree.children.shape
    draws = tree.draws if draws is None else draws
    Td, Kd = (T, K) if draws is None else draws
    children = tree.children
    kw = {} if soft is None else {"soft": soft}
    c_tok = tree.tokens.gather(1, children.clamp_min(0).flatten(1)).view(B, T, K)
    c_ok = children >= 0
    outcome = torch.full((B, T), -1, dtype=torch.long, device=p.device)
    q = tree.laws
    for r in range(K):
        if q is None:
            alpha, residual = rule.sibling(p, c_tok[..., r], **kw)
        else:  # children sampled from q without replacement: the rule updates q too (Exact.sibling_q)
            alpha, residual, q_next = rule.sibling_q(p, q, c_tok[..., r], **kw)
        live = c_ok[..., r] & (outcome < 0)
        acc = live & (uniform((B, Td), p, generator)[:, :T] < alpha)
        outcome = torch.where(acc, r, outcome)
        rejected = (live & ~acc)[..., None]
        p = torch.where(rejected, normalise(residual, p), p)
        if q is not None:
            q = torch.where(rejected, q_next, q)
    for _ in range(K, Kd):  # the padded ranks' draws
        uniform((B, Td), p, generator)
    # (B, T): residual draw at every node (p itself at a leaf); padded positions draw from zeros
    final = sample(p if Td == T else torch.nn.functional.pad(p, (0, 0, 0, Td - T)), generator)[:, :T]
    acc_child = torch.where(outcome >= 0, children.gather(2, outcome.clamp_min(0)[..., None]).squeeze(-1),
                            torch.full_like(outcome, -1))
    cur = torch.zeros(B, dtype=torch.long, device=p.device)
    alive = torch.ones(B, dtype=torch.bool, device=p.device)
    accepted = torch.zeros_like(cur)
    path = []
    for _ in range(tree.levels):
        nxt = acc_child.gather(1, cur[:, None]).squeeze(1)
        ok = alive & (nxt >= 0)
        path.append(torch.where(ok, nxt, torch.zeros_like(nxt)))
        cur, alive, accepted = torch.where(ok, nxt, cur), ok, accepted + ok.long()
    path = torch.stack(path, 1)
    z = final.gather(1, cur[:, None])
    block = torch.cat([tree.tokens.gather(1, path), z], 1).scatter(1, accepted[:, None], z)
    return Verdict(accepted, block, keep=torch.cat([torch.zeros_like(accepted)[:, None], path], 1))


def _verify_path(rule, tree: Tree, p: torch.Tensor, generator: torch.Generator | None,
                 soft: torch.Tensor | None) -> Verdict:
    """A sampled chain (StaticTree with one child per node, so tree position = depth): the sibling
    walk is then the chain rule at every node, i.e. speculative sampling of the path drawn from
    ``tree.laws``, so it is verified by ``verify_chain`` (one uniform per node; the residual normalised
    and sampled only where the walk stops, instead of at every node): the same law, fewer operations.
    The path's nodes sit at tree positions 1, 2, ...: kept in place (``keep`` None)."""
    D = tree.levels
    return verify_chain_rule(rule, p, Chain(tree.tokens[:, 1:], tree.laws[:, :D]), generator, soft)
