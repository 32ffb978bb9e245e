"""Coupled re-drafts of SJD (MC-SJD: ``SJD(coupling="maximal" | "gumbel")``, specvis.methods.sjd).

Exactness: the chi-square harness (10,000 grids per case, three conditions mixed per batch) for
each coupling x every initialisation with CFG and top-k or top-p, a 3x3 grid whose window spans a
row, refine off; the per-forward oracle for both couplings. The maximal-coupling draw: its law is
p_new, computed exactly from the rule's keep decisions on a grid of coins, and it keeps x with
probability min(1, p_new(x) / p_old(x)). What coupling is for: where the law of a position does not
change between rounds its draft does not change (this is what catches a Gumbel vector redrawn each
round, which is still exact), and on the emoji target coupling raises the mean accepted length.
"""

import dataclasses
from functools import lru_cache

import pytest
import torch
from exactness import chi_square_pvalue, exact_law, sample_counts, tiny_llamagen
from oracle import oracle

import specvis as sv
from specvis.accept import Exact
from specvis.cli import _method, build_parser
from specvis.methods.sjd import COUPLINGS, INITS, SJD, coupling_step, maximal_coupling
from specvis.registry import method_from_spec

P_MIN = 1e-3
N = 10_000
CONDITIONS = (0, 1, 2)
SAMPLINGS = {
    "cfg_topk": sv.Sampling(temperature=1.3, top_k=3, cfg_scale=2.0, noise="stream"),
    "cfg_topp": sv.Sampling(temperature=0.8, top_p=0.8, cfg_scale=3.0, noise="stream"),
}
MODELS = {"2x2": dict(vocab=4, grid=2, dim=16, n_layer=1), "3x3": dict(vocab=3, grid=3, dim=16, n_layer=1)}


@lru_cache(maxsize=None)
def model(name: str):
    return tiny_llamagen(0, **MODELS[name])


@lru_cache(maxsize=None)
def law(model_name: str, sampling: str) -> torch.Tensor:
    return exact_law(model(model_name), list(CONDITIONS), SAMPLINGS[sampling])


def pvalue(model_name: str, method, sampling: str) -> float:
    counts = sample_counts(model(model_name), list(CONDITIONS), method, SAMPLINGS[sampling], n=N)
    return chi_square_pvalue(counts, law(model_name, sampling))


CASES = [("2x2", 3, init, True, c, s) for c in ("maximal", "gumbel")
         for init, s in zip(INITS, ["cfg_topk", "cfg_topp"] * 3)] + [
    ("3x3", 4, "vertical-sample", True, "maximal", "cfg_topk"),
    ("3x3", 4, "horizontal-repeat", True, "gumbel", "cfg_topp"),
    ("2x2", 2, "horizontal-sample", False, "maximal", "cfg_topp"),
    ("2x2", 2, "random", False, "gumbel", "cfg_topk"),
]


@pytest.mark.parametrize("grid,window,init,refine,coupling,sampling", CASES,
                         ids=[f"{g}-W{w}-{i}-{'refine' if r else 'reinit'}-{c}-{s}" for g, w, i, r, c, s in CASES])
def test_coupled_sjd_is_exact(grid, window, init, refine, coupling, sampling):
    assert pvalue(grid, SJD(window, init=init, refine=refine, coupling=coupling), sampling) > P_MIN


# ---- per-forward oracle ----
@pytest.fixture(scope="module")
def sharp():
    return tiny_llamagen(0, vocab=8, grid=4, dim=32)


@pytest.mark.parametrize("coupling", ["maximal", "gumbel"])
@pytest.mark.parametrize("init", ["horizontal-sample", "vertical-repeat"])
def test_every_target_law_is_the_teacher_forced_law(sharp, coupling, init):
    sampling = sv.Sampling(temperature=1.0, top_k=6, cfg_scale=2.0, noise="stream")
    with oracle() as report:
        sv.generate(sharp, torch.arange(6) % 3, SJD(3, init=init, coupling=coupling), sampling, seed=3)
    report.assert_ok()


