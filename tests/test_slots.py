"""Continuous batching (``generate(batch_size=)``, ``methods/slots.py``): a finished row restarts with the
next condition, and the restarted sample is decoded exactly as if it ran alone.

The tiny models' laws depend on the whole prefix and on position (``exactness.tiny_llamagen``), so a
restarted row that kept any key or value of its previous sample, its prefix length, its tracked
positions or its committed buffer would change greedy tokens."""

import fake_cuda
import pytest
import torch
from exactness import check_method, condition_rows, tiny_llamagen, tiny_prompt_model

import specvis as sv
from specvis.models.continuous import ContinuousAR, ContinuousARConfig

GREEDY = sv.Sampling(temperature=0.0, cfg_scale=2.0, noise="stream")
ORDER = [0, 1, 2, 2, 0, 1, 1]  # seven samples, the harness prompts of three lengths in mixed order


@pytest.fixture(scope="module")
def layouts():
    """Every layout: LlamaGen (class ids, 2-D RoPE), Janus-shaped (prompts of three lengths, 1-D RoPE),
    one and two forced row ends (Emu3/Lumina-shaped)."""
    return {"llamagen": tiny_llamagen(0, vocab=50, grid=6),
            "janus": tiny_prompt_model(0, vocab=7, height=6, width=6),
            "row-end": tiny_prompt_model(0, vocab=7, height=6, width=6, row_end=1, janus=False),
            "two-row-ends": tiny_prompt_model(0, vocab=7, height=6, width=6, row_end=2, janus=False)}


def _alone(model, method, order):
    """Each sample decoded by itself (batch 1)."""
    return torch.cat([sv.generate(model, condition_rows(model, order, torch.tensor([i])), method, GREEDY).tokens
                      for i in range(len(order))])


METHODS = {"ar": sv.AR(), "zipar": sv.ZipAR(window=2), "pjd-rows-apart": sv.PJD(lag=6, keep_threshold=1.0),
           "sjd": sv.SJD(window=4, init="vertical-sample"), "jacobi": sv.Jacobi(window=4)}
EXACT = ("pjd-rows-apart", "sjd", "jacobi")  # greedy AR token for token


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", ["llamagen", "janus", "row-end", "two-row-ends"])
@pytest.mark.parametrize("rows", [2, 3])
def test_a_restarted_row_decodes_its_sample_as_alone(layouts, name, method, rows):
    """Greedy, 7 samples through 2 or 3 rows: every sample's tokens equal its batch-1 run, in the
    conditions' order. ZipAR (window 2: rows in flight, positions tracked) is deterministic when greedy;
    SJD, Jacobi and PJD with rows apart (lag = width, no keep) are exact, so greedy AR. Catches a restarted row that
    attends to its previous sample's slots, keeps its prefix length or 2-D row state, or tokens returned
    out of order."""
    m = layouts[name]
    reference = _alone(m, METHODS["ar"] if method in EXACT else METHODS[method], ORDER)
    out = sv.generate(m, condition_rows(m, ORDER), METHODS[method], GREEDY, batch_size=rows)
    assert out.tokens.shape == reference.shape
    assert torch.equal(out.tokens, reference)
    assert out.stats.accept_map.shape[0] == len(ORDER)


def test_ar_takes_the_forwards_of_its_batches(layouts):
    """AR's rows finish together, so 7 samples through 3 rows take 3 waves of L forwards each (the
    prefill or prefix forward that yields a sample's first token, then L - 1 rounds), as three
    separate batches would; step compression is each row's tokens over the forwards."""
    m = layouts["row-end"]
    L = m.layout.stream_len
    out = sv.generate(m, condition_rows(m, ORDER), sv.AR(), GREEDY, batch_size=3)
    assert out.stats.target_forwards == 3 * L
    assert out.stats.step_compression == pytest.approx(36 * 7 / 3 / (3 * L))


def test_uneven_samples_keep_every_row_busy(layouts):
    """ZipAR at window 2 on the 1-D layout: every sample takes the same forwards alone, so the queue
    takes those of ceil(Q / S) waves plus nothing for waiting; with fewer rows than samples the
    forwards exceed one batch's and the mean accepted length is the batch-1 one."""
    m = layouts["janus"]
    alone = sv.generate(m, condition_rows(m, ORDER[:1]), sv.ZipAR(window=2), GREEDY)
    out = sv.generate(m, condition_rows(m, ORDER), sv.ZipAR(window=2), GREEDY, batch_size=2)
    assert out.stats.target_forwards == 4 * alone.stats.target_forwards
    assert out.stats.mean_accepted_length == pytest.approx(alone.stats.mean_accepted_length)


def test_a_batch_size_at_or_above_the_conditions_is_one_batch(layouts):
    m = layouts["janus"]
    plain = sv.generate(m, condition_rows(m, ORDER), sv.ZipAR(window=2), GREEDY)
    same = sv.generate(m, condition_rows(m, ORDER), sv.ZipAR(window=2), GREEDY, batch_size=len(ORDER))
    assert torch.equal(plain.tokens, same.tokens)
    assert plain.stats.target_forwards == same.stats.target_forwards


