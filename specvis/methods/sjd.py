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

Jacobi is the greedy special case with the deterministic criterion: a draft is accepted while it
equals the argmax computed from the previous drafts (token equality), and the new drafts are the
argmaxes (a Jacobi fixed-point iteration). Its output is greedy AR token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..accept import Exact, verify_chain
from ..sampling import sample
from .base import DecodeContext

INITS = ("random", "horizontal-repeat", "vertical-repeat", "horizontal-sample", "vertical-sample")


def _check_window(cls: str, window) -> None:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"{cls}.window must be an integer >= 1, got {window!r}")


@dataclass(frozen=True)
class Jacobi:
    """Deterministic Jacobi decoding with a sliding window of ``window`` tokens; greedy only."""

    window: int = 16
    name = "jacobi"
    lossless = True
    acceptance = None

    def __post_init__(self) -> None:
        _check_window("Jacobi", self.window)

    @property
    def pad(self) -> int:
        return self.window + 2

    def decode(self, ctx: DecodeContext) -> None:
        if not ctx.target.sampling.greedy:
            raise ValueError("method jacobi needs greedy sampling (temperature=0); use SJD to sample")
        target, W, gen = ctx.target, self.window, ctx.generator
        V = ctx.layout.vocab_size
        B = ctx.n.shape[0]
        x0 = target.prefill().argmax(-1)
        ctx.commit(x0[:, None], torch.ones_like(ctx.n))
        j = torch.arange(W, device=ctx.device)
        draft = torch.randint(V, (B, W), device=ctx.device, generator=gen)  # random init (paper, Fig. 3)

        def round_() -> None:
            n = ctx.n.clone()
            feed = torch.cat([ctx.tokens.gather(1, (n - 1)[:, None]), draft], 1)
            guess = target.forward(feed, ctx.positions(n - 1, W + 1)).argmax(-1)  # (B, W + 1)
            accepted = (draft == guess[:, :W]).long().cumprod(-1).sum(-1)  # converged prefix
            ctx.commit(guess, accepted + 1)  # guess[:, accepted] follows a converged prefix: exact
            target.set_committed(ctx.n - 1)
            src = accepted[:, None] + 1 + j  # slot j of the new window is position n + src
            fresh = torch.randint(V, (B, W), device=ctx.device, generator=gen)
            draft.copy_(torch.where(src <= W, guess.gather(1, src.clamp_max(W)), fresh))

        ctx.run(round_)


@dataclass(frozen=True)
class SJD:
    """Speculative Jacobi decoding: a ``window`` of self-drafted tokens verified by ``acceptance``
    (any rule of ``specvis.accept``), initialised by ``init`` (see module docstring), refined by
    eq. 3 when ``refine`` (else re-initialised: the paper's App. F ablation)."""

    window: int = 16
    init: str = "random"
    refine: bool = True
    acceptance: object = field(default_factory=Exact)
    name = "sjd"

    def __post_init__(self) -> None:
        _check_window("SJD", self.window)
        if self.init not in INITS:
            raise ValueError(f"SJD.init must be one of {', '.join(INITS)}, got {self.init!r}")
        if not isinstance(self.refine, bool):
            raise ValueError(f"SJD.refine must be a bool, got {self.refine!r}")
        if not hasattr(self.acceptance, "lossless"):
            raise ValueError(f"SJD.acceptance must be an acceptance rule, got {self.acceptance!r}")

    @property
    def lossless(self) -> bool:
        return self.acceptance.lossless

    @property
    def pad(self) -> int:
        return self.window + 2

    def decode(self, ctx: DecodeContext) -> None:
        target, W, gen, rule = ctx.target, self.window, ctx.generator, ctx.rule
        win = _Initialiser(ctx, W, self.init)
        p0 = target.prefill()
        x0 = sample(p0, gen)
        ctx.commit(x0[:, None], torch.ones_like(ctx.n))
        draft, q = win.next_window(p0[:, None], base=ctx.n - 1, start=ctx.n, first_init=ctx.n)  # updated in place

        def round_() -> None:
            n = ctx.n.clone()
            feed = torch.cat([ctx.tokens.gather(1, (n - 1)[:, None]), draft], 1)
            p = target.forward(feed, ctx.positions(n - 1, W + 1))  # p[:, j]: law of position n + j
            accepted, nxt = verify_chain(rule, p, q, draft, gen, soft=ctx.target.soft)
            block = torch.cat([draft, nxt[:, None]], 1).scatter(1, accepted[:, None], nxt[:, None])
            ctx.commit(block, accepted + 1)
            target.set_committed(ctx.n - 1)
            start = n + accepted + 1  # the new window's first position (finished rows: don't care)
            first_init = n + W + 1 if self.refine else start  # refined slots lie in [start, first_init)
            new_draft, new_q = win.next_window(p, base=n, start=start, first_init=first_init)
            draft.copy_(new_draft)
            q.copy_(new_q)

        ctx.run(round_)


