"""The served law: rows admitted from a live queue at round boundaries (``specvis.serve.rows.LiveRows``,
driven as the engine drives it by ``engine.decode_live``) sample the exact law of API.md, with samples
arriving a few at a time, rows at different phases and some samples cancelled mid-decode (their rows
freed and taken by the next ones). Chi-square against the enumerated law (tests/exactness.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specvis as sv
from exactness import CPU_SAMPLING, chi_square_pvalue, exact_law, grid_index, tiny_llamagen
from specvis.models.base import Condition
from specvis.serve.engine import decode_live
from specvis.serve.rows import LiveRows

CONDITIONS = (0, 1, 2)
SAMPLES = 12_000
ROWS = 48


class Sample:
    def __init__(self, c: int, model, out: list, cancel_at: int | None) -> None:
        self.c, self.out, self.cancel_at, self.turns = c, out, cancel_at, 0
        self.condition = Condition(torch.tensor([c]), torch.tensor([model.null_condition]))
        self.cancelled = self.done = False
        self.seed = 0  # keyed noise only

    wants_partials = False

    def started(self) -> None:
        pass

    def partial_due(self, committed: int) -> bool:
        return False

    def partial(self, tokens, committed) -> None:
        raise AssertionError("no partials asked")

    def finished(self, tokens: torch.Tensor, forwards: int) -> None:
        assert not self.cancelled
        self.done, self.tokens = True, tokens.clone()
        if self.cancel_at is None:  # a sample meant to be cancelled never counts, finished or not: the
            self.out.append((self.c, self.tokens))  # ones that outran their cancel would bias the law


def served_counts(model, method, sampling) -> tuple[np.ndarray, int]:
    """Counts (conditions, V**L) of the grids of ``SAMPLES`` samples served through live rows; a
    sample in 7 is cancelled at the first turn after it started (and never counted, finished or not).
    Returns the counts and the samples cancelled before they finished."""
    out: list = []
    made = [0]
    live: list[Sample] = []

    def make(k: int) -> list[Sample]:
        fresh = []
        for _ in range(min(k, SAMPLES - made[0])):
            i = made[0]
            fresh.append(Sample(CONDITIONS[i % len(CONDITIONS)], model, out, 1 if i % 7 == 3 else None))
            made[0] += 1
        live.extend(fresh)
        return fresh

    def source(room: int, held: int) -> list[Sample]:
        for s in live:  # cancel some samples while their rows decode
            s.turns += 1
            if s.cancel_at is not None and s.turns == s.cancel_at:
                s.cancelled = True
        return make(room if made[0] % 2 else min(room, 3))  # at times a few only: rows restart at different rounds

    first = make(ROWS - 5) + [None] * 5  # five rows start free
    decode_live(model, first, method, sampling, 7, lambda ctx: LiveRows(ctx, first, source, SAMPLES))
    V, L = model.layout.vocab_size, model.layout.num_tokens
    counts = np.zeros((len(CONDITIONS), V ** L))
    for c, tokens in out:
        counts[c, int(grid_index(tokens[None], V))] += 1
    return counts, sum(s.cancelled and not s.done for s in live)


@pytest.mark.parametrize("method", [sv.AR(), sv.SJD(window=3, init="vertical-sample", coupling="gumbel")],
                         ids=["ar", "sjd"])
def test_live_rows_sample_the_exact_law(method):
    torch.manual_seed(0)
    model = tiny_llamagen(11)
    counts, cancelled = served_counts(model, method, CPU_SAMPLING)
    assert cancelled > SAMPLES // 50  # the cancel path ran
    assert counts.sum() == len([i for i in range(SAMPLES) if i % 7 != 3])  # every other sample came back once
    law = exact_law(model, list(CONDITIONS), CPU_SAMPLING)
    assert chi_square_pvalue(counts, law) > 1e-3


def test_rows_given_back_and_started_again_keep_the_exact_law(monkeypatch):
    """Rows given back while young (``LiveRows.preempt``, as a draining engine gives them back) and their
    samples started again from their first token in a later turn or decode: every sample comes back
    once and the grids follow the enumerated law. The give-back is decided by turns only
    (``engine.young_turns``: no sample can have finished), so it selects no sample by its tokens."""
    from collections import deque

    from specvis.serve import engine
    from specvis.serve.engine import young_turns

    monkeypatch.setattr(engine, "PREEMPT_SHARE", 1)  # the tiny model's stream of 4 would allow no turn otherwise
    torch.manual_seed(0)
    model = tiny_llamagen(11)
    method = sv.AR()
    young = young_turns(model.layout.stream_len, method.pad)
    assert young >= 1
    out: list = []
    waiting = deque(Sample(CONDITIONS[i % len(CONDITIONS)], model, out, None) for i in range(SAMPLES // 2))
    live: list[LiveRows] = []
    calls, given_back = [0], [0]

    def source(room: int, held: int) -> list[Sample]:
        calls[0] += 1
        if calls[0] % 12 == 0:  # the decode then ends (no row holds a sample) and the next one starts them
            back = live[-1].preempt(young)
            given_back[0] += len(back)
            waiting.extendleft(reversed(back))  # back at the head, in order
            return []
        return [waiting.popleft() for _ in range(min(room, len(waiting)))]

    rows = 8
    while waiting:
        first = [waiting.popleft() for _ in range(min(rows, len(waiting)))]
        first += [None] * (rows - len(first))
        decode_live(model, first, method, CPU_SAMPLING, 7 + len(live),  # each decode its own stream of noise
                    lambda ctx: live.append(LiveRows(ctx, first, source, SAMPLES)) or live[-1])
    assert given_back[0] > SAMPLES // 20  # the give-back path ran
    V, L = model.layout.vocab_size, model.layout.num_tokens
    counts = np.zeros((len(CONDITIONS), V ** L))
    for c, tokens in out:
        counts[c, int(grid_index(tokens[None], V))] += 1
    assert counts.sum() == SAMPLES // 2  # each sample came back once
    law = exact_law(model, list(CONDITIONS), CPU_SAMPLING)
    assert chi_square_pvalue(counts, law) > 1e-3
