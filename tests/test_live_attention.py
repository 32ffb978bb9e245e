"""Live attention spans (models/base.py ``KVCache.live``): cached forwards attend over the first L
slots of the static cache only, L a bucket multiple covering a host-side bound on every row's length
plus the block. The laws must be today's (the sliced-off slots are masked out anyway), so every test
here compares the sliced path (small buckets, so that L < the cache's slots almost everywhere) with
the whole-cache path (``LIVE_BUCKET = 0``) and runs with ``CHECK_LIVE`` on: any forward that would
attend a slot past its span fails on the spot (a bound that is not a bound)."""

from __future__ import annotations

import contextlib
import importlib

import pytest
import torch
import fake_cuda
from exactness import condition_rows, tiny_llamagen, tiny_prompt_model
from test_oracle import METHODS

import specvis as sv
from specvis.bench.forward_cost import cost_curve
from specvis.models import base
from specvis.models.base import KVCache, Prompts
from specvis.models.drafter import EagleDrafter
from specvis.zoo import load

PROMPT_SHAPES = {"janus": dict(janus=True), "emu3": dict(janus=False, row_end=1)}


@contextlib.contextmanager
def live(bucket: int, check: bool = True):
    """Caches made inside use ``bucket`` (0: whole cache); ``check``: assert no attended slot lies past a span."""
    old = base.LIVE_BUCKET, base.CHECK_LIVE
    base.LIVE_BUCKET, base.CHECK_LIVE = bucket, check
    try:
        yield
    finally:
        base.LIVE_BUCKET, base.CHECK_LIVE = old


@contextlib.contextmanager
def spans_seen():
    """Records (cache, span, longest row + block) for every cached forward."""
    seen, original = [], KVCache.live

    def wrapped(self, n):
        span = original(self, n)
        seen.append((self, span, int(self.length.max()) + n))
        return span

    KVCache.live = wrapped
    try:
        yield seen
    finally:
        KVCache.live = original


# ---------------------------------------------------------------- one model, forward by forward
def _script(model, prefill_rows, R: int) -> list[torch.Tensor]:
    """Prefill, a causal chain block, a per-row rollback, a tree block, tree compaction, a chain block."""
    g = torch.Generator().manual_seed(7)
    V, S = model.layout.vocab_size, model.layout.stream_len
    tok = lambda n: torch.randint(0, V, (R, n), generator=g)
    model.setup_cache(R, 8)
    out = [model.prefill(prefill_rows)[0]]
    out.append(model.forward_tokens(tok(4), torch.arange(4)[None].expand(R, -1))[0])
    n = torch.tensor([3, 1, 4][:R])
    model.set_committed(n)
    # tree: root, two children of the root, a child of the first child
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    depth = torch.tensor([0, 1, 1, 2])
    out.append(model.forward_tokens(tok(4), (n[:, None] + depth).clamp_max(S - 1), tree[None].expand(R, -1, -1))[0])
    keep = torch.tensor([0, 1, 3])[None].expand(R, -1)
    count = torch.tensor([3, 2, 1][:R])
    model.keep_block(keep, count)
    n = n + count
    out.append(model.forward_tokens(tok(3), (n[:, None] + torch.arange(3)).clamp_max(S - 1))[0])
    return out


def _compare(model, rows, R):
    with live(0):
        ref = _script(model, rows, R)
    for bucket in (1, 3):
        with live(bucket), spans_seen() as seen:
            got = _script(model, rows, R)
        assert any(span < cache.slots for cache, span, _ in seen), "no forward was sliced: the test has no teeth"
        assert all(span >= need for _, span, need in seen)
        for a, b in zip(ref, got):
            assert (a - b).abs().max() < 1e-5


def test_llamagen_forwards_equal_whole_cache():
    model = tiny_llamagen(0, vocab=8, grid=4)
    _compare(model, torch.tensor([0, 1, 2]), 3)


@pytest.mark.parametrize("shape", PROMPT_SHAPES)
def test_prompt_model_forwards_equal_whole_cache(shape):
    """Prompts of different lengths: each row's prefix length differs, the padded slots are never attended."""
    model = tiny_prompt_model(0, height=3, width=3, **PROMPT_SHAPES[shape])
    _compare(model, Prompts.of([[1, 5, 3, 2], [1, 8, 2], [1, 4, 4, 6, 7, 2]]), 3)


# ---------------------------------------------------------------- every method family
@pytest.fixture(scope="module")
def llamagen_models():
    target = tiny_llamagen(0, vocab=8, grid=4)
    return target, tiny_llamagen(1, vocab=8, grid=4, dim=16, n_layer=1), EagleDrafter.from_target(target, seed=1).eval()


def _same(a, b):
    assert torch.equal(a.tokens, b.tokens)
    assert a.stats.target_forwards == b.stats.target_forwards
    assert a.stats.draft_forwards == b.stats.draft_forwards
    assert torch.equal(a.stats.accept_map, b.stats.accept_map)


@pytest.mark.parametrize("name", list(METHODS))
def test_methods_same_output_with_live_spans(llamagen_models, name):
    target, draft, drafter = llamagen_models
    method, sampling = METHODS[name]
    outs = []
    for bucket in (0, 3):
        with live(bucket):
            outs.append(sv.generate(target, torch.arange(6) % 3, method, sampling, seed=3, draft=draft, drafter=drafter))
    _same(*outs)


PROMPT_METHODS = ["ar", "speculative_g3", "jacobi_w4", "sjd_vertical-sample", "eagle", "static_tree", "adt_horizontal"]


