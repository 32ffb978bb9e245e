"""Rows fed from a live queue: continuous batching whose samples arrive while the decode runs.

The mechanics of ``methods/slots.py`` (a free row restarts from a prefix computed apart from the
running cache, its first token drawn from that prefix's law, the method's state of the row reset by the
``refill`` callback of ``DecodeContext.run``), with two differences: at each done-check the samples come
from ``source(k)`` (the engine's FIFO queue) instead of a fixed condition, and a finished row hands its
tokens to its sample at once. A cancelled sample's row is freed at the same boundary.

Exact for the same reason as ``SlotQueue``: a restarted row's cache holds its prefix only and its
committed buffer is cleared, so every later forward computes the row's law as if the sample ran alone.
Under keyed noise the row takes its new sample's seed before its first draw, so its tokens are the
sample's alone (AR's tokens for that seed, with a method verifying by ``accept.Coupled``).
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from ..methods.laws import DiscreteLaw
from ..models.base import Condition, Prompts
from ..noise import seed_tensor


class Sample(Protocol):
    """One image a row decodes: its condition (one sample, both CFG halves), and the callbacks."""

    condition: Condition
    seed: int  # the image's seed: its keyed noise (``Sampling(noise="keyed")``)
    cancelled: bool

    @property
    def wants_partials(self) -> bool: ...

    def started(self) -> None: ...

    def partial_due(self, committed: int) -> bool: ...

    def partial(self, tokens: torch.Tensor, committed: int) -> None: ...

    def finished(self, tokens: torch.Tensor, forwards: int) -> None: ...


def joined(conditions: list[Condition]) -> Condition:
    """One condition of the samples of ``conditions`` in order (class ids or ``Prompts``, both halves)."""
    def cat(parts):
        if parts[0] is None:
            return None
        if isinstance(parts[0], Prompts):
            out = parts[0]
            for p in parts[1:]:
                out = out.cat(p)
            return out
        return torch.cat(parts)
    return Condition(cat([c.cond for c in conditions]), cat([c.uncond for c in conditions]))


def _scattered(law: DiscreteLaw, rows: torch.Tensor, size: int) -> DiscreteLaw:
    """The laws ``law`` (k, V) placed at rows ``rows`` of a (size, V) law, zeros elsewhere."""
    def put(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        out = t.new_zeros(size, *t.shape[1:])
        out[rows] = t
        return out
    return DiscreteLaw(put(law.probs), put(law.soft))


class LiveRows:
    """The rows of one decode and the sample each holds (``ctx.queue``: ``DecodeContext.done`` calls
    ``turn`` at every round boundary). ``source(room, held)``: up to ``room`` waiting samples, called
    at every turn (room may be 0); ``budget``: the most samples this decode admits after its first
    rows (it bounds ``ctx.max_rounds``, the no-progress check); ``on_round(rows_held)``: called each
    turn. ``held``: the sample of each row at the start, None for a row left free (it decodes a copy of the
    first sample's condition, thrown away, until a waiting sample takes it)."""

    def __init__(self, ctx, held: list[Sample | None], source: Callable[[int, int], list[Sample]], budget: int,
                 on_round: Callable[[int], None] | None = None) -> None:
        self.rows = ctx.n.shape[0]
        if len(held) != self.rows:
            raise ValueError(f"{len(held)} samples for {self.rows} rows")
        self.owner: list[Sample | None] = list(held)  # None: a free row (its first prefill's sample is nobody's)
        self.source, self.on_round = source, on_round
        self.samples = self.rows + budget  # what ``DecodeContext.max_rounds`` reads
        self.started = self.rows
        self.round = 0  # turns so far
        self.since = [0] * self.rows  # the turn at which each row's sample started

    def turn(self, ctx, complete: list[int]) -> bool:
        """Hand out finished rows, free cancelled ones, send due partial images, restart free rows with
        waiting samples; True when no row holds a sample (the decode ends)."""
        for r, s in enumerate(self.owner):
            if s is not None and s.cancelled:
                self.owner[r] = None
        done = [r for r, s in enumerate(self.owner) if s is not None and complete[r]]
        if done:
            index = torch.tensor(done, device=ctx.device)
            tokens = ctx.tokens[index, : ctx.L].cpu()
            forwards = ctx.active_forwards[index].tolist()
            for i, r in enumerate(done):
                sample, self.owner[r] = self.owner[r], None
                sample.finished(tokens[i], int(forwards[i]))
        self._partials(ctx)
        free = [r for r, s in enumerate(self.owner) if s is None]
        room = min(len(free), self.samples - self.started)
        fresh = self.source(room, self.rows - len(free))  # room 0: the source may still end the decode (``preempt``)
        if fresh:
            self._restart(ctx, free[: len(fresh)], fresh)
        held = sum(s is not None for s in self.owner)
        if self.on_round is not None:
            self.on_round(held)
        return held == 0

    def _partials(self, ctx) -> None:
        """Committed tokens of the rows whose samples ask for a partial image now (one host read, only
        when some sample asks for partials at all)."""
        asking = [r for r, s in enumerate(self.owner) if s is not None and s.wants_partials]
        if not asking:
            return
        n = ctx.n.tolist()
        due = [r for r in asking if self.owner[r].partial_due(min(n[r], ctx.L))]
        if due:
            tokens = ctx.tokens[torch.tensor(due, device=ctx.device), : ctx.L].cpu()
            for i, r in enumerate(due):
                self.owner[r].partial(tokens[i], min(n[r], ctx.L))

    def _restart(self, ctx, rows: list[int], fresh: list[Sample]) -> None:
        law, prefixes = ctx.target.prefill_apart(joined([s.condition for s in fresh]))
        index = torch.tensor(rows, device=ctx.device)
        which = torch.arange(len(rows), device=ctx.device)
        if ctx.keyed is not None:  # the rows race their new images' keyed noise from now on
            ctx.keyed.seeds[index] = seed_tensor([s.seed for s in fresh], ctx.device)
        ctx.restart_rows(index, ctx.draw(law, torch.zeros_like(index), rows=index))
        ctx.target.load_prefixes(index, prefixes, which)
        for r, s in zip(rows, fresh):
            self.owner[r] = s
            self.since[r] = self.round
            s.started()
        self.started += len(rows)
        if ctx.on_refill is not None:
            mask = torch.zeros(self.rows, dtype=torch.bool, device=ctx.device)
            mask[index] = True
            ctx.on_refill(mask, _scattered(law, index, self.rows))

    def preempt(self, rounds: int) -> list[Sample]:
        """Free every row and return the samples they held, if each started at most ``rounds`` turns
        ago (else nothing changes and []): the samples start again from their first token in another
        decode. Exact: the decision reads turns and arrivals, never a token, so each sample is still
        one draw from its law (under keyed noise, the same picture)."""
        held = [r for r, s in enumerate(self.owner) if s is not None]
        if not held or any(self.round - self.since[r] > rounds for r in held):
            return []
        out = [self.owner[r] for r in held]
        for r in held:
            self.owner[r] = None
        return out

    def progress(self, n: torch.Tensor, L: int) -> float:
        """The fraction of the held rows' streams committed (``DecodeContext.report_progress``)."""
        held = torch.tensor([s is not None for s in self.owner], device=n.device)
        total = int(held.sum()) * L
        return float(torch.where(held, n.clamp_max(L), 0).sum()) / total if total else 1.0
