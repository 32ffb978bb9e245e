"""EAGLE-2 trees and ADT-Tree: exact law (chi-square vs the enumerated law of a tiny random target with
a tiny random draft head), greedy equals greedy AR, the ADT schedule, ADT's static-shaped rounds
against its host-synced ones (same trees, same tokens), rounds free of host syncs, the target states
the drafter catches up on (against a teacher-forced forward), and config errors.

Each exactness case draws 8,000 grids (one batch mixing 3 conditions) on a 2x2 grid over 4 codes;
a sibling rule whose residual keeps the rejected candidate fails it with half the samples (p < 1e-6).
"""

import contextlib
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from exactness import check_method, condition_rows, tiny_llamagen, tiny_prompt_model

import specvis as sv
from specvis.accept import Exact
from specvis.methods.verdicts import Tree, verify_tree
from specvis.methods.adt import AdaptiveSchedule, ADTTree
from specvis.methods.eagle import EagleTree
from specvis.models.base import Condition, Layout
from specvis.models.drafter import EagleDrafter

P_MIN = 1e-3
N = 8000

CFG = sv.Sampling(temperature=0.7, cfg_scale=2.5, noise="stream")
CASES = {
    "eagle_d2_k2_t4_cfg": (EagleTree(depth=2, top_k=2, total_tokens=4), CFG),
    "eagle_d4_k3_t8_topk": (EagleTree(depth=4, top_k=3, total_tokens=8),
                            sv.Sampling(temperature=1.3, top_k=2, cfg_scale=1.5, noise="stream")),
    # open bounds (paper): depths 1..3 / top-k 1..2, depths 1..2 / top-k 2..3, depths 1..2 / top-k 1..2
    "adt_horizontal_cfg": (ADTTree(depth_range=(0, 4), topk_range=(0, 3), topk_step=1, total_tokens=8), CFG),
    "adt_random_topp": (ADTTree(init="random", depth_range=(0, 3), topk_range=(1, 4), topk_step=1, total_tokens=6),
                        sv.Sampling(top_p=0.8, cfg_scale=3.0, noise="stream")),
    "adt_vertical_plain": (ADTTree(init="vertical", beta=0.5, depth_range=(0, 3), topk_range=(0, 3), topk_step=1,
                                   total_tokens=5), sv.Sampling(temperature=1.0, noise="stream")),
    "adt_static_random_cfg": (ADTTree(init="random", depth_range=(0, 4), topk_range=(0, 3), topk_step=1, total_tokens=6,
                                      static_shapes=True), CFG),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tree_is_exact(target, drafter, case):
    method, sampling = CASES[case]
    assert check_method(target, method, sampling, n=N, batch=N, drafter=drafter) > P_MIN


class StickyResidual(Exact):
    """Rejected candidates stay in the residual: the law leans towards drafted tokens."""

    def sibling(self, p, x, **kw):
        alpha, _ = super().sibling(p, x, **kw)
        return alpha, p


def test_harness_rejects_broken_sibling_rule(target, drafter):
    method = EagleTree(depth=2, top_k=2, total_tokens=4, acceptance=StickyResidual())
    assert check_method(target, method, CFG, n=4000, batch=4000, drafter=drafter) < 1e-6


@pytest.mark.parametrize("method", [EagleTree(depth=2, top_k=2, total_tokens=4), EagleTree(depth=4, top_k=3, total_tokens=8),
                                    ADTTree(total_tokens=8), ADTTree(init="vertical", total_tokens=6),
                                    ADTTree(init="random", total_tokens=8)], ids=lambda m: m.name)
def test_greedy_tree_equals_greedy_ar(target, drafter, method):
    greedy = sv.Sampling(temperature=0.0, cfg_scale=2.0, noise="stream")
    cond = torch.arange(48) % 3
    ar = sv.generate(target, cond, sv.AR(), greedy, seed=0).tokens
    out = sv.generate(target, cond, method, greedy, seed=5, drafter=drafter)
    assert torch.equal(ar, out.tokens)
    assert out.stats.target_forwards <= ar.shape[1]
    assert out.stats.to_dict()["mean_tree_depth"] >= 1.0


def test_rows_accept_their_own_lengths(target, drafter):
    """Trees over a 4-code vocabulary accept several tokens per target forward, and rows commit
    different lengths in the same forward (no lock-step)."""
    cond = torch.arange(32) % 3
    out = sv.generate(target, cond, EagleTree(depth=3, top_k=2, total_tokens=6), sv.Sampling(temperature=0.0, cfg_scale=2.0, noise="stream"),
                      drafter=drafter)
    assert out.stats.step_compression > 1.0 and out.stats.draft_forwards > 0
    first = out.stats.accept_map[:, 0, 1]  # tokens committed by the first tree round (grid 0 is the prefill)
    assert first.min() < first.max()


def schedule(method: ADTTree, B: int = 4):
    ctx = SimpleNamespace(n=torch.zeros(B, dtype=torch.long), device=torch.device("cpu"),
                          tokens=torch.zeros(B, 16 + 10, dtype=torch.long), layout=Layout(4, 4, 8),
                          generator=torch.Generator().manual_seed(0))
    return AdaptiveSchedule(method, ctx), ctx


def test_adt_bisection_and_adjacent_init():
    m = ADTTree(init="horizontal", beta=1.0, depth_step=1, topk_step=3, depth_range=(1, 10), topk_range=(3, 14))
    s, ctx = schedule(m)
    d, k = s.first(ctx)  # midpoint of the open ranges: depths 2..9, top-k 4..13
    assert d.tolist() == [5] * 4 and k.tolist() == [8] * 4
    d, k = torch.tensor([3, 3, 2, 9]), torch.tensor([6, 6, 6, 5])
    accepted = torch.tensor([3, 1, 0, 9])  # tau = accepted + 1: alpha 4/3, 2/3, 1/2, 10/9
    ctx.n = torch.tensor([5, 3, 2, 11])
    d2, k2 = s.next(ctx, d, k, accepted, torch.ones(4, dtype=torch.long), accepted + 1)
    assert d2.tolist() == [4, 2, 2, 9]  # rows 2, 3 clamped into the open range (1, 10)
    assert k2.tolist() == [4, 9, 6, 4]  # row 2: depth would drop to 1, so top_k stays (paper: only when d > 1)
    assert s.dtab[0, 1:5].tolist() == [3] * 4 and s.dtab[0, 5].item() == 0  # positions committed by that tree

    v = ADTTree(init="vertical", depth_range=(1, 10), topk_range=(3, 14))
    s, ctx = schedule(v, B=3)
    # row 0 committed grid 1..5 with (7, 5); row 1 committed grid 1 with (2, 10); row 2 committed 1..3 with (6, 7)
    ctx.n = torch.tensor([6, 2, 4])
    d3, k3 = s.next(ctx, torch.tensor([7, 2, 6]), torch.tensor([5, 10, 7]), torch.tensor([4, 0, 2]),
                    torch.ones(3, dtype=torch.long), torch.tensor([5, 1, 3]))
    # row 0 drafts grid 6 whose upper neighbour (grid 2) came from (7, 5): alpha 5/7 < 1, shallower, wider;
    # row 1 has no upper neighbour (falls back to its own previous tree); row 2's upper neighbour is grid 0,
    # committed by the prefill (no tree), so it also falls back: alpha 3/6 < 1
    assert d3.tolist() == [6, 2, 5] and k3.tolist() == [8, 10, 10]


def test_adt_vertical_init_reads_the_position_above_across_row_ends():
    """Emu3's layout (3 x 3 codes, a row-end id after each row: stream stride 4). The upper neighbour of
    stream position n is n - 4 (the layout's stride), not n - 3 (the grid width). Every stream position i
    here was committed by a tree of depth i + 1 and top-k i + 21; with no adaptation steps the next tree
    takes its upper neighbour's (d, k). Drafting position 5 (row 1, column 1): above is 1; position 10
    (row 2, column 2): above is 6; position 7 (row 1's row end): above is 3 (row 0's)."""
    m = ADTTree(init="vertical", depth_step=0, topk_step=0, depth_range=(0, 100), topk_range=(0, 100))
    ctx = SimpleNamespace(n=torch.tensor([5, 10, 7]), device=torch.device("cpu"),
                          tokens=torch.zeros(3, 12, dtype=torch.long), layout=Layout(3, 3, 8, row_end=1),
                          generator=torch.Generator().manual_seed(0))
    s = AdaptiveSchedule(m, ctx)
    s.dtab.copy_(torch.arange(1, 13).expand(3, -1))
    s.ktab.copy_(torch.arange(21, 33).expand(3, -1))
    none = torch.zeros(3, dtype=torch.long)  # the previous tree committed nothing: the tables stay
    d, k = s.next(ctx, torch.full((3,), 50), torch.full((3,), 50), none, none, none)
    assert d.tolist() == [2, 7, 4] and k.tolist() == [22, 27, 24]


def test_adt_alpha_counts_the_bonus_token():
    """Paper 002, Sec. III-B: alpha = tau / d-hat with tau the acceptance length including the bonus
    token. With beta = 1, a depth-d tree that accepted d - 1 drafts (tau = d) is positive: it grows
    and narrows (accepted / d would shrink it)."""
    m = ADTTree(beta=1.0, depth_step=1, topk_step=3, depth_range=(0, 10), topk_range=(3, 14))
    s, ctx = schedule(m, B=3)
    d, k = torch.tensor([4, 4, 2]), torch.tensor([8, 8, 8])
    accepted = torch.tensor([3, 2, 1])  # tau 4 (alpha 1), tau 3 (alpha 3/4), tau 2 (alpha 1)
    ctx.n = 1 + accepted + 1
    d2, k2 = s.next(ctx, d, k, accepted, torch.ones(3, dtype=torch.long), accepted + 1)
    assert d2.tolist() == [5, 3, 3] and k2.tolist() == [5, 11, 5]
    # beta scales the threshold: tau >= beta * d
    s, ctx = schedule(ADTTree(beta=0.5), B=2)
    ctx.n = torch.tensor([2, 2])
    d3, _ = s.next(ctx, torch.tensor([4, 5]), torch.tensor([8, 8]), torch.tensor([1, 1]),
                   torch.ones(2, dtype=torch.long), torch.tensor([2, 2]))
    assert d3.tolist() == [5, 4]  # tau 2 >= 0.5 * 4, tau 2 < 0.5 * 5


def test_adt_bounds_are_open_intervals():
    """Paper 002, Sec. IV-B: d_min < d < d_max and k_min < k < k_max, so neither bound is reached."""
    m = ADTTree(depth_step=1, topk_step=3, depth_range=(1, 4), topk_range=(3, 8))
    s, ctx = schedule(m, B=4)
    assert (s.max_depth, s.max_top_k) == (3, 7)
    ctx.n = torch.tensor([5, 5, 5, 5])
    d, k = torch.tensor([3, 2, 3, 2]), torch.tensor([4, 7, 5, 6])
    accepted = torch.tensor([3, 0, 2, 0])  # positive (deeper than 3, narrower than 4), negative (shallower than 2)
    d2, k2 = s.next(ctx, d, k, accepted, torch.ones(4, dtype=torch.long), accepted + 1)
    assert d2.tolist() == [3, 2, 3, 2] and k2.tolist() == [4, 7, 4, 6]
    r = ADTTree(init="random", depth_range=(1, 4), topk_range=(3, 6))
    s, ctx = schedule(r, B=2000)
    d, k = s.first(ctx)
    assert set(d.tolist()) == {2, 3} and set(k.tolist()) == {4, 5}
    assert ADTTree().depth_range == (0, 10) and ADTTree().topk_range == (3, 14)  # paper's Anole setting
    s, ctx = schedule(ADTTree(), B=1)
    assert (s.max_depth, s.max_top_k) == (9, 13) and [t.item() for t in s.first(ctx)] == [5, 8]
    # static-shaped rounds are built to the deepest admissible depth, capped where total_tokens - 1
    # nodes cannot reach
    assert s.levels == 9 and schedule(ADTTree(total_tokens=6))[0].levels == 5


@pytest.mark.parametrize("method, bound", [(EagleTree(depth=5, top_k=2, total_tokens=4), 3),
                                           (EagleTree(depth=4, top_k=2, total_tokens=3), 2),
                                           (ADTTree(depth_range=(0, 10), topk_range=(1, 4), total_tokens=4), 3)],
                         ids=["eagle_d5_t4", "eagle_d4_t3", "adt_t4"])
def test_mean_tree_depth_is_the_drafted_depth(target, drafter, method, bound):
    """mean_tree_depth (d-bar) is the depth reached after the rerank to total_tokens, not the
    configured depth: total_tokens - 1 nodes cannot reach a deeper level than total_tokens - 1."""
    out = sv.generate(target, torch.arange(12) % 3, method, sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream"),
                      seed=3, drafter=drafter)
    stats = out.stats.to_dict()
    assert 1.0 <= stats["mean_tree_depth"] <= bound
    assert stats["mean_tree_depth"] <= stats["mean_scheduled_depth"]


@pytest.mark.parametrize("method", [EagleTree(depth=3, top_k=3, total_tokens=6), ADTTree(total_tokens=8)],
                         ids=lambda m: m.name)
def test_mean_tree_depth_averages_the_selected_max_depth(target, drafter, method, monkeypatch):
    """Per round, build_tree's depth is the max depth of the nodes kept (recomputed here from the
    tree's children and positions); mean_tree_depth is its mean over active rows and rounds."""
    import specvis.methods.eagle as tree_mod

    build, total = tree_mod.build_tree, [0, 0]

    def spy(ctx, *a, **kw):
        tree = build(ctx, *a, **kw)
        kids = tree.children.flatten(1)  # every kept node is its parent's child
        depth = torch.stack([(tree.positions[b, kids[b][kids[b] >= 0]] - tree.positions[b, 0]).max()
                             for b in range(kids.shape[0])])
        assert torch.equal(depth, tree.depth)
        active = ctx.n < ctx.L
        total[0] += int((depth * active).sum())
        total[1] += int(active.sum())
        return tree

    monkeypatch.setattr(tree_mod, "build_tree", spy)
    out = sv.generate(target, torch.arange(12) % 3, method, sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream"),
                      seed=3, drafter=drafter)
    assert total[1] > 0
    assert out.stats.to_dict()["mean_tree_depth"] == pytest.approx(total[0] / total[1])


def test_verify_tree_alone_and_soft_reaches_every_sibling_try():
    """verify_tree on a hand-made tree: root -> (rank 0: token 2 at node 1, rank 1: token 1 at node 2),
    node 1 -> token 3 at node 3. Point-mass laws: the root wants 1, node 2 wants 0. Rank 0 is rejected,
    rank 1 accepted, node 2 is a leaf: accepted 1, block (1, 0). The same ``soft`` tensor goes to
    every sibling try; with soft=None the rule is called without it."""
    tree = Tree(tokens=torch.tensor([[0, 2, 1, 3]]), positions=torch.tensor([[4, 5, 5, 6]]), mask=None,
                children=torch.tensor([[[1, 2], [3, -1], [-1, -1], [-1, -1]]]), depth=torch.tensor([2]),
                levels=2)
    p = torch.nn.functional.one_hot(torch.tensor([[1, 3, 0, 0]]), 4).float()
    soft = torch.full((1, 4, 4), 0.25)
    seen = []

    class Recording(Exact):
        def sibling(self, p, x, **kw):
            seen.append(kw.get("soft", "absent"))
            return super().sibling(p, x)

    v = verify_tree(Recording(), tree, p, torch.Generator().manual_seed(0), soft=soft)
    assert v.accepted.tolist() == [1] and v.keep.tolist() == [[0, 2, 0]] and v.block[0, :2].tolist() == [1, 0]
    assert len(seen) == 2 and all(t is soft for t in seen) and torch.equal(soft, torch.full((1, 4, 4), 0.25))
    seen.clear()
    verify_tree(Recording(), tree, p, torch.Generator().manual_seed(0))
    assert seen == ["absent", "absent"]


def test_config_errors_name_the_field(target):
    for bad, field in [({"depth": 0}, "depth"), ({"top_k": 0}, "top_k"), ({"total_tokens": 1}, "total_tokens")]:
        with pytest.raises(ValueError, match=field):
            EagleTree(**bad)
    for bad, field in [({"init": "diagonal"}, "init"), ({"beta": 0}, "beta"), ({"depth_range": (3, 2)}, "depth_range"),
                       ({"topk_range": (2, 3)}, "topk_range"),
                       ({"depth_range": (-1, 4)}, "depth_range"), ({"depth_step": -1}, "depth_step")]:
        with pytest.raises(ValueError, match=field):
            ADTTree(**bad)
    assert ADTTree(depth_range=[2, 5]).depth_range == (2, 5)
    with pytest.raises(ValueError, match="static_shapes"):
        ADTTree(static_shapes=1)
    with pytest.raises(ValueError, match="drafter"):
        sv.generate(target, torch.tensor([0]), EagleTree(), sv.Sampling(noise="stream"))


# ---------------------------------------------------------------- ADT: static-shaped vs host-synced rounds
def _sharp():
    """The oracle's sharp model (tests/test_oracle.py): 8 codes on a 4x4 grid."""
    target = tiny_llamagen(0, vocab=8, grid=4, dim=32)
    return target, EagleDrafter.from_target(target, seed=1).eval()


def _emu3():
    """An Emu3-shaped prompt model with a row end after each of 3 rows of 3 codes (forced positions)."""
    target = tiny_prompt_model(0, vocab=4, height=3, width=3, row_end=1, janus=False)
    return target, EagleDrafter.from_target(target, seed=1).eval()


ADT_CONFIGS = {  # (method kwargs, model); total_tokens 5 < max depth + 1: the static depth is capped
    "horizontal": (dict(init="horizontal", total_tokens=8), "sharp"),
    "vertical_beta": (dict(init="vertical", beta=0.5, total_tokens=5), "sharp"),
    "random_small": (dict(init="random", depth_range=(0, 4), topk_range=(0, 3), topk_step=1, total_tokens=8), "sharp"),
    "horizontal_harness": (dict(depth_range=(0, 4), topk_range=(0, 3), topk_step=1, total_tokens=6), "harness"),
    "vertical_emu3": (dict(init="vertical", total_tokens=7), "emu3"),
    "random_emu3": (dict(init="random", topk_range=(0, 4), topk_step=1, total_tokens=10), "emu3"),
}


@pytest.fixture(scope="module")
def adt_models(target, drafter):
    return {"harness": (target, drafter), "sharp": _sharp(), "emu3": _emu3()}


def _record_trees(monkeypatch):
    """Spy on build_tree: per round, the schedule it got and every drafted node (tree position, token,
    stream position, parent, rank) per row."""
    import specvis.methods.eagle as tree_mod

    build, rounds = tree_mod.build_tree, []

    def spy(ctx, state, *a, **kw):
        tree = build(ctx, state, *a, **kw)
        d_row, k_row = state.depth, state.top_k
        B, T, K = tree.children.shape
        nodes = []
        for b in range(B):
            kids = tree.children[b]
            row = sorted((int(kids[t, r]), int(tree.tokens[b, kids[t, r]]), int(tree.positions[b, kids[t, r]]), t, r)
                         for t in range(T) for r in range(K) if kids[t, r] >= 0)
            nodes.append(row)
        rounds.append((d_row.tolist(), k_row.tolist(), tree.depth.tolist(), nodes))
        return tree

    monkeypatch.setattr(tree_mod, "build_tree", spy)
    return rounds


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["t1", "greedy"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("config", list(ADT_CONFIGS))
def test_adt_static_shapes_match_host_synced_rounds(adt_models, config, batch, temperature, monkeypatch):
    """Same seed, ADT rounds at the fixed maximal shape with the schedule as masks vs rounds built to
    the batch's largest d-hat / k-hat read on the host: the same schedule and the same drafted nodes
    round by round (same tree positions, tokens, parents and ranks), the same tokens, acceptance map,
    target forwards, mean_tree_depth and mean_scheduled_depth. Drafter forwards: the static path
    spends ``levels`` (catch-up + levels - 1 expansions) every round."""
    kw, model = ADT_CONFIGS[config]
    target, drafter = adt_models[model]
    cond = condition_rows(target, [0, 1, 2], torch.arange(batch) % 3)
    sampling = sv.Sampling(temperature=temperature, cfg_scale=2.0, noise="stream")
    runs = []
    for static in (False, True):
        trees = _record_trees(monkeypatch)
        out = sv.generate(target, cond, ADTTree(static_shapes=static, **kw), sampling, seed=3, drafter=drafter)
        runs.append((out, trees))
        monkeypatch.undo()
    (a, trees_a), (b, trees_b) = runs
    assert len(trees_a) == len(trees_b) > 0
    for r, (ta, tb) in enumerate(zip(trees_a, trees_b)):
        assert ta == tb, f"round {r}"
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.stats.accept_map, b.stats.accept_map)
    sa, sb = a.stats.to_dict(), b.stats.to_dict()
    for key in ("target_forwards", "mean_tree_depth", "mean_scheduled_depth", "mean_accepted_length"):
        assert sa[key] == sb[key], key
    levels = min(ADTTree(**kw).depth_range[1] - 1, kw["total_tokens"] - 1)
    assert sb["draft_forwards"] == len(trees_b) * levels
    assert sa["draft_forwards"] == sum(max(d) for d, *_ in trees_a)


@contextlib.contextmanager
def _no_host_sync():
    """CPU stand-in for CUDA's sync check: any tensor-to-Python conversion or data-dependent shape
    (what would sync a GPU stream) raises inside the block."""
    def refuse(*a, **k):
        raise AssertionError("host sync inside a round")

    with pytest.MonkeyPatch.context() as mp:
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "numpy"):
            mp.setattr(torch.Tensor, name, refuse)
        mp.setattr(torch, "nonzero", refuse)
        yield


