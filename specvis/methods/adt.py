"""ADT-Tree adjacency-adaptive draft trees (Lei et al., paper 002), batched: ``ADTTree`` and its
schedule. Each row's tree depth d-hat and width k-hat start from the tree that committed an adjacent
token and adapt by bisection on the previous tree's acceptance rate (``AdaptiveSchedule``); the trees
themselves are EAGLE-2's (``eagle.EagleBuilder``), run by the shared loop (``trees.decode_trees``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..accept import AcceptanceRule, rule_option
from ..options import option
from .base import DecodeContext
from .eagle import EagleBuilder
from .trees import TreeMethod, decode_trees

INITS = ("horizontal", "vertical", "random")


@dataclass(frozen=True)
class ADTTree(TreeMethod):
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
    are clamped into the interval; ``random`` draws uniformly from its integers. (0, 10) admits depth
    1; the authors' public code has no schedule that settles the lower bound otherwise.

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

    init: str = option("horizontal", choices=INITS, help="where each tree's depth and width start: the tree that "
                                                         "committed the left (horizontal) or upper (vertical) neighbour, "
                                                         "or random")
    beta: float = option(1.0, low=0, high=1000, open_low=True, help="acceptance-rate threshold: at least beta, deeper and "
                                                         "narrower; else shallower and wider (eq. 2)")
    depth_step: int = option(1, low=0, high=1024, help="depth change per tree (l_d)")
    topk_step: int = option(3, low=0, high=1024, help="width (top-k) change per tree (l_k)")
    depth_range: tuple[int, int] = option((0, 10), low=0, stream=True,
                                          help="open interval (d_min, d_max) of the depth; low + 2 <= high")
    topk_range: tuple[int, int] = option((3, 14), low=0, high=1024,
                                         help="open interval (k_min, k_max) of the width; low + 2 <= high")
    total_tokens: int = option(60, low=2, high=4096, help="tokens per target forward, the root included (the tree's size)")
    acceptance: AcceptanceRule = rule_option()
    static_shapes: bool | None = option(None, help="build every round at one fixed shape (capturable); none: on "
                                                   "CUDA only")
    name = "adt"

    def check(self) -> None:
        for name in ("depth_range", "topk_range"):
            low, high = getattr(self, name)
            if not low <= high - 2:
                raise ValueError(f"ADTTree.{name} must be an open interval (low, high) of integers with "
                                 f"0 <= low and at least one integer inside (low + 2 <= high), got {(low, high)!r}")

    def decode(self, ctx: DecodeContext) -> None:
        static = ctx.device.type == "cuda" if self.static_shapes is None else self.static_shapes
        decode_trees(ctx, self.name, self.total_tokens, AdaptiveSchedule(self, ctx, static=static),
                     EagleBuilder(self.total_tokens))


class AdaptiveSchedule:
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
