"""Continuous batching: more samples than rows; a row that finishes takes the next sample (``generate(batch_size=)``).

A decode runs S rows at once (the cache's samples). Given Q > S conditions, each done-check moves the
samples whose rows have their whole grid out of the decode, and while samples wait each free row
restarts with the next one: the sample's condition prefix is loaded into the row's cache slots, its first
image token is drawn from the prefix's law, and the method resets its own state of the row (the
``refill(fresh, law)`` callback of ``DecodeContext.run``, given the first token's law). Prefixes are computed S at a time, apart from the running
cache, in one counted target forward (``GuidedModel.prefill_apart``), as the decode's own prefill does
for the first S: a sample's forward count is its batch-1 count. Rows never wait for each other, so
rows idle only after the last sample has started (the tail), instead of after every batch.

Exact: a restarted row's cache holds its prefix only (keys, values, length, prefix length; tracked
positions cleared) and its committed buffer is cleared, so every later forward computes the row's law
as if the sample ran alone (tests/test_slots.py: greedy tokens equal per-sample runs on every family).
"""

from __future__ import annotations

import torch

from ..models.base import Condition
from .laws import DiscreteLaw


def _scattered(law: DiscreteLaw, which: torch.Tensor, rows: torch.Tensor, size: int) -> DiscreteLaw:
    """The laws ``law[which]`` at rows ``rows`` of a (size, V) law, zeros elsewhere."""
    def put(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        out = t.new_zeros(size, *t.shape[1:])
        out[rows] = t[which]
        return out
    return DiscreteLaw(put(law.probs), put(law.soft))


class SlotQueue:
    """The samples of a decode with fewer rows than conditions: which sample each row holds, the finished
    samples' tokens, accept maps and forward counts (in condition order), and the prefixes computed ahead."""

    def __init__(self, ctx, condition: Condition) -> None:
        S, Q, L, dev = ctx.n.shape[0], condition.batch, ctx.L, ctx.device
        self.condition, self.rows, self.samples = condition, S, Q
        self.sample_of = torch.arange(S, device=dev)  # the sample each row holds
        self.held = [True] * S  # host side: the row holds an unfinished sample
        self.started, self.finished = S, 0
        self.tokens = torch.zeros(Q, L, dtype=torch.long, device=dev)
        self.accept_map = torch.zeros(Q, L, dtype=torch.long, device=dev)
        self.active_forwards = torch.zeros(Q, dtype=torch.long, device=dev)
        self.wave = None  # (law, prefixes, first sample) of the prefixes computed ahead
        self.computed = S  # samples whose prefixes were computed (the first S by the decode's prefill)

    def turn(self, ctx, complete: list[int]) -> bool:
        """Move out the samples whose rows are ``complete`` (per row, read by the done-check), restart free
        rows with waiting samples; True when every sample is done."""
        out = [r for r in range(self.rows) if self.held[r] and complete[r]]
        if out:
            rows = torch.tensor(out, device=ctx.device)
            ids = self.sample_of[rows]
            self.tokens[ids] = ctx.tokens[rows, : ctx.L]
            self.accept_map[ids] = ctx.accept_map[rows, : ctx.L]
            self.active_forwards[ids] = ctx.active_forwards[rows]
            for r in out:
                self.held[r] = False
            self.finished += len(out)
        free = [r for r in range(self.rows) if not self.held[r]][: self.samples - self.started]
        while free:
            if self.wave is None or self.started >= self.computed:
                self._compute(ctx)
            law, prefixes, first = self.wave
            take = free[: self.computed - self.started]
            free = free[len(take):]
            rows = torch.tensor(take, device=ctx.device)
            which = torch.arange(self.started - first, self.started - first + len(take), device=ctx.device)
            samples = torch.arange(self.started, self.started + len(take), device=ctx.device)
            if ctx.keyed is not None:  # the rows' new images' seeds
                ctx.keyed.start(rows, samples)
            ctx.restart_rows(rows, ctx.draw(law[which], torch.zeros_like(rows), rows=rows))
            ctx.target.load_prefixes(rows, prefixes, which)
            self.sample_of[rows] = samples
            for r in take:
                self.held[r] = True
            self.started += len(take)
            if ctx.on_refill is not None:
                fresh = torch.zeros(self.rows, dtype=torch.bool, device=ctx.device)
                fresh[rows] = True
                ctx.on_refill(fresh, _scattered(law, which, rows, self.rows))
        return self.finished == self.samples

    def _compute(self, ctx) -> None:
        """The next S waiting samples' first-token laws and prefixes, in one target forward."""
        first, last = self.computed, min(self.computed + self.rows, self.samples)
        law, prefixes = ctx.target.prefill_apart(self.condition[first:last])
        self.wave, self.computed = (law, prefixes, first), last

    def progress(self, n: torch.Tensor, L: int) -> float:
        """The fraction of all samples' tokens committed (one host read)."""
        held = torch.tensor(self.held, device=n.device)
        return (self.finished * L + float(torch.where(held, n.clamp_max(L), 0).sum())) / (self.samples * L)
