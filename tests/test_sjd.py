"""Jacobi decoding and Speculative Jacobi Decoding (specvis.methods.sjd).

Exactness: SJD's output law is tested against the enumerated law of docs/design/api.md with the chi-square
harness of ``exactness.py`` (20,000 grids per case in batches of 10,000 rows that mix three
conditions, so every row's window sits at its own position): every initialisation, windows 1, 2, 3,
4, 5 and larger than the grid, refine on and off, CFG, top-k, top-p and temperature != 1, on a 2x2
grid over 4 codes and on a 3x3 grid over 3 codes (19,683 grids) where the window spans more than a
grid row, so vertical initialisations find their "above" token inside the window and horizontal ones
wrap to a new row. Two deliberately wrong variants must fail (p < 1e-6). Greedy Jacobi and greedy
SJD must equal greedy AR token for token. The sweep runs the paper's SJD, uncoupled (``coupling="none"``;
the default is Gumbel coupling, whose own sweep is tests/test_coupling.py).
"""

from functools import lru_cache

import pytest
import torch

import specvis as sv
from specvis.accept import Exact
from specvis.methods.jacobi import Jacobi
from specvis.methods.sjd import INITS, SJD
from exactness import chi_square_pvalue, exact_law, sample_counts, tiny_llamagen

P_MIN = 1e-3
CONDITIONS = (0, 1, 2)

SAMPLINGS = {
    "plain": sv.Sampling(temperature=1.0, noise="stream"),
    "cfg_t0.7": sv.Sampling(temperature=0.7, cfg_scale=2.5, noise="stream"),
    "topk_t1.3": sv.Sampling(temperature=1.3, top_k=2, cfg_scale=1.5, noise="stream"),
    "topp": sv.Sampling(temperature=1.0, top_p=0.8, cfg_scale=3.0, noise="stream"),
    "topk_t1.3_nocfg": sv.Sampling(temperature=1.3, top_k=2, noise="stream"),
}

# Small models keep the 10,000-row batches cheap; their laws are sharp (see tiny_llamagen).
MODELS = {
    "2x2": dict(vocab=4, grid=2, dim=16, n_layer=1),
    "3x3": dict(vocab=3, grid=3, dim=16, n_layer=1),
}


@lru_cache(maxsize=None)
def model(name: str):
    return tiny_llamagen(0, **MODELS[name])


@lru_cache(maxsize=None)
def law(model_name: str, sampling_name: str) -> torch.Tensor:
    return exact_law(model(model_name), list(CONDITIONS), SAMPLINGS[sampling_name])


def pvalue(model_name: str, method, sampling_name: str) -> float:
    counts = sample_counts(model(model_name), list(CONDITIONS), method, SAMPLINGS[sampling_name])
    return chi_square_pvalue(counts, law(model_name, sampling_name))


# (grid, window, init, refine, sampling): every init x window 3 x two samplings, windows 1, 2, 6
# (> the 4-token grid), refine off, and the 3x3 grid where windows span more than a row.
CASES = [("2x2", 3, init, True, s) for init in INITS for s in ("cfg_t0.7", "topp")] + [
    ("2x2", 1, "random", True, "plain"),
    ("2x2", 1, "horizontal-sample", True, "topk_t1.3"),
    ("2x2", 2, "random", True, "topk_t1.3"),
    ("2x2", 2, "horizontal-sample", True, "cfg_t0.7"),
    ("2x2", 6, "random", True, "cfg_t0.7"),
    ("2x2", 6, "horizontal-sample", True, "topp"),
    ("2x2", 6, "vertical-repeat", True, "topk_t1.3"),
    ("2x2", 3, "vertical-sample", False, "cfg_t0.7"),
    ("2x2", 2, "horizontal-repeat", False, "plain"),
    ("3x3", 4, "vertical-sample", True, "plain"),
    ("3x3", 4, "vertical-repeat", False, "topk_t1.3_nocfg"),
    ("3x3", 5, "horizontal-repeat", True, "cfg_t0.7"),
]


@pytest.mark.parametrize("grid,window,init,refine,sampling", CASES,
                         ids=[f"{g}-W{w}-{i}-{'refine' if r else 'reinit'}-{s}" for g, w, i, r, s in CASES])
def test_sjd_is_exact(grid, window, init, refine, sampling):
    assert pvalue(grid, SJD(window, init=init, refine=refine, coupling="none"), sampling) > P_MIN


class ResidualFromP(Exact):
    """Resamples from p_new on rejection instead of max(0, p_new - p_old)."""

    def chain(self, p, q, x, soft=None):
        alpha, _ = super().chain(p, q, x)
        return alpha, p