def test_progress_reaches_one_over_all_samples(layouts):
    m = layouts["llamagen"]
    seen = []
    sv.generate(m, condition_rows(m, ORDER), sv.AR(), GREEDY, batch_size=3, progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 1.0 and seen[0] < 0.2


def test_methods_that_cannot_restart_rows_are_refused(layouts):
    m = layouts["llamagen"]
    with pytest.raises(ValueError, match="method speculative does not support; methods that do: ar, jacobi, sjd, "
                                         "zipar, pjd"):
        sv.generate(m, torch.tensor(ORDER), sv.Speculative(), GREEDY, batch_size=2, draft=m)
    with pytest.raises(ValueError, match="not a continuous-token or ordered"):
        cfg = ContinuousARConfig(token_dim=1, height=2, width=2, dim=32, n_layer=2, n_head=2, multiple_of=16,
                                 num_classes=3, head_width=32, head_depth=2, num_train_steps=16, num_sampling_steps=8)
        sv.generate(ContinuousAR(cfg).eval(), torch.tensor([0, 1, 0]), sv.AR(), sv.Sampling(noise="stream"), batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        sv.generate(m, torch.tensor(ORDER), sv.AR(), GREEDY, batch_size=0)


@pytest.mark.parametrize("method", [sv.AR(), sv.SJD(window=3, init="vertical-sample", coupling="gumbel"),
                                    sv.SJD(window=3, init="vertical-sample", coupling="maximal")],
                         ids=["ar", "sjd-gumbel", "sjd-maximal"])
def test_restarted_rows_sample_the_exact_law(target, method):
    """20,000 grids (2x2 over 4 codes, CFG 2.5, T 0.7) through 97 rows, so rows restart at every round
    in staggered waves: chi-square against the enumerated law. Catches a first token drawn from another
    sample's prefix law, a restarted SJD window whose laws, ring or Gumbel race are a previous sample's,
    or the kept rows' ring or race overwritten by a restart."""
    sampling = sv.Sampling(temperature=0.7, cfg_scale=2.5, noise="stream")
    assert check_method(target, method, sampling, batch=5000, batch_size=97) > 1e-3


@pytest.mark.parametrize("method", [sv.AR(), sv.SJD(window=4, init="vertical-sample")], ids=["ar", "sjd"])
def test_captured_rounds_restart_rows_as_eager_rounds_do(layouts, method, monkeypatch):
    """Rows restart between replays of a captured round (the CPU stand-in of the CUDA graph API):
    the same tokens and forwards as eager rounds at temperature 1, so a restart writes only state the
    captured round reads in place."""
    m = layouts["row-end"]
    sampling = sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream")
    eager = sv.generate(m, condition_rows(m, ORDER), method, sampling, seed=5, batch_size=3)
    fake = fake_cuda.install(monkeypatch)
    graphed = sv.generate(m, condition_rows(m, ORDER), method, sampling, seed=5, batch_size=3, graphs=True)
    assert torch.equal(eager.tokens, graphed.tokens)
    assert eager.stats.target_forwards == graphed.stats.target_forwards
    assert fake.replays >= 1


def test_a_pipeline_call_checks_batch_size_before_any_forward():
    """``pipe(..., batch_size=)``: one-line errors naming the argument, and the images of the call in
    the classes' order (AR: 3 samples through 2 rows, two waves of the stream's forwards)."""
    from specvis.zoo import load

    pipe = load("random-tiny")
    for bad in (0, -1, "x", 2.5):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            pipe([1, 2, 3], "ar", batch_size=bad)
    out = pipe([1, 2, 3], "ar", GREEDY, batch_size=2)
    alone = pipe([3], "ar", GREEDY)
    assert len(out.images) == 3 and out.stats.target_forwards == 2 * pipe.target.layout.stream_len
    assert torch.equal(out.tokens[2], alone.tokens[0])


@pytest.mark.parametrize("grid", [2, 6])
@pytest.mark.parametrize("method", [sv.AR(), sv.SJD(window=4), sv.ZipAR(window=1)], ids=["ar", "sjd", "zipar"])
def test_restarted_rows_stay_inside_the_live_span(grid, method):
    """With live spans of 8 slots checked (``CHECK_LIVE``), no forward attends a slot past its span while
    rows restart: the caches' bound must cover a restarted row's new prefix even when it is longer than
    the stream of the row it replaces, and the tokens equal the whole-cache run's. Two sets: the harness
    prompts (up to 6 tokens), and short prompts (3 tokens: rows of 3 + 4 slots on the 2x2 grid, inside
    the first bucket) followed by prompts of 12 tokens restarting those rows, whose prefix crosses into
    the second bucket. Catches: ``load_prefixes`` not raising the cache's bound (``decoder.py``)."""
    from specvis.models.base import Condition, Prompts
    from test_live_attention import live

    m = tiny_prompt_model(0, vocab=7, height=grid, width=grid)
    short, long = [1, 5, 2], [1, 4, 4, 6, 7, 3, 5, 8, 6, 4, 7, 2]
    prompts = [short, short, short, long, long, short, long]
    restarting = Condition(Prompts.of(prompts), Prompts.of([m.unconditional(Prompts.of([q])).ids[0].tolist()
                                                             for q in prompts]))
    for conditions in (condition_rows(m, ORDER), restarting):
        whole = sv.generate(m, conditions, method, GREEDY, batch_size=3)
        with live(8):
            spanned = sv.generate(m, conditions, method, GREEDY, batch_size=3)
        assert torch.equal(whole.tokens, spanned.tokens)
