"""Exactness of AR, draft-model speculative sampling and SJD (each coupling) against the enumerated law (docs/design/api.md).

Each case draws 20,000 grids (3 conditions, batches of 10,000 mixing them) from a
2x2 grid over 4 codes and runs a chi-square test at fixed seeds: a wrong residual, an off-by-one
position, a missing bonus token or a CFG/top-k/top-p mistake shifts the law by far more than the
test's resolution (see the broken-rule check, which must fail).
"""

import pytest
import torch

import specvis as sv
from specvis.accept import Exact
from exactness import check_method, tiny_llamagen

P_MIN = 1e-3

SAMPLINGS = {
    "plain": sv.Sampling(temperature=1.0, noise="stream"),
    "cfg_t0.7": sv.Sampling(temperature=0.7, cfg_scale=2.5, noise="stream"),
    "topk_t1.3": sv.Sampling(temperature=1.3, top_k=2, cfg_scale=1.5, noise="stream"),
    "topp": sv.Sampling(temperature=1.0, top_p=0.8, cfg_scale=3.0, noise="stream"),
    # a flatter law, where the nucleus usually holds 2-3 of the 4 codes: a top-p that keeps one
    # token too few changes it (under CFG 3 the top code alone mostly exceeds 0.8)
    "topp_flat": sv.Sampling(temperature=1.6, top_p=0.7, noise="stream"),
}


@pytest.fixture(scope="module")
def draft():
    return tiny_llamagen(1, dim=16, n_layer=1, sharpness=25.0)


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_ar_is_exact(target, name):
    assert check_method(target, sv.AR(), SAMPLINGS[name]) > P_MIN


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_speculative_is_exact(target, draft, gamma, name):
    assert check_method(target, sv.Speculative(gamma), SAMPLINGS[name], draft=draft) > P_MIN


@pytest.mark.parametrize("coupling", ["none", "maximal", "gumbel"])
@pytest.mark.parametrize("name", ["cfg_t0.7", "topp"])
def test_sjd_is_exact_with_each_coupling(target, coupling, name):
    """SJD with each re-draft coupling named explicitly: the paper's uncoupled SJD ("none") keeps its own
    test now that Gumbel coupling is the default (the full sweeps: tests/test_sjd.py, tests/test_coupling.py)."""
    method = sv.SJD(window=3, init="vertical-sample", coupling=coupling)
    assert check_method(target, method, SAMPLINGS[name]) > P_MIN


class BrokenResidual(Exact):
    """Resamples from max(0, q - p) instead of max(0, p - q): the harness must reject it."""

    def chain(self, p, q, x, soft=None):
        alpha, _ = super().chain(p, q, x)
        return alpha, (q - p).clamp_min(0.0)


def test_harness_rejects_broken_residual(target, draft):
    p = check_method(target, sv.Speculative(3, acceptance=BrokenResidual()), SAMPLINGS["cfg_t0.7"], draft=draft)
    assert p < 1e-6


def test_harness_rejects_biased_acceptance(target, draft):
    class AlwaysAccept(Exact):
        def chain(self, p, q, x, soft=None):
            alpha, res = super().chain(p, q, x)
            return torch.ones_like(alpha), res

    assert check_method(target, sv.Speculative(2, acceptance=AlwaysAccept()), SAMPLINGS["plain"], draft=draft) < 1e-6


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_speculative_equals_greedy_ar(target, draft, gamma):
    greedy = sv.Sampling(temperature=0.0, cfg_scale=2.0, noise="stream")
    cond = torch.arange(64) % 3
    ar = sv.generate(target, cond, sv.AR(), greedy, seed=0).tokens
    sp = sv.generate(target, cond, sv.Speculative(gamma), greedy, seed=5, draft=draft).tokens
    assert torch.equal(ar, sp)


def test_rows_advance_independently(target, draft):
    """Per-row acceptance: rows finish after different numbers of rounds, so the per-row mean
    accepted length exceeds the batch's tokens per batched forward (a lock-step batch has equality)."""
    out = sv.generate(target, torch.arange(64) % 3, sv.Speculative(3), SAMPLINGS["plain"], seed=0, draft=draft)
    assert out.stats.mean_accepted_length > out.stats.step_compression * 1.05
    assert out.stats.accept_map.shape == (64, 2, 2)
