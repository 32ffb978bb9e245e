"""Running a method's rounds: eagerly, or on CUDA as one captured CUDA graph replayed per round.

A round is a function of no arguments that does one round's device work (draft steps, the verify
forward, the acceptance rule, commit, cache update). It may be captured when every state that
crosses rounds lives in tensors updated in place (the committed-token buffer and lengths of
``DecodeContext``, the KV caches, the method's own buffers), its shapes are the same every round and
it never synchronises with the host. Then, on CUDA, ``run_rounds`` runs ``WARMUP`` rounds eagerly on
a side stream (real rounds: they commit tokens), captures one round into a ``torch.cuda.CUDAGraph``
(with the context's generator registered, so replays draw the same random numbers as eager rounds)
and replays it until every row is done; the done-check is the one host sync per round. Python-side
counters that a round advances (the ``forwards`` of ``ctx.counted``, and their forwards by block size
``sizes``, static shapes of the captured round) are measured on the captured round and added per
replay. On CPU, or with graphs off, the same function runs eagerly.

Live spans (``KVCache.live``, models/base.py): attention reads only the first L cache slots, L a bucket
multiple, so a round's shapes change as the rows grow. Every round (eager or captured) pins each live
cache of ``ctx.live_caches()`` to one span, the bucket covering the cache's bound at the round's start
plus the most a round has raised it (measured on the rounds before: the first round runs unpinned).
A captured graph is keyed by those spans: while they stay the same it is replayed (the host advances
the bounds as the round would); when a span changes the graph is dropped, one round runs eagerly at
the new spans (it warms their kernels) and the next one is captured. Spans only grow with the rows,
so that happens about once per bucket. The done-check (``ctx.done()``) tightens the bounds to the
exact longest row in the transfer it makes anyway.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

WARMUP = 2
cuda = torch.cuda  # the CUDA graph API used below (tests swap in a CPU stand-in to check the keying)


def _capturable(device: torch.device) -> bool:
    return device.type == "cuda"


def _counters(views) -> list[tuple[int, dict]]:
    """Each view's forward count and its forwards by block size (``sizes``)."""
    return [(v.forwards, dict(v.sizes)) for v in views]


def _restore(views, counts: list[tuple[int, dict]]) -> None:
    for v, (f, sizes) in zip(views, counts):
        v.forwards = f
        v.sizes.clear()
        v.sizes.update(sizes)


