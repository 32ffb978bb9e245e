"""Auto's decode: at every round boundary, AR's proposer or SJD's, chosen by ``choose()``, over the shared
chain loop (``methods.base.decode_chain``).

Exact: each round draws from the target's law given the committed prefix. An AR round proposes no
drafts, so it commits one token drawn from the law after the last committed token. An SJD round verifies
a window whose drafts were drawn from the laws ``q`` kept beside them, by the method's rule (exact, or
``Coupled`` under keyed noise); when the previous round was AR's, the window is first built afresh for
every row from its last committed token (``JacobiDrafts.restart``, as a row restarted by continuous
batching), so the drafts verified are always drawn from the ``q`` the rule sees. Under keyed noise with
``Coupled`` both rounds commit AR's token at every position, so switching keeps the picture as well as
the law.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..accept import DEFAULT_RULE, AcceptanceRule
from ..methods.ar import Sampler
from ..methods.base import DecodeContext
from ..methods.proposer import Proposer, decode_chain
from ..methods.laws import DiscreteLaw
from ..methods.sjd import JacobiDrafts
from ..methods.verdicts import Chain, Verdict


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
        decode_chain(ctx, Switch(self.choose, JacobiDrafts(self.window, "random", "gumbel")))


class Switch(Proposer):
    """AR's proposer (no drafts) or SJD's window, per ``choose()`` each round. ``last`` holds the law each
    row's last committed token was drawn from: the first window after AR rounds is built from it."""

    capturable = False  # the choice is made on the host each round

    def __init__(self, choose: Callable[[], str], sjd: JacobiDrafts) -> None:
        self.choose, self.ar, self.sjd = choose, Sampler(), sjd
        self.stale = False  # the window is behind the committed tokens (the last round was AR's)

    def start(self, ctx: DecodeContext, law: DiscreteLaw) -> None:
        self.sjd.start(ctx, law)
        self.last = law.probs.clone()

    def propose(self, ctx: DecodeContext, n: torch.Tensor) -> Chain:
        self.current = self.ar if self.choose() == "ar" else self.sjd
        if self.current is self.sjd and self.stale:  # after AR rounds: a new window after each row's last token
            everyone = torch.ones_like(n, dtype=torch.bool)
            self.sjd.restart(ctx, everyone, DiscreteLaw(self.last))
            self.stale = False
        return self.current.propose(ctx, n)

    def observe(self, ctx: DecodeContext, n: torch.Tensor, p: DiscreteLaw, verdict: Verdict) -> None:
        self.current.observe(ctx, n, p, verdict)
        self.stale = self.current is self.ar
        if self.stale:  # the law the committed token was drawn from (an SJD round keeps its own window)
            self.last.copy_(p.probs[:, 0])

    def restart(self, ctx: DecodeContext, fresh: torch.Tensor, law: DiscreteLaw) -> None:
        self.last.copy_(torch.where(fresh[:, None], law.probs, self.last))
        self.sjd.restart(ctx, fresh, law)