@pytest.mark.parametrize("shape", PROMPT_SHAPES)
@pytest.mark.parametrize("name", PROMPT_METHODS)
def test_prompt_methods_same_output_with_live_spans(shape, name):
    target = tiny_prompt_model(0, height=3, width=3, **PROMPT_SHAPES[shape])
    draft = tiny_prompt_model(1, height=3, width=3, **PROMPT_SHAPES[shape])
    drafter = EagleDrafter.from_target(target, seed=1).eval()
    method, sampling = METHODS[name]
    rows = condition_rows(target, [0, 1, 2, 1])
    outs = []
    for bucket in (0, 2):
        with live(bucket):
            outs.append(sv.generate(target, rows, method, sampling, seed=3, draft=draft, drafter=drafter))
    _same(*outs)


def test_cspd_same_latents_with_live_spans():
    from test_cspd import mlp_model

    generate_latents = importlib.import_module("specvis.generate").generate_latents
    t, d = mlp_model(0, C=2, K=4, grid=(3, 3)), mlp_model(1, C=2, K=4, grid=(3, 3))
    method = sv.CSpD(gamma=2, prefill=0.0)
    outs = []
    for bucket in (0, 2):
        with live(bucket), spans_seen() as seen:
            outs.append(generate_latents(t, torch.tensor([0, 1, 2, 0]), method, sv.Sampling(cfg_scale=2.0, noise="stream"), draft=d)[0])
        if bucket:
            assert any(span < cache.slots for cache, span, _ in seen)
    assert (outs[0] - outs[1]).abs().max() < 1e-5


# ---------------------------------------------------------------- the bound is tight, the done-check tightens it
def _target_gap(refresh: bool) -> int:
    """Largest (span - longest row - block) over the target forwards of a speculative decode, bucket 4."""
    target = tiny_llamagen(0, vocab=8, grid=8)
    draft = tiny_llamagen(1, vocab=8, grid=8, dim=16, n_layer=1)
    original = KVCache.refresh
    if not refresh:
        KVCache.refresh = lambda self, longest: None
    try:
        with live(4), spans_seen() as seen:
            sv.generate(target, torch.arange(4) % 3, sv.Speculative(gamma=3), METHODS["speculative_g3"][1], seed=0,
                        draft=draft)
    finally:
        KVCache.refresh = original
    gaps = [span - need for cache, span, need in seen if cache is target.cache and span < cache.slots]
    assert gaps
    return max(gaps)


def test_done_check_keeps_spans_within_a_bucket_of_the_longest_row():
    """Every target span exceeds what the longest row needs by less than a bucket (4 slots) thanks to
    the done-check's refresh; without it the host bound drifts (it grows by the whole block per round)."""
    assert 0 <= _target_gap(refresh=True) < 4
    assert _target_gap(refresh=False) >= 8


def test_pins_and_overflow():
    c = KVCache(1, 2, 1, 40, 2, torch.float32, torch.device("cpu"), bucket=8)
    assert c.live(5) == 8 and c.bound == 5
    assert c.mark(growth=6) == 16  # bound 5 + 6 -> bucket 16
    assert [c.live(2), c.live(4)] == [16, 16] and not c.overflow
    assert c.trace == [2, 6]
    c.mark(growth=1)  # pinned to span(12) = 16; a forward of 9 needs 21
    assert c.live(9) == 24 and c.overflow
    c.refresh(3)
    assert c.mark(growth=50) == 40  # never more than the cache
    assert KVCache(1, 1, 1, 40, 2, torch.float32, torch.device("cpu"), bucket=0).live(1) == 40


# ---------------------------------------------------------------- captured rounds keyed by span (CPU stand-in)
@pytest.mark.parametrize("name", ["ar", "speculative_g3", "sjd_vertical-sample", "jacobi_w4", "eagle", "static_tree"])
def test_graph_rounds_keyed_by_span_replay_eager(name, monkeypatch):
    """With the stand-in: same tokens, forward counts and acceptance maps as eager rounds; the graph
    is recaptured as the spans grow (several captures), and every replay runs at its captured spans."""
    target = tiny_llamagen(0, vocab=8, grid=8)
    draft = tiny_llamagen(1, vocab=8, grid=8, dim=16, n_layer=1)
    drafter = EagleDrafter.from_target(target, seed=1).eval()
    method, sampling = METHODS[name]
    with live(8):
        eager = sv.generate(target, torch.arange(4) % 3, method, sampling, seed=3, draft=draft, drafter=drafter)
    fake = fake_cuda.install(monkeypatch)
    with live(8):
        graphed = sv.generate(target, torch.arange(4) % 3, method, sampling, seed=3, draft=draft, drafter=drafter,
                              graphs=True)
    _same(eager, graphed)
    assert fake.captures >= 2 and fake.replays >= 1, (fake.captures, fake.replays)


def test_cost_curve_prices_forwards_over_the_half_filled_stream():
    """The cost curve times each forward after a half-filled stream, so its attention must read that
    many slots: with spans checked, a curve whose live spans covered only the prompt (the bound left
    at the prefill's) attends committed slots past its span and raises; every span covers the rows."""
    pipe = load("random-tiny")
    with live(8), spans_seen() as seen:
        curve = cost_curve(pipe, {"target": [1, 3], "draft": [1, 2]}, batch_size=2, repeats=1)
    assert set(curve) == {"target", "draft"}
    half = pipe.target.layout.stream_len // 2
    assert seen and all(span >= need for _, span, need in seen)
    assert max(span for _, span, _ in seen) >= half