# ---- the maximal-coupling draw ----
def _laws(V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    p_old = torch.softmax(3 * torch.randn(4, V, generator=g, dtype=torch.float64), -1).float()
    p_new = torch.softmax(3 * torch.randn(4, V, generator=g, dtype=torch.float64), -1).float()
    p_new[1, :2] = 0.0  # top-k style zeros where p_old has mass
    p_old[2] = torch.nn.functional.one_hot(torch.tensor(3), V).float()  # point mass (repeat init)
    p_new[3] = p_old[3]  # nothing changed: always keep
    return p_old, p_new / p_new.sum(-1, keepdim=True)


def test_maximal_coupling_law_is_p_new_exactly():
    """For every old draft x and M coins u on a uniform grid: P(keep | x) = min(1, p_new/p_old)(x),
    and sum_x p_old(x) [P(keep | x) 1{x} + P(reject | x) law(x)] = p_new."""
    V, M = 6, 4000
    p_old, p_new = _laws(V, 0)
    u = (torch.arange(M) + 0.5) / M
    law = torch.zeros(4, V, dtype=torch.float64)
    for x in range(V):
        xs = torch.full((4, M), x)
        keep, res = coupling_step(p_new[:, None].expand(-1, M, -1), p_old[:, None].expand(-1, M, -1), xs, u.expand(4, -1))
        kept = keep.double().mean(-1)
        drawn = p_old[:, x] > 0
        ratio = (p_new[:, x] / p_old[:, x].clamp_min(1e-30)).clamp(max=1)
        assert torch.allclose(kept[drawn], ratio[drawn].double(), atol=1.0 / M), (x, kept, ratio)
        law[:, x] += p_old[:, x].double() * kept
        law += (p_old[:, x].double() * (1 - kept))[:, None] * res[:, 0].double()
    assert torch.allclose(law, p_new.double(), atol=2.0 / M), (law, p_new)


def test_maximal_coupling_draws_p_new_and_keeps():
    V, n = 6, 200_000
    p_old, p_new = _laws(V, 1)
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(p_old, n, replacement=True, generator=g)  # (4, n)
    y = maximal_coupling(p_new[:, None].expand(-1, n, -1), p_old[:, None].expand(-1, n, -1), x, g)
    freq = torch.nn.functional.one_hot(y, V).double().mean(1)
    assert (freq - p_new.double()).abs().max() < 0.006, (freq, p_new)
    keep = (y == x).double().mean(1)
    want = (p_old * torch.minimum(p_old, p_new) / p_old.clamp_min(1e-30)).sum(-1)  # sum_x min(p_old, p_new)
    assert (keep - want.double()).abs().max() < 0.006, (keep, want)
    assert bool((y[3] == x[3]).all())  # p_new == p_old: the draft stays


# ---- what coupling does: a draft stays while its law does not change ----
@pytest.fixture(scope="module")
def easy_target():
    """Token embeddings zeroed: the law of a position does not depend on the drafts before it."""
    m = tiny_llamagen(2, grid=4)
    with torch.no_grad():
        m.tok_embeddings.weight.zero_()
    return m


def _draft_histories(target, method, B: int = 8) -> dict:
    """(row, position) -> the draft tokens fed at that position, forward after forward."""
    seen: dict = {}
    forward, L = target.forward_tokens, target.layout.num_tokens

    def recording(tokens, positions, mask=None):
        for r in range(B):
            for t, pos in zip(tokens[r, 1:].tolist(), positions[r, 1:].tolist()):  # slot 0: the committed token
                if pos < L:  # past the grid: never used
                    seen.setdefault((r, pos), []).append(t)
        return forward(tokens, positions, mask)

    target.forward_tokens = recording
    try:
        sv.generate(target, torch.arange(B) % 3, method, sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream"), seed=0)
    finally:
        del target.forward_tokens
    return seen


class Coin(Exact):
    """Rejects half the drafts that Exact accepts (not exact: it only makes rounds re-draft)."""

    def chain(self, p, q, x, soft=None):
        alpha, _ = super().chain(p, q, x)
        return 0.5 * alpha, p


@pytest.mark.parametrize("coupling", COUPLINGS)
def test_a_draft_stays_while_its_law_does_not_change(easy_target, coupling):
    """Every refinement of a position draws from the same law: coupled drafts never move after the
    first refinement (the first draft is the uniform initialisation), uncoupled ones do."""
    seen = _draft_histories(easy_target, SJD(6, coupling=coupling, acceptance=Coin()))
    moved = sum(len(set(h[1:])) > 1 for h in seen.values())
    refined = sum(len(h) > 2 for h in seen.values())  # refined at least twice
    assert refined > 20
    if coupling == "none":
        assert moved > refined // 4, (moved, refined)
    else:
        assert moved == 0, (moved, refined)


# ---- greedy: coupling changes nothing ----
@pytest.mark.parametrize("coupling", ["maximal", "gumbel"])
def test_greedy_coupled_sjd_equals_greedy_ar(coupling):
    target, greedy = tiny_llamagen(3, grid=4), sv.Sampling(temperature=0.0, cfg_scale=2.0, noise="stream")
    cond = torch.arange(12) % 3
    ar = sv.generate(target, cond, sv.AR(), greedy, seed=0).tokens
    for init in ("random", "vertical-repeat"):
        out = sv.generate(target, cond, SJD(5, init=init, coupling=coupling), greedy, seed=1)
        assert torch.equal(out.tokens, ar), init


# ---- coupling raises the accepted length on the emoji target ----
def test_coupling_raises_accepted_length_on_emoji():
    """Measured (4 images, window 16, seed 0, stream noise: the couplings of SJD's drafts under Exact)."""
    emoji = sv.load("emoji")
    cond = torch.tensor([0, 3, 6, 9])
    mal = {c: sv.generate(emoji.target, cond, SJD(16, coupling=c),
                                 dataclasses.replace(emoji.default_sampling, noise="stream"), seed=0)
           .stats.mean_accepted_length for c in COUPLINGS}
    assert mal["maximal"] > mal["none"] + 0.1 and mal["gumbel"] > mal["none"] + 0.1, mal


# ---- configuration ----
def test_bad_coupling_names_the_field():
    with pytest.raises(ValueError, match="coupling"):
        SJD(coupling="optimal")


def test_coupling_from_cli_and_spec():
    assert _method(build_parser().parse_args(["generate", "--method", "sjd", "--coupling", "gumbel"])) == SJD(coupling="gumbel")
    assert method_from_spec("sjd:window=8:coupling=maximal") == SJD(8, coupling="maximal")
    assert SJD().coupling == "gumbel"  # the measured default (docs/results/archive/successors.md)
    assert method_from_spec("sjd:coupling=none") == SJD(coupling="none")  # "none" is a value here, not "default"
    assert method_from_spec("sjd:window=8:gamma=none") == SJD(8)  # elsewhere "none" still means unset


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("coupling", ["maximal", "gumbel"])
def test_graphs_replay_eager(coupling):
    target = tiny_llamagen(0, vocab=8, grid=4).cuda()
    sampling = sv.Sampling(temperature=1.0, top_k=6, cfg_scale=2.0, noise="stream")
    for init in ("horizontal-repeat", "vertical-sample"):
        outs = [sv.generate(target, torch.arange(6) % 3, SJD(3, init=init, coupling=coupling), sampling, seed=3,
                            graphs=g) for g in (False, True)]
        assert torch.equal(outs[0].tokens, outs[1].tokens)
        assert torch.equal(outs[0].stats.accept_map, outs[1].stats.accept_map)

