"""The engine without HTTP, driven in this thread round by round (``Engine._take`` and ``_decode`` as its
worker calls them): a draining decode gives young rows back so that waiting images start together,
each image still its seed's; memory planned per request (a job whose rows do not fit is refused before
it starts, in one line; a decode holds no more rows than fit)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import specvis as sv
from specvis import memory
from specvis.serve.engine import Engine, Key, Ticket, decode_plan


@pytest.fixture(scope="module")
def pipe():
    return sv.load("emoji")


def drive(engine: Engine) -> None:
    """The worker's loop body until nothing waits (``Engine._run`` without its thread)."""
    while engine._waiting:
        first = engine._take(None, engine.max_batch, held=0)
        try:
            if first:
                engine._decode(first)
        finally:
            engine._live = None


def keyed(pipe):
    return dataclasses.replace(pipe.default_sampling, noise="keyed")


def test_a_draining_decode_gives_its_young_rows_back_and_each_image_stays_its_seeds(pipe):
    """A decode of one row (one request alone) sees three images arrive: it gives its row back at once
    and one decode of four rows makes all four, instead of the three waiting a whole image. Each image
    is the AR image of its seed. Catches: the give-back skipped (the first image decodes alone for
    its whole stream), images requeued out of order or lost, the restarted image not its seed's."""
    engine = Engine(pipe, max_batch=4, method="ar")
    key = Key("ar", keyed(pipe), engine.native)
    images: dict[int, torch.Tensor] = {}
    order: list[int] = []

    def job(seed: int, n: int) -> Ticket:
        def sink(event, seed=seed):
            assert event[0] == "image", event
            images[seed + event[1]] = event[2]
            order.append(seed + event[1])
        return Ticket(3, n, seed, key, sink)

    engine.submit(job(10, 1))
    held_per_turn: list[int] = []
    round_ = engine._round

    def spy(held: int) -> None:
        held_per_turn.append(held)
        if len(held_per_turn) == 1:
            engine.submit(job(20, 3))  # they arrive while the one-row decode runs
        round_(held)

    engine._round = spy
    drive(engine)
    assert order == [10, 20, 21, 22]  # one decode of four rows, the first image's back in its row 0
    assert held_per_turn.count(1) <= 3  # the first image did not decode alone (its stream is 256 turns)
    assert max(held_per_turn) == 4
    for seed in (10, 20, 21, 22):
        alone = pipe(classes=[3], method="ar", sampling=keyed(pipe), seed=seed, decode=False).tokens[0]
        assert torch.equal(images[seed], engine.image_codes(alone, len(alone))[0]), seed


def test_a_request_whose_rows_do_not_fit_is_refused_in_one_line_and_decodes_hold_what_fits(pipe, monkeypatch):
    """With a simulated budget that holds two rows of the key (AR, CFG pairs), a request of 3 images
    is refused before it starts (status 400, the plan's one line), a request of 2 decodes, and a
    decode of a 4-row engine holds at most 2 rows. Catches: the per-request check skipped or
    planned for one row, the decode's rows not capped by what fits."""
    engine = Engine(pipe, max_batch=4, method="ar")
    key = Key("ar", keyed(pipe), engine.native)
    p2, p3 = (decode_plan(pipe, "ar", key.sampling, rows) for rows in (2, 3))
    assert p3.needed_bytes > p2.needed_bytes
    monkeypatch.setattr(memory, "free_bytes", lambda device: (p2.needed_bytes + p3.needed_bytes) // 2)
    events: dict[int, list] = {}

    def job(seed: int, n: int) -> Ticket:
        return Ticket(1, n, seed, key, lambda e, seed=seed: events.setdefault(seed, []).append(e))

    engine.submit(job(0, 3))
    engine.submit(job(100, 2))
    engine.submit(job(200, 1))
    held_per_turn: list[int] = []
    round_ = engine._round
    engine._round = lambda held: (held_per_turn.append(held), round_(held))[1]
    drive(engine)
    (refusal,) = events[0]
    assert refusal[0] == "error" and refusal[1] == 400 and "\n" not in refusal[2]
    assert "does not fit" in refusal[2] and f"needs {p3.needed_bytes} bytes" in refusal[2]
    assert [e[0] for e in events[100]] == ["image", "image"] and [e[0] for e in events[200]] == ["image"]
    assert held_per_turn and max(held_per_turn) == 2


def test_young_turns_is_the_longest_wait_in_which_no_sample_can_finish():
    """A row holds its first token and, after t rounds, at most 1 + t * pad: ``young_turns`` is the
    largest t (up to stream_len / PREEMPT_SHARE) at which none can have finished. Catches: one turn
    too many (a finished sample escapes being started again: the give-back would select by tokens)."""
    from specvis.serve.engine import PREEMPT_SHARE, young_turns

    for L in (4, 5, 64, 256, 1089):
        for pad in (1, 2, 18, 256):
            t = young_turns(L, pad)
            assert t == 0 or 1 + t * pad < L
            assert t <= L // PREEMPT_SHARE
            assert t == L // PREEMPT_SHARE or 1 + (t + 1) * pad >= L
