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
from ..sampling import sample
from .base import DecodeContext
from .verdicts import Chain, Verdict


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
        target, draft, g, gen = ctx.target, ctx.draft, self.gamma, ctx.generator
        x0 = target.prefill().sample(gen)
        draft.prefill()
        ctx.accept(Verdict.sampled(x0))

        def round_(back: int) -> None:
            n = ctx.n.clone()
            # The draft re-feeds the last two committed tokens (one on the first round): its cache may
            # lack the previous round's bonus token, and a uniform shape keeps rows independent.
            draft.set_committed(n - back)
            feed = ctx.tokens.gather(1, ctx.positions(n - back, back))
            q_steps, d_steps = [], []
            pos = ctx.positions(n - back, back)
            for i in range(g):
                q = draft.forward(feed, pos).probs[:, -1]
                draft.set_committed(pos[:, -1] + 1)
                d = sample(q, gen)
                q_steps.append(q)
                d_steps.append(d)
                feed, pos = d[:, None], pos[:, -1:] + 1
            q_all, drafts = torch.stack(q_steps, 1), torch.stack(d_steps, 1)
            p_all = target.forward(torch.cat([ctx.tokens.gather(1, (n - 1)[:, None]), drafts], 1),
                                   ctx.positions(n - 1, g + 1))
            ctx.accept(ctx.verify(p_all, Chain(drafts, q_all)))

        if not ctx.done():
            round_(1)
        ctx.run(lambda: round_(2))  # same shapes every round from here: capturable
