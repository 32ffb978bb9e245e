"""Plain autoregressive sampling: one target forward per image token (the reference law)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import sample
from .base import DecodeContext
from .round import Verdict


@dataclass(frozen=True)
class AR:
    """x_i ~ p(. | c, x_<i), one cached target forward per token."""

    name = "ar"
    lossless = True
    acceptance = None
    pad = 1

    def decode(self, ctx: DecodeContext) -> None:
        if getattr(ctx.target.model, "token_dim", None) is not None:
            # Continuous-token target: plain sampling is CSpD with every token pre-filled (target only).
            from .cspd import CSpD

            CSpD(prefill=1.0).decode(ctx)
            ctx.record(None)
            return
        x = sample(ctx.target.prefill(), ctx.generator)  # the last committed token, updated in place
        ctx.accept(Verdict.sampled(x))

        def round_() -> None:
            law = ctx.target.forward(x[:, None], (ctx.n - 1)[:, None])
            x.copy_(sample(law[:, 0], ctx.generator))
            ctx.accept(Verdict.sampled(x))

        ctx.run(round_, rounds=ctx.L - 1)  # every row needs exactly L - 1 more forwards: no done-check