class _Initialiser:
    """Builds the next Jacobi window (tokens (B, W) and the laws they were drawn from (B, W, V)),
    vectorised over rows and slots: refined slots draw from the target laws, initialised slots
    follow the init scheme, repeat schemes then copy their source token (point-mass law)."""

    def __init__(self, ctx: DecodeContext, window: int, init: str) -> None:
        self.ctx, self.W, self.init = ctx, window, init
        self.V, self.width = ctx.layout.vocab_size, ctx.layout.width
        dev = ctx.device
        self.slots = torch.arange(window, device=dev)
        self.uniform = torch.full((self.V,), 1.0 / self.V, device=dev)
        self.ring = None
        if init == "vertical-sample":  # laws of the last width + W positions per row
            self.R = self.width + window
            self.ring = torch.zeros(ctx.n.shape[0], self.R, self.V, device=dev)

    def _ring_write(self, pos: torch.Tensor, laws: torch.Tensor) -> None:
        idx = (pos % self.R)[..., None].expand(-1, -1, self.V)
        self.ring.scatter_(1, idx, laws)

    def next_window(self, p: torch.Tensor, base: torch.Tensor, start: torch.Tensor,
                    first_init: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``p`` (B, K, V): target laws of positions base .. base+K-1 (committed or refinable).
        The window covers start .. start+W-1; slots before ``first_init`` are refined from ``p``,
        the others initialised. Returns (draft (B, W), q (B, W, V))."""
        ctx, W, V, width = self.ctx, self.W, self.V, self.width
        K = p.shape[1]
        pos = start[:, None] + self.slots  # (B, W) grid positions of the window slots
        s = first_init[:, None]
        refined = pos < s
        p_ref = p.gather(1, (pos - base[:, None]).clamp(0, K - 1)[..., None].expand(-1, -1, V))
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
                left = p.gather(1, (first_init - 1 - base).clamp(0, K - 1)[:, None, None].expand(-1, 1, V))
                q_init = torch.where(from_head[..., None], self.uniform, left)
        else:  # vertical: walk up by rows to the first position before the initialised run
            k = torch.div(pos - s, width, rounding_mode="floor") + 1
            up = pos - k * width
            from_head = up < 0  # the run reaches the first row, whose slot is a random head
            src = torch.where(from_head, up + width, up)
            head = pos < width
            if self.init == "vertical-sample":
                above = self.ring.gather(1, (src % self.R)[..., None].expand(-1, -1, V))
                q_init = torch.where(from_head[..., None], self.uniform, above)
        if self.init.endswith("repeat"):
            q_init = self.uniform  # heads draw uniformly; the others copy below

        q = torch.where(refined[..., None], p_ref, q_init)
        draft = sample(q, ctx.generator)
        if self.init.endswith("repeat"):
            tokens = ctx.tokens.gather(1, src.clamp(0, ctx.tokens.shape[1] - 1))
            in_window = draft.gather(1, (src - start[:, None]).clamp(0, W - 1))
            copied = torch.where(src >= start[:, None], in_window, tokens)
            copy = ~refined & ~head
            draft = torch.where(copy, copied, draft)
            point = torch.zeros_like(q).scatter_(-1, draft[..., None], 1.0)
            q = torch.where(copy[..., None], point, q)
        if self.ring is not None:
            self._ring_write(pos, q)
        return draft, q
