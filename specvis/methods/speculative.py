"""Draft-model speculative sampling (Leviathan et al. 2023; Chen et al. 2023), batched.

Each round the draft proposes gamma tokens autoregressively, the target scores them in one forward
over gamma + 1 positions, and the acceptance rule walks the chain (``accept.verify_chain``). Each
row commits its own accepted length + 1 (the resampled or bonus token); rows never wait for the
slowest one, their caches are rolled back per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..accept import AcceptanceRule, RuleMethod, rule_option
from ..options import option
from .base import DecodeContext
from .proposer import Proposer, decode_chain
from .laws import DiscreteLaw
from .verdicts import Chain


@dataclass(frozen=True)
class Speculative(RuleMethod):
    """gamma draft tokens per target forward; ``acceptance`` is any rule of ``specvis.accept``."""

    gamma: int = option(4, low=1, stream=True, help="draft tokens per round, drawn one by one from the draft model")
    acceptance: AcceptanceRule = rule_option()
    name = "speculative"
    walk = "chain"

    @property
    def pad(self) -> int:
        return self.gamma + 2

    def decode(self, ctx: DecodeContext) -> None:
        if ctx.draft is None:
            raise ValueError("method speculative needs a draft model (draft=...)")
        decode_chain(ctx, DraftModel(self.gamma))


class DraftModel(Proposer):
    """``gamma`` drafts drawn one by one from the draft model (``ctx.draft``), each with its law."""

    warmup = True  # the first round re-feeds one committed token, the others two

    def __init__(self, gamma: int) -> None:
        self.gamma, self.back = gamma, 1

    def start(self, ctx: DecodeContext, law) -> None:
        ctx.draft.prefill()

    def propose(self, ctx: DecodeContext, n: torch.Tensor) -> Chain:
        # The draft re-feeds the last two committed tokens (one on the first round): its cache may
        # lack the previous round's bonus token, and a uniform shape keeps rows independent.
        draft, back = ctx.draft, self.back
        draft.set_committed(n - back)
        feed = ctx.tokens.gather(1, ctx.positions(n - back, back))
        q_steps, d_steps = [], []
        pos = ctx.positions(n - back, back)
        for i in range(self.gamma):
            q = draft.forward(feed, pos).probs[:, -1]
            draft.set_committed(pos[:, -1] + 1)
            d = ctx.draw(DiscreteLaw(q), pos[:, -1] + 1)  # keyed noise: the race of its position
            q_steps.append(q)
            d_steps.append(d)
            feed, pos = d[:, None], pos[:, -1:] + 1
        self.back = 2  # same shapes every round from here: capturable
        return Chain(torch.stack(d_steps, 1), torch.stack(q_steps, 1))
