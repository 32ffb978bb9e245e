"""Plain autoregressive sampling: one target forward per token (the reference law)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..options import Options
from .base import DecodeContext
from .ordered import reveal_rounds
from .verdicts import Verdict


@dataclass(frozen=True)
class AR(Options):
    """x_i ~ p(. | c, x_<i), one cached target forward per token. The target's law samples itself
    (``laws.DiscreteLaw`` or ``laws.ContinuousLaw``), so the same rounds decode token ids and
    continuous tokens. A model that reveals its tokens in its own order (MAR) runs its own sampler
    (``ordered.reveal_rounds``)."""

    name = "ar"
    lossless = True
    acceptance = None
    pad = 1
    refills = True  # continuous batching (methods/slots.py): a restarted row goes on from its first token

    def decode(self, ctx: DecodeContext) -> None:
        if ctx.target.ordered is not None:
            reveal_rounds(ctx)
        else:
            sample_prefix(ctx, ctx.L)


def sample_prefix(ctx: DecodeContext, tokens: int) -> None:
    """Commit the first ``tokens`` stream tokens drawn from the target alone: token 0 from the prefill's
    law, then one forward per token feeding the last one (exactly ``tokens - 1`` rounds, no done-check:
    every row advances by one a round)."""
    x = ctx.target.prefill().sample(ctx.generator)  # the last committed token, updated in place
    ctx.accept(Verdict.sampled(x))

    def round_() -> None:
        law = ctx.target.forward(x[:, None], (ctx.n - 1)[:, None])
        x.copy_(law[:, 0].sample(ctx.generator))
        ctx.accept(Verdict.sampled(x))

    def restart(fresh, _law) -> None:  # token ids only: continuous-token models run no queue
        x.copy_(torch.where(fresh, ctx.tokens[:, 0], x))

    ctx.run(round_, rounds=tokens - 1, refill=restart)
