"""Auto's decode: at every round boundary, AR's round or SJD's round, chosen by ``choose()``.

Exact: each round draws from the target's law given the committed prefix. An AR round commits one token
drawn from the law after the last committed token. An SJD round verifies a window whose drafts were
drawn from the laws ``q`` kept beside them, by the method's rule (exact, or ``Coupled`` under keyed
noise); when the previous round was AR's, the window is first built afresh for every row from its
last committed token (``JacobiWindow.restart``, as a row restarted by continuous batching), so the
drafts verified are always drawn from the ``q`` the rule sees. Under keyed noise with ``Coupled`` both
rounds commit AR's token at every position, so switching keeps the picture as well as the law.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..accept import DEFAULT_RULE, AcceptanceRule
from ..methods.base import DecodeContext
from ..methods.verdicts import Chain, Verdict
from ..methods.sjd import JacobiWindow


@dataclass(frozen=True)
class Switching:
    """Rounds of AR (one token per row) or of SJD (``window``, random init, gumbel coupling), per
    ``choose() -> "ar" | "sjd"`` at each round boundary (the engine: by the rows in flight)."""

    choose: Callable[[], str] = field(compare=False)
    window: int = 16
    acceptance: AcceptanceRule = DEFAULT_RULE
    name = "auto"
    lossless = True
    refills = True

    @property
    def pad(self) -> int:
        return self.window + 2

    def decode(self, ctx: DecodeContext) -> None:
        target, W = ctx.target, self.window
        B = ctx.n.shape[0]
        win = JacobiWindow(ctx, W, "random", "gumbel")
        p0 = target.prefill()
        ctx.accept(Verdict.sampled(ctx.draw(p0, ctx.n)))
        last = p0.probs.clone()  # the law each row's last committed token was drawn from
        draft, q = win.next_window(p0.probs[:, None], base=ctx.n - 1, start=ctx.n, first_init=ctx.n)
        fresh_window = [False]  # the window is current (the last round was SJD's, or it was just built)
        everyone = torch.ones(B, dtype=torch.bool, device=ctx.device)

        def ar_round() -> None:
            n = ctx.n.clone()
            law = target.forward(ctx.tokens.gather(1, (n - 1)[:, None]), (n - 1)[:, None])
            ctx.accept(Verdict.sampled(ctx.draw(law[:, 0], n)))
            last.copy_(law.probs[:, 0])
            fresh_window[0] = True

        def sjd_round() -> None:
            if fresh_window[0]:  # after AR rounds: a new window after each row's last token
                new_draft, new_q = win.restart(everyone, last, ctx.n)
                draft.copy_(new_draft)
                q.copy_(new_q)
                fresh_window[0] = False
            n = ctx.n.clone()
            feed = torch.cat([ctx.tokens.gather(1, (n - 1)[:, None]), draft], 1)
            p = target.forward(feed, ctx.positions(n - 1, W + 1))  # p[:, j]: law of position n + j
            verdict = ctx.verify(p, Chain(draft, q))
            ctx.accept(verdict)
            start = n + verdict.accepted + 1
            new_draft, new_q = win.next_window(p.probs, base=n, start=start, first_init=n + W + 1, prev=(draft, q))
            draft.copy_(new_draft)
            q.copy_(new_q)
            last.copy_(p.probs.gather(1, verdict.accepted.clamp_max(W)[:, None, None].expand(-1, 1, p.probs.shape[-1]))[:, 0])

        def round_() -> None:
            (ar_round if self.choose() == "ar" else sjd_round)()

        def restart(fresh: torch.Tensor, law) -> None:  # a row restarted with a new sample
            last.copy_(torch.where(fresh[:, None], law.probs, last))
            new_draft, new_q = win.restart(fresh, law.probs, ctx.n)
            draft.copy_(torch.where(fresh[:, None], new_draft, draft))
            q.copy_(torch.where(fresh[:, None, None], new_q, q))

        ctx.run(round_, capture=False, refill=restart)  # the choice is made on the host each round
