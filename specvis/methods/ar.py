"""Plain autoregressive sampling: one target forward per token (the reference law)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..options import Options
from .base import DecodeContext
from .proposer import Proposer, decode_chain
from .ordered import reveal_rounds
from .verdicts import Chain


@dataclass(frozen=True)
class AR(Options):
    """x_i ~ p(. | c, x_<i), one cached target forward per token (under keyed noise by the race
    argmax p / E(s, i), ``DecodeContext.draw``). The target's law samples itself
    (``laws.DiscreteLaw`` or ``laws.ContinuousLaw``), so the same rounds decode token ids and
    continuous tokens. A model that reveals its tokens in its own order (MAR) runs its own sampler
    (``ordered.reveal_rounds``)."""

    name = "ar"
    lossless = True
    acceptance = None
    pad = 1
    refills = True  # continuous batching (methods/slots.py): a restarted row goes on from its first token
    model_order = True  # a MAR model's own order: ``ordered.reveal_rounds``

    def decode(self, ctx: DecodeContext) -> None:
        if ctx.target.ordered is not None:
            reveal_rounds(ctx)
        else:
            sample_prefix(ctx, ctx.L)


class Sampler(Proposer):
    """No drafts: each round draws the next token from the target's law after the last committed one
    (``DecodeContext.verify`` of an empty chain), so every row advances by one a round."""

    def propose(self, ctx: DecodeContext, n: torch.Tensor) -> Chain:
        return Chain(ctx.tokens[:, :0], None)


def sample_prefix(ctx: DecodeContext, tokens: int) -> None:
    """Commit the first ``tokens`` stream tokens drawn from the target alone: token 0 from the prefill's
    law, then one forward per token feeding the last one (exactly ``tokens - 1`` rounds, no done-check:
    every row advances by one a round)."""
    decode_chain(ctx, Sampler(), rounds=tokens - 1)
