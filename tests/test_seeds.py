"""One picture per seed: keyed noise (``specvis.noise``), AR under it and ``sv.Coupled``.

Under ``Sampling(noise="keyed")`` token m of the image with seed s is argmax_v p_m(v) / E(s, m, v), and every
lossless method verifying by ``Coupled`` commits exactly that token. What must hold: the noise is a pure
function of (seed, position, code); AR's output law is the enumerated law (chi-square); every lossless method
returns AR's tokens for the same seed at any batch size and with continuous batching; ``Exact`` under keyed
noise stays exact; image k of a call with seed s is image 0 of a call with seed s + k."""

import dataclasses

import numpy as np
import pytest
import torch
from exactness import check_method, condition_rows, tiny_llamagen, tiny_prompt_model
from scipy import stats as sps

import specvis as sv
from specvis.accept import Coupled, DEFAULT_RULE
from specvis.models.drafter import EagleDrafter
from specvis.noise import exponentials, seed_tensor, uniforms
from specvis.registry import method_from_spec

P_MIN = 1e-3
KEYED = sv.Sampling(temperature=1.0, cfg_scale=2.5, noise="keyed")
SAMPLINGS = {  # the harness's samplings (tests/test_exactness.py), keyed
    "plain": sv.Sampling(temperature=1.0, noise="keyed"),
    "cfg_t0.7": sv.Sampling(temperature=0.7, cfg_scale=2.5, noise="keyed"),
    "topk_t1.3": sv.Sampling(temperature=1.3, top_k=2, cfg_scale=1.5, noise="keyed"),
    "topp_flat": sv.Sampling(temperature=1.6, top_p=0.7, noise="keyed"),
}


# ---- the noise ----
def test_noise_is_a_function_of_seed_position_and_code_alone():
    """Rows permuted, fewer rows, other positions alongside, a wider vocabulary: the same values."""
    seeds = seed_tensor([0, 1, 2**32, 2**63 + 5, 2**64 - 1], "cpu")
    pos = torch.tensor([[0, 1, 7], [3, 4, 5], [0, 1, 2], [9, 10, 11], [0, 100, 1000]])
    e = exponentials(seeds, pos, 16)
    perm = torch.tensor([3, 0, 4, 1, 2])
    assert torch.equal(exponentials(seeds[perm], pos[perm], 16), e[perm])
    assert torch.equal(exponentials(seeds[2:3], pos[2:3, 1:], 16), e[2:3, 1:])
    assert torch.equal(exponentials(seeds, pos, 40)[..., :16], e)
    assert e.dtype == torch.float64 and bool((e > 0).all()) and bool(torch.isfinite(e).all())


def test_every_input_of_the_hash_moves_the_noise():
    """The seed's low word, its high word, the position and the code each change every draw."""
    s = seed_tensor([7, 7 + 2**32, 8, 2**63 + 7], "cpu")
    e = exponentials(s, torch.zeros(4, 2, dtype=torch.long) + torch.tensor([0, 1]), 32)
    for a in range(4):
        for b in range(a + 1, 4):
            assert bool((e[a] != e[b]).all()), (a, b)
    assert bool((e[:, 0] != e[:, 1]).all())  # position
    assert bool((e[..., :-1] != e[..., 1:]).all())  # code


def test_uniforms_are_uniform_on_the_53_bit_grid():
    """Kolmogorov-Smirnov over 200,000 draws (fixed seeds) and the grid's lowest bits both ways: the
    uniforms are k 2^-53 for a 53-bit k whose low word varies (a race has ``sampling.exponential``'s
    resolution)."""
    u = uniforms(seed_tensor(range(100), "cpu"), torch.arange(20).expand(100, -1), 100).flatten()
    assert sps.kstest(u.numpy(), "uniform").pvalue > P_MIN
    k = (u * 2.0**53).long()
    assert torch.equal(k.double() * 2.0**-53, u)
    assert 0.45 < float((k & 1).double().mean()) < 0.55
    assert 0.45 < float(((k >> 26) & 1).double().mean()) < 0.55
    # neighbouring codes and positions are uncorrelated
    grid = u.view(100, 20, 100)
    assert abs(np.corrcoef(grid[..., :-1].flatten(), grid[..., 1:].flatten())[0, 1]) < 0.01
    assert abs(np.corrcoef(grid[:, :-1].flatten(), grid[:, 1:].flatten())[0, 1]) < 0.01


