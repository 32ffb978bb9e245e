"""EAGLE-2 trees and ADT-Tree: exact law (chi-square vs the enumerated law of a tiny random target with
a tiny random draft head), greedy equals greedy AR, the ADT schedule, and config errors.

Each exactness case draws 8,000 grids (one batch mixing 3 conditions) on a 2x2 grid over 4 codes;
a sibling rule whose residual keeps the rejected candidate fails it with half the samples (p < 1e-6).
"""

from types import SimpleNamespace

import pytest
import torch
from exactness import check_method, tiny_llamagen

import specvis as sv
from specvis.accept import Exact
from specvis.methods.tree import ADTTree, EagleTree, _Adaptive
from specvis.models.base import Layout
from specvis.models.drafter import EagleDrafter

P_MIN = 1e-3
N = 8000

CFG = sv.Sampling(temperature=0.7, cfg_scale=2.5)
CASES = {
    "eagle_d2_k2_t4_cfg": (EagleTree(depth=2, top_k=2, total_tokens=4), CFG),
    "eagle_d4_k3_t8_topk": (EagleTree(depth=4, top_k=3, total_tokens=8),
                            sv.Sampling(temperature=1.3, top_k=2, cfg_scale=1.5)),
    "adt_horizontal_cfg": (ADTTree(depth_range=(1, 4), topk_range=(1, 3), topk_step=1, total_tokens=8), CFG),
    "adt_random_topp": (ADTTree(init="random", depth_range=(1, 3), topk_range=(2, 3), topk_step=1, total_tokens=6),
                        sv.Sampling(top_p=0.8, cfg_scale=3.0)),
    "adt_vertical_plain": (ADTTree(init="vertical", beta=0.5, depth_range=(1, 3), topk_range=(1, 3), topk_step=1,
                                   total_tokens=5), sv.Sampling(temperature=1.0)),
}


@pytest.fixture(scope="module")
def target():
    return tiny_llamagen(0)


@pytest.fixture(scope="module")
def drafter(target):
    return EagleDrafter.from_target(target, seed=1).eval()


@pytest.mark.parametrize("case", list(CASES))
def test_tree_is_exact(target, drafter, case):
    method, sampling = CASES[case]
    assert check_method(target, method, sampling, n=N, batch=N, drafter=drafter) > P_MIN


class StickyResidual(Exact):
    """Rejected candidates stay in the residual: the law leans towards drafted tokens."""

    def sibling(self, p, x):
        alpha, _ = super().sibling(p, x)
        return alpha, p


def test_harness_rejects_broken_sibling_rule(target, drafter):
    method = EagleTree(depth=2, top_k=2, total_tokens=4, acceptance=StickyResidual())
    assert check_method(target, method, CFG, n=4000, batch=4000, drafter=drafter) < 1e-6


@pytest.mark.parametrize("method", [EagleTree(depth=2, top_k=2, total_tokens=4), EagleTree(depth=4, top_k=3, total_tokens=8),
                                    ADTTree(total_tokens=8), ADTTree(init="vertical", total_tokens=6),
                                    ADTTree(init="random", total_tokens=8)], ids=lambda m: m.name)
def test_greedy_tree_equals_greedy_ar(target, drafter, method):
    greedy = sv.Sampling(temperature=0.0, cfg_scale=2.0)
    cond = torch.arange(48) % 3
    ar = sv.generate(target, cond, sv.AR(), greedy, seed=0).tokens
    out = sv.generate(target, cond, method, greedy, seed=5, drafter=drafter)
    assert torch.equal(ar, out.tokens)
    assert out.stats.target_forwards <= ar.shape[1]
    assert out.stats.to_dict()["mean_tree_depth"] >= 1.0


def test_rows_accept_their_own_lengths(target, drafter):
    """Wide trees over a 4-code vocabulary accept several tokens per target forward, and rows
    commit different lengths in the same forward (no lock-step)."""
    cond = torch.arange(32) % 3
    out = sv.generate(target, cond, EagleTree(depth=3, top_k=3, total_tokens=12), sv.Sampling(temperature=0.0, cfg_scale=2.0),
                      drafter=drafter)
    assert out.stats.step_compression > 1.0 and out.stats.draft_forwards > 0
    first = out.stats.accept_map[:, 0, 1]  # tokens committed by the first tree round (grid 0 is the prefill)
    assert first.min() < first.max()


def schedule(method: ADTTree, B: int = 4):
    ctx = SimpleNamespace(n=torch.zeros(B, dtype=torch.long), device=torch.device("cpu"),
                          tokens=torch.zeros(B, 16 + 10, dtype=torch.long), layout=Layout(4, 4, 8),
                          generator=torch.Generator().manual_seed(0))
    return _Adaptive(method, ctx), ctx


def test_adt_bisection_and_adjacent_init():
    m = ADTTree(init="horizontal", beta=1.0, depth_step=1, topk_step=3, depth_range=(1, 10), topk_range=(3, 14))
    s, ctx = schedule(m)
    d, k = s.first(ctx)
    assert d.tolist() == [5] * 4 and k.tolist() == [8] * 4
    d, k = torch.tensor([3, 3, 2, 10]), torch.tensor([6, 6, 6, 4])
    accepted = torch.tensor([3, 1, 0, 10])  # alpha 1 (deeper, narrower), 1/3, 0 (shallower, wider), 1 (clamped)
    ctx.n = torch.tensor([4, 2, 1, 11])
    d2, k2 = s.next(ctx, d, k, accepted, torch.zeros(4, dtype=torch.long), ctx.n)
    assert d2.tolist() == [4, 2, 1, 10]
    assert k2.tolist() == [3, 9, 6, 3]  # row 2: depth would drop to 1, so top_k stays (paper: only when d > 1)
    assert s.dtab[0, :4].tolist() == [3] * 4 and s.dtab[0, 4].item() == 0  # positions committed by that tree

    v = ADTTree(init="vertical", depth_range=(1, 10), topk_range=(3, 14))
    s, ctx = schedule(v, B=2)
    # row 0 committed grid 0..4 with (7, 5); row 1 committed grid 0..1 with (2, 10)
    ctx.n = torch.tensor([5, 2])
    d3, k3 = s.next(ctx, torch.tensor([7, 2]), torch.tensor([5, 10]), torch.tensor([0, 0]),
                    torch.zeros(2, dtype=torch.long), torch.tensor([5, 2]))
    # row 0 drafts grid 5 whose upper neighbour (grid 1) came from (7, 5); row 1 has no upper neighbour
    assert d3.tolist() == [6, 1] and k3.tolist() == [8, 10]


def test_config_errors_name_the_field(target):
    for bad, field in [({"depth": 0}, "depth"), ({"top_k": 0}, "top_k"), ({"total_tokens": 1}, "total_tokens")]:
        with pytest.raises(ValueError, match=field):
            EagleTree(**bad)
    for bad, field in [({"init": "diagonal"}, "init"), ({"beta": 0}, "beta"), ({"depth_range": (3, 2)}, "depth_range"),
                       ({"topk_range": (0, 4)}, "topk_range"), ({"depth_step": -1}, "depth_step")]:
        with pytest.raises(ValueError, match=field):
            ADTTree(**bad)
    assert ADTTree(depth_range=[2, 5]).depth_range == (2, 5)
    with pytest.raises(ValueError, match="drafter"):
        sv.generate(target, torch.tensor([0]), EagleTree(), sv.Sampling())
