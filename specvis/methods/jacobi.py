"""Jacobi decoding (Song et al., ICML 2021), the greedy special case of SJD (``sjd.py``): a window of
guesses fed after the last committed token; a guess is accepted while it equals the target's argmax
after the guesses before it (token equality, a Jacobi fixed-point iteration), and the next window is
those argmaxes. Its output is greedy AR token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..options import Options, option
from .base import DecodeContext
from .laws import DiscreteLaw
from .proposer import Proposer, decode_chain
from .verdicts import Chain, Verdict


@dataclass(frozen=True)
class Jacobi(Options):
    """Deterministic Jacobi decoding with a sliding window of ``window`` tokens; greedy only."""

    window: int = option(16, low=1, stream=True, help="Jacobi window: draft tokens verified per round")
    name = "jacobi"
    refills = True
    lossless = True
    acceptance = None

    @property
    def pad(self) -> int:
        return self.window + 2

    def decode(self, ctx: DecodeContext) -> None:
        if not ctx.target.sampling.greedy:
            raise ValueError("method jacobi needs greedy sampling (temperature=0); use SJD to sample")
        decode_chain(ctx, JacobiGuesses(self.window))


class JacobiGuesses(Proposer):
    """A window of ``window`` guesses, random at first (paper, Fig. 3), then the target's argmaxes of the
    last round: a draft is accepted while it equals the argmax after the drafts before it (token
    equality, not an acceptance rule); the first token is the prefill's argmax."""

    def __init__(self, window: int) -> None:
        self.W = window

    def _random(self, ctx: DecodeContext) -> torch.Tensor:
        """Random drafts over the image codes at each row's next ``W`` positions (forced ones: their id)."""
        V, B = ctx.layout.vocab_size, ctx.n.shape[0]
        return ctx.force(torch.randint(V, (B, self.W), device=ctx.device, generator=ctx.generator), ctx.positions(ctx.n, self.W))

    def first(self, ctx: DecodeContext, law: DiscreteLaw) -> Verdict:
        return Verdict.sampled(law.probs.argmax(-1))

    def start(self, ctx: DecodeContext, law: DiscreteLaw) -> None:
        self.draft, self.j = self._random(ctx), torch.arange(self.W, device=ctx.device)  # updated in place

    def propose(self, ctx: DecodeContext, n: torch.Tensor) -> Chain:
        return Chain(self.draft, None)

    def verify(self, ctx: DecodeContext, p: DiscreteLaw, chain: Chain) -> Verdict:
        self.guess = p.probs.argmax(-1)  # (B, W + 1)
        accepted = (chain.tokens == self.guess[:, :self.W]).long().cumprod(-1).sum(-1)  # converged prefix
        return Verdict(accepted, self.guess)  # guess[:, accepted] follows a converged prefix: exact

    def observe(self, ctx: DecodeContext, n: torch.Tensor, p: DiscreteLaw, verdict: Verdict) -> None:
        W, B = self.W, n.shape[0]
        src = verdict.accepted[:, None] + 1 + self.j  # slot j of the new window is position n + src
        fresh = torch.randint(ctx.layout.vocab_size, (B, W), device=ctx.device, generator=ctx.generator)
        self.draft.copy_(ctx.force(torch.where(src <= W, self.guess.gather(1, src.clamp_max(W)), fresh), ctx.positions(ctx.n, W)))

    def restart(self, ctx: DecodeContext, fresh: torch.Tensor, law: DiscreteLaw) -> None:
        self.draft.copy_(torch.where(fresh[:, None], self._random(ctx), self.draft))  # a random window after token 0