@pytest.mark.parametrize("method", [EagleTree(depth=3, top_k=2, total_tokens=6), ADTTree(total_tokens=8, static_shapes=True),
                                    ADTTree(init="vertical", total_tokens=6, static_shapes=True),
                                    ADTTree(init="random", total_tokens=8, static_shapes=True)],
                         ids=["eagle", "adt_horizontal", "adt_vertical", "adt_random"])
@pytest.mark.parametrize("model", ["sharp", "emu3"])
def test_tree_rounds_run_through_the_round_runner_without_host_sync(adt_models, method, model, monkeypatch):
    """Static-shaped tree rounds (EagleTree, ADTTree with static_shapes) go through ``ctx.run`` (the
    capture path on CUDA) and convert no tensor to a Python value; host-synced ADT rounds do not use
    the round runner."""
    import specvis.methods.base as base

    target, drafter = adt_models[model]
    run_rounds, calls = base.run_rounds, []

    def guarded(ctx, round_fn, graphs, rounds=None):
        def round_() -> None:
            calls.append(1)
            with _no_host_sync():
                round_fn()
        run_rounds(ctx, round_, graphs, rounds)

    monkeypatch.setattr(base, "run_rounds", guarded)
    cond = condition_rows(target, [0, 1, 2], torch.arange(3))
    sampling = sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream")
    out = sv.generate(target, cond, method, sampling, seed=1, drafter=drafter)
    assert calls and len(calls) == out.stats.target_forwards - 2  # prefill, first round (one feature per row)
    if isinstance(method, ADTTree):
        calls.clear()
        host = sv.generate(target, cond, replace(method, static_shapes=False), sampling, seed=1,
                           drafter=drafter)
        assert not calls and torch.equal(host.tokens, out.tokens)