def test_seeds_outside_64_bits_are_refused():
    with pytest.raises(ValueError, match="seed"):
        seed_tensor([2**64], "cpu")
    with pytest.raises(ValueError, match=r"seed \+ k"):
        sv.generate(tiny_llamagen(0), torch.tensor([0, 1]), sv.AR(), KEYED, seed=2**64 - 1)
    out = sv.generate(tiny_llamagen(0), torch.tensor([0, 1]), sv.AR(), KEYED, seed=2**64 - 2)
    assert out.stats.seeds == [2**64 - 2, 2**64 - 1]


# ---- models ----
@pytest.fixture(scope="module")
def models():
    """A 4x4 grid over 50 codes: its target, a draft model and an EAGLE drafter; and a row-end prompt
    model (Emu3-shaped: forced structural ids in the stream)."""
    target = tiny_llamagen(0, vocab=50, grid=4)
    return {"target": target, "draft": tiny_llamagen(1, vocab=50, grid=4, dim=16, n_layer=1, sharpness=25.0),
            "drafter": EagleDrafter.from_target(target, seed=1).eval(),
            "row-end": tiny_prompt_model(0, vocab=7, height=4, width=4, row_end=1, janus=False)}


def lossless_methods(models):
    """Every lossless method with what it needs: (method, generate keywords)."""
    d, h = {"draft": models["draft"]}, {"drafter": models["drafter"]}
    sjd = [sv.SJD(window=4, init=i, coupling=c) for i in ("random", "horizontal-repeat", "vertical-repeat",
                                                          "horizontal-sample", "vertical-sample")
           for c in ("gumbel", "maximal", "none")]
    return [(sv.Speculative(3), d), *[(m, {}) for m in sjd], (sv.EagleTree(depth=3, top_k=4, total_tokens=12), h),
            (sv.ADTTree(total_tokens=12), h), (sv.StaticTree(tree="chain"), h), (sv.StaticTree(), h)]


# ---- the law ----
@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_ar_under_keyed_noise_is_exact(target, name):
    assert check_method(target, sv.AR(), SAMPLINGS[name]) > P_MIN


def test_ar_under_keyed_noise_is_exact_with_forced_row_ends():
    model = tiny_prompt_model(0, vocab=3, height=2, width=2, row_end=1, janus=False)
    assert check_method(model, sv.AR(), SAMPLINGS["cfg_t0.7"]) > P_MIN


@pytest.mark.parametrize("method", [sv.Speculative(3), sv.SJD(window=3, init="vertical-sample", coupling="gumbel"),
                                    sv.StaticTree(tree="chain"), sv.StaticTree(tree=[[0], [1], [2], [0, 0], [1, 0]])],
                         ids=["speculative", "sjd-gumbel", "static-chain", "static-tree"])
def test_exact_under_keyed_noise_stays_exact(target, drafter, method):
    """Drafts raced against the keyed noise (the draft chain, SJD's Gumbel coupling, Gumbel-top-k children)
    and verified by ``Exact``: the enumerated law."""
    draft = tiny_llamagen(1, dim=16, n_layer=1, sharpness=25.0)
    method = dataclasses.replace(method, acceptance=sv.Exact())
    out = sv.generate(target, torch.tensor([0]), method, KEYED, draft=draft, drafter=drafter)
    assert out.method.acceptance.name == "exact"
    n = 10_000 if isinstance(method, sv.StaticTree) else 20_000  # trees: fewer grids, as tests/test_static_tree.py
    assert check_method(target, method, SAMPLINGS["cfg_t0.7"], n=n, batch=min(n, 10_000), draft=draft, drafter=drafter) > P_MIN


def test_coupled_methods_sample_the_exact_law(target):
    """Chi-square of a chain method under Coupled (every method's tokens are AR's: below)."""
    draft = tiny_llamagen(1, dim=16, n_layer=1, sharpness=25.0)
    assert check_method(target, sv.Speculative(2), SAMPLINGS["topk_t1.3"], draft=draft) > P_MIN