def _delta(views, before: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """What one round added to each view's counters (its block sizes are the captured static shapes)."""
    out = []
    for (f, sizes), (f0, sizes0) in zip(_counters(views), before):
        out.append((f - f0, {n: c - sizes0.get(n, 0) for n, c in sizes.items() if c != sizes0.get(n, 0)}))
    return out


def _add(views, delta: list[tuple[int, dict]]) -> None:
    """A replay of the captured round: its forwards (and their block sizes) once more."""
    for v, (d, sizes) in zip(views, delta):
        v.forwards += d
        for n, c in sizes.items():
            v.sizes[n] = v.sizes.get(n, 0) + c


class _Spans:
    """The live caches of a context and the most each has grown in one round so far."""

    def __init__(self, ctx) -> None:
        self.caches = list(ctx.live_caches())
        self.growth: list[int] | None = None

    def mark(self) -> tuple:
        """A round starts: pin every cache (once a round has been measured); returns the spans."""
        growth = self.growth or [None] * len(self.caches)
        return tuple(c.mark(g) for c, g in zip(self.caches, growth))

    def measure(self) -> None:
        """After a round that ran (eagerly or captured): record how far each bound moved."""
        grown = [c.trace[-1] if c.trace else 0 for c in self.caches]
        self.growth = grown if self.growth is None else [max(a, b) for a, b in zip(self.growth, grown)]

    def overflowed(self) -> bool:
        return any(c.overflow for c in self.caches)

    def rewind(self) -> None:
        """A capture that recorded nothing ran: bounds back to the round's start."""
        for c in self.caches:
            c.bound, c.trace = c.start, []

    def replayed(self) -> None:
        """A replay ran the captured round: advance the bounds as its forwards would have."""
        for c, g in zip(self.caches, self.growth):
            c.bound, c.trace = c.start + g, []

    def unpin(self) -> None:
        for c in self.caches:
            c.pin = None


def run_rounds(ctx, round_fn: Callable[[], None], graphs: bool, rounds: int | None = None) -> None:
    """Call ``round_fn`` until ``ctx.done()`` (or exactly ``rounds`` times, with no done-check: AR
    knows its count); captured and replayed on CUDA when ``graphs``. ``ctx.max_rounds``
    (``DecodeContext``: the stream's length L): a round commits at least one token to every unfinished
    row, so a stream of L tokens is done within L rounds; a loop still going after that many rounds
    makes no progress and is a RuntimeError, never a hang."""
    max_rounds = ctx.max_rounds
    spans = _Spans(ctx)
    try:
        if graphs and _capturable(ctx.device):
            _run_graphs(ctx, round_fn, rounds, spans, max_rounds)
        else:
            _run_eager(ctx, round_fn, rounds, spans, max_rounds)
    finally:
        spans.unpin()


def run_plain(ctx, round_fn: Callable[[], None], rounds: int | None = None) -> None:
    """Rounds that cannot be captured (they read the host, e.g. a rejection sampler's loop): called
    eagerly until ``ctx.done()`` (or exactly ``rounds`` times), with the same progress reports and
    no-progress bound as ``run_rounds``, and no live span pinned (their forwards size their own spans)."""
    done = _done_check(ctx, rounds, ctx.max_rounds)
    while not done():
        round_fn()


def _done_check(ctx, rounds: int | None, max_rounds: int | None = None) -> Callable[[], bool]:
    left, ran = [rounds], [-1]  # ran: rounds run so far (the first check comes before any)

    def done() -> bool:
        ctx.report_progress()
        if left[0] is None:
            finished = ctx.done()
            ran[0] += 1
            if not finished and max_rounds is not None and ran[0] >= max_rounds:
                raise RuntimeError(f"decoding made no progress: {ran[0]} rounds ran and a row of {max_rounds} "
                                   "tokens is not done (every round must commit a token per unfinished row)")
            return finished
        left[0] -= 1
        return left[0] < 0

    done.left = left
    return done


def _run_eager(ctx, round_fn, rounds, spans: _Spans, max_rounds: int | None = None) -> None:
    done = _done_check(ctx, rounds, max_rounds)
    while not done():
        spans.mark()
        round_fn()
        spans.measure()


def _run_graphs(ctx, round_fn, rounds, spans: _Spans, max_rounds: int | None = None) -> None:
    done = _done_check(ctx, rounds, max_rounds)
    views = ctx.counted
    dev = ctx.device
    side = cuda.Stream(dev)

    def eager() -> tuple:  # one real round on a side stream (warm-up: lazy inits, new shapes)
        side.wait_stream(cuda.current_stream(dev))
        with cuda.stream(side):
            key = spans.mark()
            round_fn()
        cuda.current_stream(dev).wait_stream(side)
        spans.measure()
        return key

    warm = None  # the spans of the last eager round
    for _ in range(WARMUP):
        if done():
            return
        warm = eager()
    graph, key, delta = None, None, None
    while not done():
        pins = spans.mark()
        if graph is not None and pins == key:
            graph.replay()
            spans.replayed()
            _add(views, delta)
            continue
        graph = None  # spans changed: the old graph is never replayed again (spans only grow)
        if pins != warm:
            warm = eager()  # this round runs eagerly at the new spans; the next one is captured
            continue
        before = _counters(views)
        graph = cuda.CUDAGraph()
        graph.register_generator_state(ctx.generator)
        try:
            with cuda.graph(graph):
                round_fn()
        except RuntimeError as e:  # not capturable (a host sync, a dynamic shape): nothing ran, go on eagerly
            _restore(views, before)
            spans.rewind()
            warnings.warn(f"CUDA graph capture failed, running eagerly: {e}", RuntimeWarning, stacklevel=3)
            spans.mark()
            round_fn()  # the round whose capture failed
            spans.measure()
            _run_eager(ctx, round_fn, done.left[0], spans, max_rounds)
            return
        delta = _delta(views, before)
        _restore(views, before)
        graph.replay()  # the captured round itself (capture recorded it without running it)
        _add(views, delta)
        if spans.overflowed():  # it grew past its pins: its shapes are not the key's, use it once only
            graph, warm = None, None
        key = pins
        spans.measure()