@pytest.mark.parametrize("method", [sv.StaticTree(tree="chain"), sv.StaticTree(tree=[[0], [1], [0, 0], [1, 0], [0, 0, 0]]),
                                    EagleTree(depth=3, top_k=2, total_tokens=6), ADTTree(total_tokens=6)],
                         ids=["chain", "static_branching", "eagle", "adt"])
def test_drafter_catch_up_gets_the_teacher_forced_features(monkeypatch, method):
    """Every catch-up pairs committed token t with the target's hidden state after token t - 1 (after
    the condition for t = 0), as one teacher-forced forward over the finished stream gives it, on a
    model whose states depend on the whole prefix. Exactness cannot see a wrong feature (it only
    slows drafting): this catches a compaction that hands the drafter another node's state, e.g. a
    chain's path one node short (``compact`` then reads the root's state for the last accepted node)."""
    import specvis.methods.eagle as tr
    import specvis.methods.static_tree as st

    target = tiny_llamagen(0, vocab=8, grid=4, dim=32)
    drafter = EagleDrafter.from_target(target, seed=1).eval()
    calls, real = [], tr.catch_up

    def spy(ctx, pending, count):
        calls.append((ctx.n.clone(), count.clone(), pending.clone()))
        return real(ctx, pending, count)

    monkeypatch.setattr(tr, "catch_up", spy)
    monkeypatch.setattr(st, "catch_up", spy)
    classes = torch.arange(4) % 3
    out = sv.generate(target, classes, method, sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream"), seed=5, drafter=drafter)
    B, L = out.tokens.shape
    rows = lambda t: torch.cat([t, t])  # noqa: E731  conditional rows, then the unconditional ones
    target.setup_cache(2 * B, 1)
    _, h0 = target.prefill(Condition.of(target, classes).rows(cfg=True))
    _, h = target.forward_tokens(rows(out.tokens), rows(torch.arange(L)[None].expand(B, -1)))
    feats = torch.cat([h0[:, None], h[:, :-1]], 1)  # (2B, L, D): the state paired with token t
    checked = 0
    for n, count, pending in calls:
        for r in range(2 * B):
            for j in range(int(count[r % B])):
                t = int(n[r % B] - count[r % B]) + j
                torch.testing.assert_close(pending[r, j], feats[r, t], rtol=1e-4, atol=1e-4)
                checked += 1
    assert checked > B * L  # all but each row's last round (no catch-up follows it), both CFG halves