# ---- one picture per seed ----
def test_every_lossless_method_gives_ar_tokens_for_seeds_0_to_99(models):
    """One call with 100 conditions and seed 0 (seeds 0..99), calls of 8 (seed 8j), continuous batching
    (batch_size 4 over 13 conditions, batch_size 1 over 100) and batch-1 calls: AR's tokens for every
    lossless method, token for token."""
    target = models["target"]
    cond = torch.arange(100) % 3
    ar = sv.generate(target, cond, sv.AR(), KEYED, seed=0).tokens
    assert len({tuple(t) for t in ar.tolist()}) > 90  # seeds name different pictures
    assert torch.equal(sv.generate(target, cond, sv.AR(), KEYED, seed=0, batch_size=1).tokens, ar)
    for method, kw in lossless_methods(models):
        out = sv.generate(target, cond, method, KEYED, seed=0, **kw)
        assert out.method.acceptance == Coupled(), method
        assert torch.equal(out.tokens, ar), method
        eights = torch.cat([sv.generate(target, cond[j:j + 8], method, KEYED, seed=j, **kw).tokens
                            for j in range(0, 32, 8)])
        assert torch.equal(eights, ar[:32]), method
        ones = torch.cat([sv.generate(target, cond[j:j + 1], method, KEYED, seed=j, **kw).tokens for j in (0, 41, 99)])
        assert torch.equal(ones, ar[[0, 41, 99]]), method
        if method.refills:
            assert torch.equal(sv.generate(target, cond[:13], method, KEYED, seed=0, batch_size=4).tokens, ar[:13]), method


@pytest.mark.parametrize("sampling", [sv.Sampling(temperature=0.7, top_k=5, cfg_scale=2.0, noise="keyed"),
                                      sv.Sampling(temperature=1.0, top_p=0.9, noise="keyed")], ids=["topk", "topp"])
def test_forced_row_ends_and_prompts_keep_ar_tokens(models, sampling):
    """Emu3-shaped stream (a forced row end per row, prompts of three lengths): AR's tokens for SJD (batch and
    continuous batching) and a draft chain."""
    m = models["row-end"]
    order = [0, 1, 2, 2, 0, 1, 1, 0, 2]
    rows = condition_rows(m, order)
    ar = sv.generate(m, rows, sv.AR(), sampling, seed=3).tokens
    for method in (sv.SJD(window=5), sv.SJD(window=3, init="vertical-sample", coupling="maximal")):
        assert torch.equal(sv.generate(m, rows, method, sampling, seed=3).tokens, ar)
        assert torch.equal(sv.generate(m, rows, method, sampling, seed=3, batch_size=2).tokens, ar)
    draft = tiny_prompt_model(1, vocab=7, height=4, width=4, row_end=1, janus=False, dim=16)
    assert torch.equal(sv.generate(m, rows, sv.Speculative(4), sampling, seed=3, draft=draft).tokens, ar)


def test_image_k_is_image_0_of_seed_s_plus_k(models):
    target = models["target"]
    cond = torch.tensor([2, 0, 1, 1, 2])
    batch = sv.generate(target, cond, sv.SJD(window=4), KEYED, seed=40)
    assert batch.stats.seeds == [40, 41, 42, 43, 44]
    for k in range(5):
        alone = sv.generate(target, cond[k:k + 1], sv.AR(), KEYED, seed=40 + k)
        assert alone.stats.seeds == [40 + k]
        assert torch.equal(alone.tokens[0], batch.tokens[k])


