"""Running a method's rounds: eagerly, or on CUDA as one captured CUDA graph replayed per round.

A round is a function of no arguments that does one round's device work (draft steps, the verify
forward, the acceptance rule, commit, cache update). It may be captured when every state that
crosses rounds lives in tensors updated in place (the committed-token buffer and lengths of
``DecodeContext``, the KV caches, the method's own buffers), its shapes are the same every round and
it never synchronises with the host. Then, on CUDA, ``run_rounds`` runs ``WARMUP`` rounds eagerly on
a side stream (real rounds: they commit tokens), captures one round into a ``torch.cuda.CUDAGraph``
(with the context's generator registered, so replays draw the same random numbers as eager rounds)
and replays it until every row is done; the done-check is the one host sync per round. Python-side
counters that a round advances (the ``forwards`` of ``ctx.counted``) are measured on the captured round and added per
replay. On CPU, or with graphs off, the same function runs eagerly.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

WARMUP = 2


def _counters(views) -> list[int]:
    return [v.forwards for v in views]


def run_rounds(ctx, round_fn: Callable[[], None], graphs: bool, rounds: int | None = None) -> None:
    """Call ``round_fn`` until ``ctx.done()`` (or exactly ``rounds`` times, with no done-check: AR
    knows its count); captured and replayed on CUDA when ``graphs``."""
    left = [rounds]

    def done() -> bool:
        if left[0] is None:
            return ctx.done()
        left[0] -= 1
        return left[0] < 0

    if not (graphs and ctx.device.type == "cuda"):
        while not done():
            round_fn()
        return
    views = ctx.counted
    side = torch.cuda.Stream(ctx.device)
    side.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            if done():
                break
            round_fn()
    torch.cuda.current_stream(ctx.device).wait_stream(side)
    if done():
        return
    before = _counters(views)
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(ctx.generator)
    try:
        with torch.cuda.graph(graph):
            round_fn()
    except RuntimeError as e:  # not capturable (a host sync, a dynamic shape): nothing ran, go on eagerly
        for v, c in zip(views, before):
            v.forwards = c
        warnings.warn(f"CUDA graph capture failed, running eagerly: {e}", RuntimeWarning, stacklevel=2)
        round_fn()  # the round whose capture failed
        run_rounds(ctx, round_fn, graphs=False, rounds=left[0])
        return
    delta = [a - b for a, b in zip(_counters(views), before)]
    for v, c in zip(views, before):
        v.forwards = c
    graph.replay()  # the captured round itself (capture recorded it without running it)
    for v, d in zip(views, delta):
        v.forwards += d
    while not done():
        graph.replay()
        for v, d in zip(views, delta):
            v.forwards += d