class UniformQ(Exact):
    """Uses the random-init law for every draft instead of the law it was drawn from (a refined
    token's law is p_old): the ratio min(1, p/q) is computed with the wrong q."""

    def chain(self, p, q, x, soft=None):
        return super().chain(p, torch.full_like(q, 1.0 / q.shape[-1]), x)


def test_harness_rejects_residual_without_p_old():
    assert pvalue("2x2", SJD(3, acceptance=ResidualFromP()), "cfg_t0.7") < 1e-6


def test_harness_rejects_wrong_draft_law():
    assert pvalue("2x2", SJD(3, init="horizontal-sample", acceptance=UniformQ()), "plain") < 1e-6


# ---- greedy: Jacobi and SJD reproduce greedy AR ----
GREEDY = sv.Sampling(temperature=0.0, cfg_scale=2.0, noise="stream")


@pytest.fixture(scope="module")
def greedy_target():
    return tiny_llamagen(3, grid=4)


@pytest.fixture(scope="module")
def greedy_ar(greedy_target):
    cond = torch.arange(48) % 3
    return cond, sv.generate(greedy_target, cond, sv.AR(), GREEDY, seed=0).tokens


@pytest.mark.parametrize("window", [1, 2, 5, 16, 20])
def test_jacobi_equals_greedy_ar(greedy_target, greedy_ar, window):
    cond, ar = greedy_ar
    out = sv.generate(greedy_target, cond, Jacobi(window), GREEDY, seed=7)
    assert torch.equal(out.tokens, ar)
    assert out.stats.target_forwards <= greedy_target.layout.num_tokens  # never worse than AR


@pytest.mark.parametrize("init", INITS)
@pytest.mark.parametrize("window", [3, 17])
def test_greedy_sjd_equals_greedy_ar(greedy_target, greedy_ar, window, init):
    cond, ar = greedy_ar
    for refine in (True, False):
        out = sv.generate(greedy_target, cond, SJD(window, init=init, refine=refine), GREEDY, seed=11)
        assert torch.equal(out.tokens, ar), (window, init, refine)


def test_jacobi_needs_greedy(greedy_target):
    with pytest.raises(ValueError, match="greedy"):
        sv.generate(greedy_target, torch.tensor([0]), Jacobi(4), sv.Sampling(temperature=1.0, noise="stream"))


# ---- step compression where drafting is easy ----
@pytest.fixture(scope="module")
def easy_target():
    """Token embeddings zeroed: every law depends on the position only, so a refined draft is
    drawn from exactly the target law and is always accepted."""
    m = tiny_llamagen(2, grid=4)
    with torch.no_grad():
        m.tok_embeddings.weight.zero_()
    return m


@pytest.mark.parametrize("init", INITS)
def test_sjd_compresses_steps_when_drafting_is_easy(easy_target, init):
    sampling = sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream")
    out = sv.generate(easy_target, torch.arange(8) % 3, SJD(4, init=init), sampling, seed=0)
    assert out.stats.step_compression > 2.0
    assert out.stats.mean_accepted_length > 2.0
    assert int(out.stats.accept_map.max()) > 1


def test_jacobi_compresses_steps_when_drafting_is_easy(easy_target):
    out = sv.generate(easy_target, torch.arange(8) % 3, Jacobi(4), GREEDY, seed=0)
    assert out.stats.step_compression > 2.0


def test_rows_advance_independently():
    """No lock-step: in one batch, rows commit different numbers of tokens per forward."""
    m = model("3x3")
    out = sv.generate(m, torch.arange(32) % 3, SJD(4), SAMPLINGS["plain"], seed=0)
    am = out.stats.accept_map.flatten(1)
    commits = (1.0 / am.double()).sum(1).round()  # target forwards each row needed
    assert len(set(commits.tolist())) > 1
    # every committed block is recorded with its own length, per row
    assert int(am.min()) >= 1 and int(am.max()) <= 5


# ---- configuration ----
@pytest.mark.parametrize("make,field", [
    (lambda: SJD(window=0), "window"),
    (lambda: SJD(window=2.5), "window"),
    (lambda: SJD(init="diagonal"), "init"),
    (lambda: SJD(refine="yes"), "refine"),
    (lambda: Jacobi(window=0), "window"),
    (lambda: Jacobi(window=True), "window"),
])
def test_bad_config_names_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_config_surface():
    sjd, jac = SJD(), Jacobi()
    assert (sjd.name, sjd.window, sjd.init, sjd.refine, sjd.lossless, sjd.pad) == ("sjd", 16, "random", True, True, 18)
    assert (jac.name, jac.window, jac.lossless, jac.pad) == ("jacobi", 16, True, 18)