def test_the_noise_a_method_reads_depends_on_seed_and_position_only(models, monkeypatch):
    """Every noise tensor the decoders read, recorded per (seed, position): AR at batch 6 and 2 + 4,
    SJD at batch 3 and in continuous batching, a draft chain and a tree; a pair read by several runs (or
    rounds) got the same vector each time."""
    import specvis.methods.keyed as keyed

    seen: dict[tuple[int, int], torch.Tensor] = {}
    reads = [0]

    def recording(seeds, positions, V):
        e = exponentials(seeds, positions, V)
        for b in range(seeds.shape[0]):
            for j in range(positions.shape[1]):
                key = (int(seeds[b]), int(positions[b, j]))
                if key in seen:
                    assert torch.equal(seen[key], e[b, j]), key
                    reads[0] += 1
                seen[key] = e[b, j].clone()
        return e

    monkeypatch.setattr(keyed, "exponentials", recording)
    target, cond = models["target"], torch.tensor([0, 1, 2, 0, 1, 2])
    ar = sv.generate(target, cond, sv.AR(), KEYED, seed=10).tokens
    runs = [torch.cat([sv.generate(target, cond[:2], sv.AR(), KEYED, seed=10).tokens,
                       sv.generate(target, cond[2:], sv.AR(), KEYED, seed=12).tokens])]
    runs += [torch.cat([sv.generate(target, cond[:3], sv.SJD(window=4), KEYED, seed=10).tokens,
                        sv.generate(target, cond[3:], sv.SJD(window=4), KEYED, seed=13).tokens])]
    runs += [sv.generate(target, cond, sv.SJD(window=4), KEYED, seed=10, batch_size=2).tokens,
             sv.generate(target, cond, sv.Speculative(3), KEYED, seed=10, draft=models["draft"]).tokens,
             sv.generate(target, cond, sv.EagleTree(depth=3, top_k=4, total_tokens=12), KEYED, seed=10,
                         drafter=models["drafter"]).tokens]
    assert reads[0] > 100
    for tokens in runs:
        assert torch.equal(tokens, ar)


@pytest.mark.parametrize("method", [sv.SJD(window=4), sv.EagleTree(depth=3, top_k=4, total_tokens=12)], ids=["sjd", "eagle"])
def test_captured_rounds_give_the_keyed_tokens(models, method, monkeypatch):
    """Rounds captured and replayed (the CPU stand-in of the CUDA graph API, with continuous batching for SJD):
    AR's tokens, as eager rounds give them; the noise is drawn inside the round, from tensors alone."""
    import fake_cuda

    target, cond = models["target"], torch.arange(7) % 3
    ar = sv.generate(target, cond, sv.AR(), KEYED, seed=4).tokens
    fake = fake_cuda.install(monkeypatch)
    rows = 3 if method.refills else None
    out = sv.generate(target, cond, method, KEYED, seed=4, graphs=True, batch_size=rows, drafter=models["drafter"])
    assert torch.equal(out.tokens, ar) and fake.replays >= 1


# ---- the rule and the configuration ----
def test_coupled_accepts_exactly_the_target_choice():
    """Against point masses: a draft is accepted iff it carries the mass; the residual is the point mass."""
    p = torch.zeros(2, 3, 5)
    p[0, torch.arange(3), torch.tensor([1, 2, 3])] = 1.0
    p[1, torch.arange(3), torch.tensor([4, 4, 0])] = 1.0
    q = torch.full((2, 3, 5), 0.2)
    x = torch.tensor([[1, 0, 3], [4, 4, 0]])
    alpha, residual = Coupled().chain(p, q, x)
    assert torch.equal(alpha, torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]))
    assert torch.equal(residual, p)
    alpha, residual = Coupled().sibling(p, torch.tensor([[0, 2, 3], [4, 1, 0]]))
    assert torch.equal(alpha, torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]]))
    assert torch.equal(residual, p)


def test_the_default_rule_follows_the_noise(models):
    target, cond = models["target"], torch.tensor([0, 1])
    assert sv.SJD().acceptance is DEFAULT_RULE and sv.SJD().acceptance == sv.Exact()
    assert sv.generate(target, cond, sv.SJD(window=4), KEYED).method.acceptance == Coupled()
    assert sv.generate(target, cond, sv.SJD(window=4), sv.Sampling(noise="stream")).method.acceptance == sv.Exact()
    assert sv.generate(target, cond, sv.SJD(window=4), sv.Sampling()).method.acceptance == Coupled()  # keyed by default
    explicit = sv.generate(target, cond, sv.SJD(window=4, acceptance=sv.Exact()), KEYED).method.acceptance
    assert explicit == sv.Exact() and explicit is not DEFAULT_RULE
    assert method_from_spec("sjd").acceptance is DEFAULT_RULE
    assert method_from_spec("sjd:accept=exact").acceptance is not DEFAULT_RULE
    assert method_from_spec("sjd:accept=coupled").acceptance == Coupled()


