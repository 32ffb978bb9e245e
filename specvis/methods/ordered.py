"""Models that reveal their tokens set by set in an order of their own (MAR), in the same context.

A bidirectional masked model has no KV cache and no "next token": a forward encodes the committed
tokens, puts the mask token everywhere else and gives z at any position, and its sampler draws, step by
step, the positions of a random order that its schedule reveals. Its family declares that sampler as
an ``OrderedVerifier`` (what order to reveal, how many per step, the CFG scale of each step, the
forward and the per-step draw), handed to ``specvis.generate(..., ordered=)``. The target (and draft)
view is then an ``OrderedView``, and the methods run their rounds in the ordinary ``DecodeContext``:
committed tokens are continuous (``ctx.latents``) and are not a prefix of the stream, so each round
accepts a ``Verdict`` with the stream positions it fills (``Verdict.at``); ``ctx.filled`` says which
positions are committed.

- ``AR`` on such a model is its own sampler (``reveal_rounds``): one forward per non-empty step.
- ``CSpD`` on MAR verifies blocks of drafted steps (``methods.cspd_mar``).
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from ..sampling import Sampling
from .base import DecodeContext
from .laws import ContinuousLaw, GuidedHead
from .verdicts import Verdict
from .views import count_forward


class OrderedVerifier(Protocol):
    """What a family whose model reveals tokens in its own order declares (MAR: ``families.mar.MARReveal``)."""

    def schedule(self, seq_len: int, cfg: float) -> tuple[list[int], list[float]]:
        """Tokens revealed at each step (summing to ``seq_len``; a step may reveal none) and its CFG scale."""

    def order(self, model, batch: int, generator: torch.Generator) -> torch.Tensor:
        """(B, L) the generation order; step s reveals the next ``reveals[s]`` positions from its end."""

    def condition(self, model, labels: torch.Tensor, guided: bool) -> torch.Tensor:
        """The condition rows of one forward (both CFG halves when ``guided``)."""

    def features(self, model, tokens: torch.Tensor, unknown: torch.Tensor, condition: torch.Tensor,
                 positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward: z (B, n, D) (and the unconditional half's) at ``positions`` given the known
        tokens (``unknown`` (B, L) False) of ``tokens`` (B, L, C)."""

    def head(self, model, scale: float | torch.Tensor, temperature: float) -> GuidedHead:
        """The model's diffusion head at a CFG scale (float or one per row)."""

    def draw(self, law: ContinuousLaw, generator: torch.Generator) -> torch.Tensor:
        """The model's own sampler's draw of one step's tokens (B, n, C) from ``law`` (B, n, D)."""

    def token_dim(self, model) -> int: ...


class OrderedView:
    """The view of a model decoded in its own order: B samples, a ``Sampling`` (CFG scale and the
    diffusion temperature), its condition rows and forward counters. ``laws`` is its one forward."""

    capturable = False  # rounds read the host (schedules, residual samplers): never captured
    cache = None  # bidirectional: every forward re-encodes the committed set

    def __init__(self, model, labels: torch.Tensor, sampling: Sampling, ordered: OrderedVerifier) -> None:
        self.model, self.sampling, self.ordered = model, sampling, ordered
        self.batch = labels.shape[0]
        self.cfg = sampling.uses_cfg
        self.conditions = ordered.condition(model, labels, self.cfg)
        self.token_dim = ordered.token_dim(model)
        self.forwards = 0
        self.sizes: dict[int, int] = {}
        self.seconds = 0.0

    def laws(self, tokens: torch.Tensor, unknown: torch.Tensor, positions: torch.Tensor,
             scale: float | torch.Tensor) -> ContinuousLaw:
        """The laws (B, n) of ``positions`` given the known tokens, at CFG ``scale``: one forward."""
        t0 = time.perf_counter()
        z, z_uncond = self.ordered.features(self.model, tokens, unknown, self.conditions, positions)
        count_forward(self, positions.shape[1])
        self.seconds += time.perf_counter() - t0
        return ContinuousLaw(z, z_uncond, self.head(scale))

    def head(self, scale: float | torch.Tensor) -> GuidedHead:
        return self.ordered.head(self.model, scale, float(self.sampling.temperature))

    def prefill(self):
        raise ValueError("this model reveals its tokens in its own order (MAR): method must be AR or CSpD")

    forward = prefill

    def set_committed(self, n_fed: torch.Tensor) -> None:
        """No cache to roll back."""


class Reveal:
    """One decode's reveal plan: the order (drawn from the context's generator), the schedule, and
    the positions of step s (``at``)."""

    def __init__(self, ctx: DecodeContext) -> None:
        view = ctx.target
        self.reveals, self.scales = view.ordered.schedule(ctx.L, float(view.sampling.cfg_scale))
        self.order = view.ordered.order(view.model, view.batch, ctx.generator)
        self.starts, end = [], ctx.L
        for n in self.reveals:  # positions of step s: order[:, end - n: end], revealed from the order's end
            self.starts.append(end - n)
            end -= n

    def at(self, s: int) -> torch.Tensor:
        return self.order[:, self.starts[s]:self.starts[s] + self.reveals[s]]


def known(ctx: DecodeContext) -> tuple[torch.Tensor, torch.Tensor]:
    """The committed tokens (B, L, C) and the mask of the positions not committed yet (B, L)."""
    return ctx.latents[:, : ctx.L], ~ctx.filled[:, : ctx.L]


def accept_at(ctx: DecodeContext, positions: torch.Tensor, tokens: torch.Tensor, accepted: torch.Tensor) -> None:
    """Commit ``tokens`` (B, n, C) at stream ``positions`` (B, n), all of them, by one target forward."""
    n = torch.full_like(ctx.n, positions.shape[1])
    ctx.accept(Verdict(accepted, tokens, count=n, at=positions))


def reveal_rounds(ctx: DecodeContext) -> None:
    """The model's own sampler as rounds: one target forward per non-empty step of the schedule, every
    position the step reveals drawn by the family's ``draw``."""
    view, plan = ctx.target, Reveal(ctx)
    steps = iter([s for s, n in enumerate(plan.reveals) if n])
    zero = torch.zeros_like(ctx.n)

    def round_() -> None:
        s = next(steps)
        tokens, unknown = known(ctx)
        law = view.laws(tokens, unknown, plan.at(s), plan.scales[s])
        accept_at(ctx, plan.at(s), view.ordered.draw(law, ctx.generator), zero)

    ctx.run(round_, rounds=sum(1 for n in plan.reveals if n))
