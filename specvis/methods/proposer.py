"""A drafter is a proposer: the one loop every chain method runs (``decode_chain``) and what a method brings
to it (``Proposer``: the drafts of each round, and the state they need).

A round feeds each row's last committed token and a ``Chain`` of drafts at the next stream positions
in one target forward, verifies the chain with the bound acceptance rule (``DecodeContext.verify``, the
rule's chain walk ``accept.verify_chain``) and commits the verdict (``DecodeContext.accept``). AR is the
proposer of no drafts (the round draws one token), speculative decoding the draft model's, SJD and
Jacobi a window's; the server's auto method switches between AR's and SJD's every round. The 2-D
methods (ZipAR, PJD: several image rows in flight) share ``decode_rows`` the same way (``RowProposer``).
"""

from __future__ import annotations

from typing import Any

import torch

from .base import DecodeContext
from .laws import DiscreteLaw
from .verdicts import Chain, Verdict


class Proposer:
    """What a chain method brings to the shared loop (``decode_chain``): each round a ``Chain`` of drafts at
    the stream positions after each row's committed prefix, with the law each was drawn from. The loop
    feeds the last committed token and the drafts in one target forward, verifies (``verify``: the bound
    rule's chain walk), commits, then tells the proposer (``observe``). Per-decode state (a Jacobi window,
    the draft model's cache) lives on the proposer, in tensors updated in place, so that a round captured
    as a CUDA graph replays it. The defaults: no state, first token drawn from the prefill's law."""

    capturable = True  # rounds of fixed shapes with no host reads (``DecodeContext.run``: CUDA graphs)
    warmup = False  # the first round has other shapes than the rest: it runs once, eagerly, before them

    def first(self, ctx: DecodeContext, law: Any) -> Verdict:
        """Token 0 from the prefill's ``law``: a draw (under keyed noise, its race)."""
        return Verdict.sampled(ctx.draw(law, ctx.n))

    def start(self, ctx: DecodeContext, law: Any) -> None:
        """After token 0 is committed: set up the proposer's state (``law``: the prefill's)."""

    def propose(self, ctx: DecodeContext, n: torch.Tensor) -> Chain:
        """The round's drafts after each row's ``n`` committed tokens (no drafts: the round draws one token)."""
        raise NotImplementedError

    def verify(self, ctx: DecodeContext, p: Any, chain: Chain) -> Verdict:
        """The verdict on ``chain`` given the target laws ``p`` after the last token and each draft: the
        bound rule's walk (``DecodeContext.verify``); no drafts: a draw from the law after the last token."""
        if chain.tokens.shape[1] == 0:
            return Verdict.sampled(ctx.draw(p[:, 0], ctx.n))
        return ctx.verify(p, chain)

    def observe(self, ctx: DecodeContext, n: torch.Tensor, p: Any, verdict: Verdict) -> None:
        """After the verdict is committed (rows had ``n`` tokens before it): update the state."""

    def restart(self, ctx: DecodeContext, fresh: torch.Tensor, law: DiscreteLaw) -> None:
        """Rows ``fresh`` (B,) restarted by continuous batching with a new sample, whose token 0 (committed)
        was drawn from ``law``: reset their state (``DecodeContext.run``'s ``refill``)."""


def decode_chain(ctx: DecodeContext, proposer: Proposer, rounds: int | None = None) -> None:
    """Every chain method's loop: prefill, commit token 0, then rounds of propose -> one target forward
    over the last committed token and the drafts -> verify -> accept -> observe, until every row is done
    (or exactly ``rounds`` rounds); continuous batching restarts rows through ``proposer.restart``."""
    law = ctx.target.prefill()
    ctx.accept(proposer.first(ctx, law))
    proposer.start(ctx, law)

    def round_() -> None:
        n = ctx.n.clone()
        chain = proposer.propose(ctx, n)
        p = ctx.target.forward(fed(ctx, n, chain.tokens), ctx.positions(n - 1, chain.tokens.shape[1] + 1))
        verdict = proposer.verify(ctx, p, chain)
        ctx.accept(verdict)
        proposer.observe(ctx, n, p, verdict)

    if proposer.warmup and not ctx.done():
        round_()
    ctx.run(round_, rounds=rounds, capture=proposer.capturable,
            refill=lambda fresh, law: proposer.restart(ctx, fresh, law))


def fed(ctx: DecodeContext, n: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """What a chain round feeds: each row's last committed token (stream position n - 1; a continuous
    token (B, 1, C) where the target's tokens are continuous), then its drafts (B, g)."""
    if ctx.latents is not None:
        return ctx.latents.gather(1, (n - 1)[:, None, None].expand(-1, 1, ctx.latents.shape[-1]))
    last = ctx.tokens.gather(1, (n - 1)[:, None])
    return last if drafts.shape[1] == 0 else torch.cat([last, drafts], 1)


class RowProposer:
    """What a 2-D method (several image rows in flight, ``rows2d.Rows``) brings to the rows loop
    (``decode_rows``): per image row a chain of ``v`` tokens to feed (its last committed token, then
    ``v - 1`` drafts), then the verdict on what the target's laws say of them."""

    def propose(self, ctx: DecodeContext, rows: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(v (B, H) tokens each row feeds, drafts (B, H, g) or None)."""
        raise NotImplementedError

    def settle(self, ctx: DecodeContext, rows: Any, block: Any, law: Any) -> None:
        """Verify the fed ``block`` against the target's ``law`` and commit (``Rows.commit``)."""
        raise NotImplementedError

    def restart(self, ctx: DecodeContext, rows: Any, fresh: torch.Tensor) -> None:
        """Samples ``fresh`` (B,) restarted by continuous batching: their rows from the start."""
        rows.restart(fresh)


def decode_rows(ctx: DecodeContext, rows: Any, proposer: RowProposer) -> None:
    """Every 2-D method's loop: prefill, commit token 0 (a draw from the prefill's law: under keyed noise
    its race, as AR's), then rounds of propose -> one target forward over every active row's chain
    (``Rows.block``) -> settle, until every row is done; the rows' statistics are recorded. Rounds read
    the host (row schedules): not captured."""
    ctx.accept(Verdict.sampled(ctx.draw(ctx.target.prefill(), ctx.n)))
    rows.start()

    def round_() -> None:
        rows.begin_round()
        v, drafts = proposer.propose(ctx, rows)
        block = rows.block(v, drafts)
        law = ctx.target.forward(block.tokens, block.positions, block.mask)
        proposer.settle(ctx, rows, block, law)

    ctx.run(round_, capture=False, refill=lambda fresh, _law: proposer.restart(ctx, rows, fresh))
    ctx.record(rows.stats())