def test_keyed_configuration_errors_name_the_field(models):
    target, cond = models["target"], torch.tensor([0, 1])
    with pytest.raises(ValueError, match="noise must be one of stream, keyed"):
        sv.Sampling(noise="per-image")
    with pytest.raises(ValueError, match="needs keyed noise"):
        sv.generate(target, cond, sv.SJD(window=4, acceptance=Coupled()), sv.Sampling(noise="stream"))
    assert sv.generate(target, cond, sv.PJD(acceptance=Coupled()), KEYED).method.acceptance == Coupled()  # its rows' walk
    assert sv.generate(target, cond, sv.SJD(window=4), sv.Sampling(noise="stream")).stats.seeds == []


def test_the_default_noise_is_keyed_where_keyed_noise_applies(models):
    """``Sampling().noise`` is None, the model's default: keyed for discrete tokens decoded in stream order
    (a call without ``noise`` gives the keyed tokens and seeds, and verifies by Coupled), stream for
    continuous-token and MAR models, where an explicit keyed noise is refused in one line."""
    from specvis.pipeline import call_sampling

    target, cond = models["target"], torch.tensor([0, 1, 2])
    assert sv.Sampling().noise is None
    default = sv.generate(target, cond, sv.SJD(window=4), sv.Sampling(temperature=1.0, cfg_scale=2.5), seed=5)
    keyed = sv.generate(target, cond, sv.SJD(window=4), KEYED, seed=5)
    ar = sv.generate(target, cond, sv.AR(), KEYED, seed=5)
    assert default.method.acceptance == Coupled() and default.stats.seeds == [5, 6, 7]
    assert torch.equal(default.tokens, keyed.tokens) and torch.equal(default.tokens, ar.tokens)
    emoji = sv.load("emoji")
    assert call_sampling(emoji).noise == "keyed" and call_sampling(emoji, {"noise": "stream"}).noise == "stream"
    assert emoji(classes=[3], seed=7, decode=False).stats.seeds == [7]
    mar = sv.load("emoji-mar")
    assert call_sampling(mar).noise == "stream"
    with pytest.raises(ValueError, match="needs a discrete-token model"):
        mar(classes=[0], sampling={"noise": "keyed"}, decode=False)


def test_greedy_keyed_is_greedy(models):
    target, cond = models["target"], torch.arange(6) % 3
    greedy = sv.Sampling(temperature=0.0, cfg_scale=2.0)
    ar = sv.generate(target, cond, sv.AR(), greedy).tokens
    assert torch.equal(sv.generate(target, cond, sv.SJD(window=4), sv.Sampling(temperature=0.0, cfg_scale=2.0,
                                                                               noise="keyed"), seed=9).tokens, ar)


# ---- the embedded models (fp32, CPU) ----
EMBEDDED = {"emoji": (["sjd", "speculative:gamma=4", "eagle:total_tokens=16", "static-tree"], {"classes": [0, 7]}),
            "emoji-t2i": (["sjd", "speculative:gamma=4"], {"prompts": ["cat face", "red heart"]})}


@pytest.mark.parametrize("bundle", list(EMBEDDED))
def test_embedded_models_give_ar_images_for_every_lossless_method(bundle):
    """The trained emoji targets with their draft model and EAGLE drafter at temperature 1: two images (seeds
    0 and 1) are AR's for a chain, a self-drafting window, a deterministic and a sampled tree, at batch 2
    and with continuous batching (batch_size 1); image 1 alone (seed 1) is image 1 of the call. (Seeds
    0..N-1 for every method: ``scripts/bench_seeds.py``, ``equal_to_ar``.)"""
    specs, call = EMBEDDED[bundle]
    pipe = sv.load(bundle)
    sampling = dataclasses.replace(pipe.default_sampling, temperature=1.0, noise="keyed")
    ar = pipe(method=sv.AR(), sampling=sampling, seed=0, decode=False, **call).tokens
    for spec in specs:
        method = method_from_spec(spec)
        out = pipe(method=method, sampling=sampling, seed=0, decode=False, **call)
        assert out.method.acceptance == Coupled() and torch.equal(out.tokens, ar), spec
    refill = pipe(method=sv.SJD(), sampling=sampling, seed=0, decode=False, batch_size=1, **call)
    assert torch.equal(refill.tokens, ar)
    one = {k: v[1:] for k, v in call.items()}
    assert torch.equal(pipe(method=sv.AR(), sampling=sampling, seed=1, decode=False, **one).tokens[0], ar[1])
