"""The per-forward oracle (tests/oracle.py) on every method: each law a target forward returns
equals the teacher-forced law of the context its committed tokens and drafts define (TV <= 1e-4).

Unlike the chi-square harness this is deterministic and sees every forward, so a position shifted by
one, a stale cache slot after a rejection, a wrong rollback length or a broken tree compaction fails
here at the first forward that uses it. It runs on a random model with sharp attention (4x4 grid,
its law depends on the whole prefix and on position: asserted), checking every law, and on the
trained emoji target, checking every law the output depends on (deferred mode, see tests/oracle.py).
"""

import pytest
import torch
from exactness import dependence, tiny_llamagen
from oracle import oracle

import specvis as sv
from specvis.models.drafter import EagleDrafter

SAMPLING = sv.Sampling(temperature=1.0, top_k=6, cfg_scale=2.0, noise="stream")
GREEDY = sv.Sampling(temperature=0.0, cfg_scale=2.0, noise="stream")

METHODS = {
    "ar": (sv.AR(), SAMPLING),
    "speculative_g1": (sv.Speculative(gamma=1), SAMPLING),
    "speculative_g3": (sv.Speculative(gamma=3), SAMPLING),
    "jacobi_w4": (sv.Jacobi(window=4), GREEDY),
    **{f"sjd_{init}": (sv.SJD(window=3, init=init, coupling="none"), SAMPLING) for init in sv.methods.sjd.INITS},
    **{f"sjd_{c}": (sv.SJD(window=3, init="vertical-sample", coupling=c), SAMPLING) for c in ("maximal", "gumbel")},
    "sjd_norefine": (sv.SJD(window=3, init="horizontal-sample", refine=False, coupling="none"), SAMPLING),
    "sjd_greedy": (sv.SJD(window=4, init="vertical-repeat"), GREEDY),
    "eagle": (sv.EagleTree(depth=3, top_k=3, total_tokens=7), SAMPLING),
    "eagle_greedy": (sv.EagleTree(depth=3, top_k=2, total_tokens=5), GREEDY),
    "static_tree": (sv.StaticTree(tree=[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]), SAMPLING),
    "static_tree_greedy": (sv.StaticTree(tree="reverse_balanced_25"), GREEDY),
    "static_chain": (sv.StaticTree(tree="chain"), SAMPLING),  # compacted in place, without keep_block
    **{f"adt_{init}": (sv.ADTTree(init=init, total_tokens=8), SAMPLING) for init in ("horizontal", "vertical", "random")},
}


@pytest.fixture(scope="module")
def sharp():
    target = tiny_llamagen(0, vocab=8, grid=4, dim=32)
    draft = tiny_llamagen(1, vocab=8, grid=4, dim=16, n_layer=1)
    return target, draft, EagleDrafter.from_target(target, seed=1).eval()


def test_sharp_model_depends_on_prefix_and_position():
    """What gives the oracle and the harness teeth: measured on the 2x2 harness model (today's
    random init had earlier <= 0.03, position <= 0.02)."""
    earlier, position = dependence(tiny_llamagen(0))
    assert earlier > 0.3 and position > 0.05, (earlier, position)


@pytest.mark.parametrize("name", list(METHODS))
def test_every_target_law_is_the_teacher_forced_law(sharp, name):
    target, draft, drafter = sharp
    method, sampling = METHODS[name]
    with oracle() as report:
        sv.generate(target, torch.arange(6) % 3, method, sampling, seed=3, draft=draft, drafter=drafter)
    report.assert_ok()


@pytest.fixture(scope="module")
def emoji():
    return sv.load("emoji")


@pytest.mark.parametrize("name", ["ar", "speculative_g3", "sjd_vertical-sample", "sjd_gumbel", "sjd_horizontal-repeat", "eagle",
                                  "adt_horizontal"])
def test_emoji_target_laws(emoji, name):
    method, _ = METHODS[name]
    with oracle(deferred=True) as report:
        sv.generate(emoji.target, torch.tensor([0, 7]), method, emoji.default_sampling, seed=1,
                    draft=emoji.draft, drafter=emoji.drafter)
    report.assert_ok()
